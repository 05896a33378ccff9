"""Element types of braze's IR and their numpy equivalents.

One table; everything else (importers, codegen, runtime) maps through it.
`opaque` stands for values that are not tensors (ONNX sequences, optionals):
only `host` nodes produce or consume them.
"""

from __future__ import annotations

import numpy as np

# name -> numpy dtype (None: no numpy equivalent, host-only)
_NUMPY = {
    "bool": np.dtype(np.bool_),
    "i8": np.dtype(np.int8),
    "i16": np.dtype(np.int16),
    "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64),
    "u8": np.dtype(np.uint8),
    "u16": np.dtype(np.uint16),
    "u32": np.dtype(np.uint32),
    "u64": np.dtype(np.uint64),
    "f16": np.dtype(np.float16),
    "bf16": None,
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "c64": np.dtype(np.complex64),
    "c128": np.dtype(np.complex128),
    "str": np.dtype(object),
    "opaque": None,
}

DTYPES = tuple(_NUMPY)
FLOATS = frozenset({"f16", "bf16", "f32", "f64"})
SIGNED = frozenset({"i8", "i16", "i32", "i64"})
UNSIGNED = frozenset({"u8", "u16", "u32", "u64"})
INTEGERS = SIGNED | UNSIGNED
NUMERIC = FLOATS | INTEGERS
# Element types that are plain fixed-size numbers (what kernels can touch).
SCALARS = NUMERIC | {"bool"}

_FROM_NUMPY = {v: k for k, v in _NUMPY.items() if v is not None and k != "str"}


def check(dtype: str) -> str:
    """Return `dtype` if it names an IR element type, else raise ValueError."""
    if dtype not in _NUMPY:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    return dtype


def to_numpy(dtype: str) -> np.dtype:
    """The numpy dtype for an IR element type (ValueError if it has none)."""
    np_dtype = _NUMPY[check(dtype)]
    if np_dtype is None:
        raise ValueError(f"dtype {dtype} has no numpy equivalent")
    return np_dtype


def from_numpy(np_dtype) -> str:
    """The IR element type for a numpy dtype."""
    np_dtype = np.dtype(np_dtype)
    if np_dtype.kind in ("U", "S", "O"):
        return "str"
    try:
        return _FROM_NUMPY[np_dtype]
    except KeyError:
        raise ValueError(f"numpy dtype {np_dtype} has no braze equivalent") from None


def itemsize(dtype: str) -> int:
    """Bytes per element."""
    if dtype == "bf16":
        return 2
    return to_numpy(dtype).itemsize
