"""braze's user-facing API: compile ONNX models, the onnx.backend shape, artifacts.

    import bridge
    m = bridge.compile_onnx("model.onnx")   # target="cpu", allow_fallback=True, threads=2
    y, = m(x)
    m.save("model.braze")                  # every shape compiled so far, one file
    m2 = bridge.load("model.braze")        # in another process: no recompiling
    m.export_c("out", name="model")        # model.h, libmodel.a/.so: runs with no Python
"""

from bridge.artifact import LoadedModel, load
from bridge.export_c import export_c
from bridge.onnx_api import CompiledOnnxModel, compile_onnx
from compiler.errors import (
    ArtifactError,
    BrazeError,
    BrazeIndexError,
    CompileError,
    DivisionByZeroError,
    ExportRefused,
    HostOpError,
    InputError,
    InvalidModelError,
    ModelLoadError,
    TargetError,
    UnsupportedModelError,
)

__all__ = [
    "ArtifactError",
    "BrazeError",
    "BrazeIndexError",
    "CompileError",
    "CompiledOnnxModel",
    "DivisionByZeroError",
    "ExportRefused",
    "HostOpError",
    "InputError",
    "InvalidModelError",
    "LoadedModel",
    "ModelLoadError",
    "TargetError",
    "UnsupportedModelError",
    "compile_onnx",
    "export_c",
    "load",
]
