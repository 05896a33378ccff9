"""braze's error classes: every failure a user can cause raises one of these.

They live in compiler/ (framework-free) so importers, compiler, runtime and
bridge all share them; bridge re-exports them. A message names the problem and,
where there is one, the node and op (docs/DESIGN.md, "Errors").
"""

import functools


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


class ExportRefused(BrazeError):
    """The model cannot become a C library (bridge/export_c.py): it has nodes braze does
    not compile (each named, with its reason), or an input or output type C cannot take."""


class InputError(BrazeError):
    """A compiled model was called with missing, extra or mis-typed inputs."""


class ArtifactError(BrazeError):
    """A saved artifact cannot be loaded (version, CPU, corruption)."""


class HostOpError(BrazeError):
    """A node that onnxruntime or torch runs for braze (a host step) failed at call time,
    e.g. on an index out of range. The message names the node (op type and name); the
    framework's own exception is the `__cause__`."""


def host_op_error(message: str, cause: BaseException, keep_type: bool = False) -> HostOpError:
    """A HostOpError saying `message`. With `keep_type` it is also an instance of the
    cause's class where that class can be mixed in (torch's IndexError stays an
    IndexError for code that catches one)."""
    cls = _mixed_class(type(cause)) if keep_type else HostOpError
    try:
        return cls(message)
    except TypeError:  # a class whose constructor wants more than a message
        return HostOpError(message)


@functools.cache
def _mixed_class(base: type) -> type:
    """HostOpError and `base` in one class (HostOpError alone where they cannot mix)."""
    if issubclass(base, HostOpError) or not issubclass(base, Exception):
        return HostOpError
    try:
        return type(f"HostOpError[{base.__name__}]", (HostOpError, base),
                    {"__module__": __name__, "__doc__": HostOpError.__doc__})
    except TypeError:  # incompatible instance layouts (e.g. OSError's)
        return HostOpError


class TargetError(BrazeError):
    """An unknown compile target: its spelling, LLVM triple, CPU name or a feature."""
class BrazeIndexError(BrazeError, IndexError):
    """A compiled model read an index out of range (a Gather index, an embedding id);
    an IndexError too, as onnxruntime's and torch's errors are to their callers."""


class DivisionByZeroError(BrazeError, ZeroDivisionError):
    """A compiled model divided an integer by zero (onnxruntime and torch raise)."""
