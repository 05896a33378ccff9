"""braze compiler: IR, passes, codegen (framework-free)."""

__version__ = "0.1.0"
