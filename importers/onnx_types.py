"""ONNX types <-> braze IR types: element types, TypeProto -> TensorType, dim binding.

One table maps ONNX element types to IR dtypes. Values braze cannot type
statically (sequences, maps, optionals, tensors of unknown rank, element types
with no IR equivalent such as float8) become dtype `opaque`: only host nodes
touch them, and the importer keeps their ONNX TypeProto for the host framework.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, TypeProto, helper, numpy_helper

from compiler.errors import InvalidModelError
from compiler.ir import TensorType

# ONNX TensorProto.DataType -> IR dtype (absent: no IR equivalent, opaque)
_ELEM_TO_DTYPE = {
    TensorProto.FLOAT: "f32",
    TensorProto.DOUBLE: "f64",
    TensorProto.FLOAT16: "f16",
    TensorProto.BFLOAT16: "bf16",
    TensorProto.INT8: "i8",
    TensorProto.INT16: "i16",
    TensorProto.INT32: "i32",
    TensorProto.INT64: "i64",
    TensorProto.UINT8: "u8",
    TensorProto.UINT16: "u16",
    TensorProto.UINT32: "u32",
    TensorProto.UINT64: "u64",
    TensorProto.BOOL: "bool",
    TensorProto.STRING: "str",
    TensorProto.COMPLEX64: "c64",
    TensorProto.COMPLEX128: "c128",
}
_DTYPE_TO_ELEM = {v: k for k, v in _ELEM_TO_DTYPE.items()}

# dtypes whose values the numpy reference (interp, folding) can hold
NUMPY_DTYPES = frozenset(_DTYPE_TO_ELEM) - {"bf16"}


def dtype_of_elem(elem_type: int) -> str:
    """IR dtype for an ONNX element type; `opaque` when the IR has none."""
    return _ELEM_TO_DTYPE.get(elem_type, "opaque")


def elem_of_dtype(dtype: str) -> int | None:
    """ONNX element type for an IR dtype (None for opaque)."""
    return _DTYPE_TO_ELEM.get(dtype)


def tensor_type_from_proto(tp: TypeProto, bindings: dict[str, int]) -> TensorType:
    """A TensorType for an ONNX TypeProto; unknown dims are None (bound by name if known).

    Non-tensors and tensors of unknown rank are `opaque` with shape ().
    """
    if tp.WhichOneof("value") != "tensor_type":
        return TensorType("opaque", ())
    tt = tp.tensor_type
    if not tt.HasField("shape"):
        return TensorType("opaque", ())
    dims = []
    for d in tt.shape.dim:
        if d.HasField("dim_value") and d.dim_value >= 0:
            dims.append(int(d.dim_value))
        else:
            dims.append(bindings.get(d.dim_param) if d.dim_param else None)
    return TensorType(dtype_of_elem(tt.elem_type), tuple(dims))


def proto_from_tensor_type(t: TensorType) -> TypeProto | None:
    """An ONNX tensor TypeProto for a TensorType (None if opaque)."""
    elem = elem_of_dtype(t.dtype)
    if elem is None:
        return None
    return helper.make_tensor_type_proto(elem, list(t.shape))


def array_from_tensor(t: TensorProto, base_dir: str = "") -> np.ndarray | None:
    """A read-only numpy array for an ONNX tensor; None when the IR cannot hold its type."""
    if dtype_of_elem(t.data_type) not in NUMPY_DTYPES:
        return None
    if any(d < 0 for d in t.dims):
        raise InvalidModelError(f"tensor {t.name!r} has negative dims {list(t.dims)}")
    arr = numpy_helper.to_array(t, base_dir)
    if arr.dtype.kind in "SU":
        arr = arr.astype(object)
    arr.setflags(write=False)
    return arr


def tensor_from_array(arr: np.ndarray, name: str) -> TensorProto:
    """An ONNX tensor for a numpy array (constant inputs given to shape inference)."""
    return numpy_helper.from_array(np.asarray(arr), name)
