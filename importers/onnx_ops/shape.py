"""Ops whose result is known at import: Shape, Size, Constant, ConstantOfShape,
Range, EyeLike; and the inference-time no-ops Dropout; and Trilu (a constant mask).

With static shapes, Shape and Size are constants, which is what lets the shape
subgraphs of exported models fold away.
"""

from __future__ import annotations

import numpy as np
from onnx import numpy_helper

from compiler import dtypes
from importers.onnx_ops import Fallback, converter
from importers.onnx_ops.context import FOLD_LIMIT, NodeContext, const_array
from importers.onnx_types import dtype_of_elem


def _tensor_attr(cx: NodeContext, name: str):
    """The TensorProto of a tensor attribute (kept as a proto: its dtype matters)."""
    return next((a.t for a in cx.node.attribute if a.name == name), None)


@converter("Shape", 1)
def convert_shape(cx: NodeContext):
    """The input's static shape, optionally sliced by start/end (opset 15)."""
    shape = list(cx.x.shape)
    start, end = cx.attr("start", 0), cx.attr("end", None)
    return [cx.const(np.array(shape[slice(start, end)], dtype=np.int64))]


@converter("Size", 1)
def convert_size(cx: NodeContext):
    return [cx.const(np.array(cx.x.type.size, dtype=np.int64))]


_CONSTANT_ATTRS = {
    "value_float": np.float32, "value_floats": np.float32,
    "value_int": np.int64, "value_ints": np.int64,
}


@converter("Constant", 1)
def convert_constant(cx: NodeContext):
    """value (a tensor) or value_float(s) / value_int(s) / value_string(s)."""
    if "value" in cx.attrs:
        t = _tensor_attr(cx, "value")
        if dtype_of_elem(t.data_type) in ("bf16", "opaque"):
            raise Fallback(f"Constant of element type {t.data_type} has no numpy form")
        return [cx.const(numpy_helper.to_array(t))]
    for name, np_type in _CONSTANT_ATTRS.items():
        if name in cx.attrs:
            return [cx.const(np.array(cx.attrs[name], dtype=np_type))]
    for name in ("value_string", "value_strings"):
        if name in cx.attrs:
            value = cx.attrs[name]
            items = [s.decode() for s in value] if isinstance(value, list) else value.decode()
            return [cx.const(np.array(items, dtype=object))]
    raise Fallback("Constant with a sparse value")


@converter("ConstantOfShape", 9)
def convert_constant_of_shape(cx: NodeContext):
    """A constant when small; a broadcast of the scalar otherwise."""
    shape = tuple(cx.ints_input(0, "shape"))
    t = _tensor_attr(cx, "value")
    fill = numpy_helper.to_array(t).reshape(-1) if t is not None else np.zeros(1, np.float32)
    if fill.dtype.kind not in "biuf":
        raise Fallback(f"ConstantOfShape value of dtype {fill.dtype}")
    if int(np.prod(shape, dtype=np.int64)) <= FOLD_LIMIT:
        return [cx.const(np.full(shape, fill[0], dtype=fill.dtype))]
    return [cx.op("broadcast", cx.const(fill[:1].reshape(())), shape=shape)]


@converter("Range", 11)
def convert_range(cx: NodeContext):
    """Folded from constant start/limit/delta (the IR has no iota op)."""
    start, limit, delta = (cx.const_input(i, n) for i, n in enumerate(("start", "limit",
                                                                        "delta")))
    if start.dtype == np.float16:
        raise Fallback("Range of float16: ONNX accumulates in a precision set by stash_type")
    if delta.item() == 0:
        raise Fallback("Range with delta 0")
    n = max(int(np.ceil((limit.item() - start.item()) / delta.item())), 0)
    if n > FOLD_LIMIT:
        raise Fallback(f"Range of {n} elements is too large to fold")
    return [cx.const((start + delta * np.arange(n)).astype(start.dtype))]


@converter("EyeLike", 9)
def convert_eye_like(cx: NodeContext):
    x = cx.x
    dtype = dtype_of_elem(cx.attr("dtype")) if "dtype" in cx.attrs else x.dtype
    if x.type.rank != 2 or dtype not in dtypes.SCALARS:
        raise Fallback(f"EyeLike of {x.type} as {dtype}")
    n, m = x.shape
    return [cx.const(np.eye(n, m, k=cx.attr("k", 0), dtype=dtypes.to_numpy(dtype)))]


@converter("Dropout", 7)
def convert_dropout(cx: NodeContext):
    """Inference: the identity, and an all-true mask."""
    if cx.version >= 12:
        training = const_array(cx.input(2))
        if cx.input(2) is not None and (training is None or bool(training.reshape(-1)[0])):
            raise Fallback("Dropout in training mode")
    outs = [cx.x]
    if cx.wants_output(1):
        mask = cx.op("broadcast", cx.const(np.array(True)), shape=cx.x.shape)
        outs.append(mask)
    return outs


@converter("Trilu", 14)
def convert_trilu(cx: NodeContext):
    """select(mask, x, 0) with the constant triangular mask of the last two dims."""
    x = cx.x
    if x.type.rank < 2:
        raise Fallback("Trilu needs rank >= 2")
    k = cx.const_input(1, "k")
    k = 0 if k is None else int(k.reshape(-1)[0])
    ones = np.ones(x.shape[-2:], dtype=bool)
    mask = np.triu(ones, k) if cx.attr("upper", 1) else np.tril(ones, k)
    zero = cx.scalar(0, x.dtype) if x.dtype != "bool" else cx.const(np.array(False))
    return [cx.op("select", cx.const(mask), x, zero)]
