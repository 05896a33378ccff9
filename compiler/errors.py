"""braze's error classes: every failure a user can cause raises one of these.

They live in compiler/ (framework-free) so importers, compiler, runtime and
bridge all share them; bridge re-exports them. A message names the problem and,
where there is one, the node and op (see DESIGN.md, "Errors and bad input").
"""


class BrazeError(Exception):
    """Base class of every error braze raises on purpose."""


class ModelLoadError(BrazeError):
    """The model file is missing, unreadable, not ONNX, empty or truncated."""


class InvalidModelError(BrazeError):
    """The model is structurally wrong: a cycle, a dangling input, bad shapes or types."""


class UnsupportedModelError(BrazeError):
    """The model is valid but newer than what braze (or the installed onnx) knows."""


class CompileError(BrazeError):
    """braze could not compile part of the model (e.g. allow_fallback=False)."""


class InputError(BrazeError):
    """A compiled model was called with missing, extra or mis-typed inputs."""


class ArtifactError(BrazeError):
    """A saved artifact cannot be loaded (version, CPU, corruption)."""


class TargetError(BrazeError):
    """An unknown compile target: its spelling, LLVM triple, CPU name or a feature."""
