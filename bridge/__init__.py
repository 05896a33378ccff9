"""braze's user-facing API: compile ONNX models, the onnx.backend shape, artifacts.

    import bridge
    m = bridge.compile_onnx("model.onnx")   # target="cpu", allow_fallback=True, threads=2
    y, = m(x)
"""

from compiler.errors import (  # noqa: F401  (re-exported for users)
    ArtifactError,
    BrazeError,
    CompileError,
    InputError,
    InvalidModelError,
    ModelLoadError,
    UnsupportedModelError,
)
from bridge.onnx_api import CompiledOnnxModel, compile_onnx  # noqa: F401

__all__ = ["compile_onnx", "CompiledOnnxModel", "BrazeError", "CompileError", "InputError",
           "InvalidModelError", "ModelLoadError", "UnsupportedModelError", "ArtifactError"]
