"""Carrier dtypes: run an IR op on onnxruntime when it has no kernel for the op's dtype.

braze's IR allows every numeric dtype for most ops; the ONNX spec and stock
onnxruntime's CPU kernels allow fewer (no Max for int16, no MaxPool for int32,
no Conv or Tan for float64...). The exporter computes such a node in a
*carrier* dtype that has a kernel: cast the data inputs in, run the op, cast the
data outputs back. `carrier(node)` says which, from one table measured against
onnxruntime (tests/runtime/test_fallback_onnx.py sweeps every op and dtype).

Exactness, per kind of carrier:
- a wider integer (i16 -> i32, u32 -> i64): exact. Where a pow or matmul
  overflows the narrow type, the cast back truncates to the residue the narrow
  type would have wrapped to.
- u64 -> i64 with the sign bit flipped (`U64_ORDER`): the bit pattern is kept and
  x ^ 2**63 maps unsigned order onto signed order, so max/min/argmax are exact.
- u64 -> i64 plain (select, sums, products, pow): bit-preserving, exact.
- integers -> f64 (max_pool only: onnxruntime pools no integer wider than 8 bits):
  exact up to 2**53 in magnitude.
- f64 -> f32 (Tan, Erf, inverse and hyperbolic trigonometry, Conv, AveragePool:
  onnxruntime has float32 kernels only): about 1e-7 relative error.
- f16 -> f32 (IsInf before opset 20): exact.

Not emulated: integer sums and products that overflow. numpy (the IR's
semantics) wraps them; onnxruntime's ReduceSum/ReduceProd saturate, carried or not.
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.ir import Node, TensorType, Value


@dataclass(frozen=True)
class Carrier:
    """Compute in `dtype`; `flip_sign`: bitcast u64 to i64 and xor the sign bit."""

    dtype: str
    flip_sign: bool = False


U64_ORDER = Carrier("i64", flip_sign=True)
_I32, _I64, _F32, _F64 = Carrier("i32"), Carrier("i64"), Carrier("f32"), Carrier("f64")

_F64_AS_F32 = {"f64": _F32}
_WRAPPING = {"i8": _I32, "i16": _I32, "u8": _I32, "u16": _I32, "u32": _I64, "u64": _I64}
_ORDERED = {"i16": _I32, "u16": _I32, "u32": _I64, "u64": U64_ORDER}

# IR op -> {dtype onnxruntime lacks: the carrier to compute it in}
CARRIERS: dict[str, dict[str, Carrier]] = {
    **{op: _F64_AS_F32 for op in ("acos", "acosh", "asin", "asinh", "atan", "atanh", "cosh",
                                  "sinh", "tan", "erf", "conv", "avg_pool")},
    "isinf": {"f16": _F32},
    "max": {"i16": _I32, "u16": _I32},
    "min": {"i16": _I32, "u16": _I32},
    "pow": _WRAPPING,
    "reduce_sum": _WRAPPING,
    "reduce_prod": _WRAPPING,
    "reduce_max": _ORDERED,
    "reduce_min": _ORDERED,
    "argmax": _ORDERED,
    "argmin": _ORDERED,
    "pad": {"i16": _I32, "u16": _I32},
    "select": {"bool": Carrier("u8"), "i16": _I32, "u16": _I32, "u64": _I64},
    "matmul": {"i8": _I32, "i16": _I32, "u8": _I32, "u16": _I32},
    "max_pool": {d: _F64 for d in ("i16", "u16", "i32", "u32", "i64", "u64")},
}


def data_dtype(node: Node) -> str:
    """The dtype a carrier replaces: select's branches, else the first input's."""
    return node.inputs[1].dtype if node.op == "select" else node.inputs[0].dtype


def carrier(node: Node) -> Carrier | None:
    """The carrier to export `node` in, or None when onnxruntime runs it as it is."""
    if not node.inputs:
        return None
    return CARRIERS.get(node.op, {}).get(data_dtype(node))


def retyped(node: Node, to: str) -> Node:
    """A stand-in for `node` whose data values (see data_dtype) have dtype `to`.

    The exporters read dtypes off the node (pad values, constants they add), so
    they run unchanged on the stand-in; select's condition keeps its type.
    """
    old = data_dtype(node)
    view = Node(node.op, [], node.attrs, node.name)
    view.inputs = [_as(v, to, v.producer) if v.dtype == old and not (node.op == "select"
                                                                      and i == 0) else v
                   for i, v in enumerate(node.inputs)]
    view.outputs = [_as(v, to, view) if v.dtype == old else v for v in node.outputs]
    return view


def _as(v: Value, dtype: str, producer) -> Value:
    return Value(v.name, TensorType(dtype, v.shape), producer)
