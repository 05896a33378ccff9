"""braze's user-facing API: compile ONNX models, the onnx.backend shape, artifacts.

    import bridge
    m = bridge.compile_onnx("model.onnx")   # target="cpu", allow_fallback=True, threads=2
    y, = m(x)
"""

from bridge.onnx_api import CompiledOnnxModel, compile_onnx
from compiler.errors import (
    ArtifactError,
    BrazeError,
    CompileError,
    InputError,
    InvalidModelError,
    ModelLoadError,
    UnsupportedModelError,
)

__all__ = [
    "ArtifactError",
    "BrazeError",
    "CompileError",
    "CompiledOnnxModel",
    "InputError",
    "InvalidModelError",
    "ModelLoadError",
    "UnsupportedModelError",
    "compile_onnx",
]
