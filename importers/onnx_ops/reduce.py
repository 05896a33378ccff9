"""ONNX reductions over IR reduce_sum/prod/max/min, and ArgMax/ArgMin.

    ReduceMean       sum / count               ReduceSumSquare  sum(x * x)
    ReduceL1         sum(|x|)                  ReduceL2         sqrt(sum(x * x))
    ReduceLogSum     log(sum(x))               ReduceLogSumExp  log(sum(exp(x - m))) + m
Axes come from an attribute, or from input 1 from ReduceSum 13 and the others 18.
Empty axes mean "all axes", or the identity when noop_with_empty_axes is set.
ReduceMax/ReduceMin take bools (False < True) through uint8. Over an empty set (a
reduced dim of size 0) the spec's values are constants: ReduceMax gives -inf (the
type's minimum for integers, False for bool), ReduceMin +inf (maximum, True),
ReduceLogSumExp -inf.
"""

from __future__ import annotations

import numpy as np

from compiler import dtypes
from compiler.ops.reduction import reduced_shape
from importers.onnx_ops import Fallback, converter
from importers.onnx_ops.context import NodeContext

# op -> schema version from which axes are an input
_AXES_INPUT_SINCE = {"ReduceSum": 13}
_DEFAULT_AXES_INPUT_SINCE = 18


def _axes(cx: NodeContext, op_type: str) -> list[int] | None:
    """Normalized axes to reduce, or None for the identity (noop_with_empty_axes)."""
    rank = cx.x.type.rank
    if cx.version >= _AXES_INPUT_SINCE.get(op_type, _DEFAULT_AXES_INPUT_SINCE):
        axes = cx.ints_input(1, "axes") or []
    else:
        axes = list(cx.attr("axes") or [])
    if not axes:
        return None if cx.attr("noop_with_empty_axes", 0) else list(range(rank))
    return sorted({cx.axis(a, rank) for a in axes})


def _reduce_sum_square(cx, x, axes, keep):
    return cx.reduce("sum", cx.op("mul", x, x), axes, keep)


def _reduce_log_sum_exp(cx, x, axes, keep):
    m = cx.reduce("max", x, axes, True)
    total = cx.reduce("sum", cx.op("exp", cx.op("sub", x, m)), axes, keep)
    return cx.op("add", cx.op("log", total), m if keep else cx.reshape(m, total.shape))


# ONNX op -> fn(cx, x, axes, keepdims) -> Value
REDUCTIONS = {
    "ReduceSum": lambda cx, x, axes, keep: cx.reduce("sum", x, axes, keep),
    "ReduceProd": lambda cx, x, axes, keep: cx.reduce("prod", x, axes, keep),
    "ReduceMax": lambda cx, x, axes, keep: cx.reduce("max", x, axes, keep),
    "ReduceMin": lambda cx, x, axes, keep: cx.reduce("min", x, axes, keep),
    "ReduceMean": lambda cx, x, axes, keep: cx.mean(x, axes, keep),
    "ReduceSumSquare": _reduce_sum_square,
    "ReduceL1": lambda cx, x, axes, keep: cx.reduce("sum", cx.op("abs", x), axes, keep),
    "ReduceL2": lambda cx, x, axes, keep: cx.op("sqrt", _reduce_sum_square(cx, x, axes, keep)),
    "ReduceLogSum": lambda cx, x, axes, keep: cx.op("log", cx.reduce("sum", x, axes, keep)),
    "ReduceLogSumExp": _reduce_log_sum_exp,
}


# ops whose empty-set value is not what the IR's reduction computes -> that value's kind
_EMPTY_VALUE = {"ReduceMax": "lowest", "ReduceMin": "highest", "ReduceLogSumExp": "-inf"}


def _empty_value(op_type: str, dtype: str):
    """The spec's result of `op_type` over an empty set of `dtype` values."""
    kind = _EMPTY_VALUE[op_type]
    if dtype == "bool":
        return kind == "highest"
    if dtype in dtypes.FLOATS:
        return np.inf if kind == "highest" else -np.inf
    if kind == "-inf":
        raise Fallback(f"{op_type} over an empty set of {dtype} (undefined in the spec)")
    info = np.iinfo(dtypes.to_numpy(dtype))
    return info.max if kind == "highest" else info.min


def _reduce_empty(cx: NodeContext, op_type: str, axes, keep: bool):
    """The constant result of a reduction over an empty set, in the output's shape."""
    x = cx.x
    value = cx.scalar(_empty_value(op_type, x.dtype), x.dtype)
    return cx.op("broadcast", value, shape=reduced_shape(x.shape, axes, keep))


def _reduction(op_type: str, fn):
    def convert(cx: NodeContext):
        axes = _axes(cx, op_type)
        if axes is None:
            return [cx.x]
        keep = bool(cx.attr("keepdims", 1))
        if op_type in _EMPTY_VALUE and any(cx.x.shape[a] == 0 for a in axes):
            return [_reduce_empty(cx, op_type, axes, keep)]
        if cx.x.dtype == "bool" and op_type in ("ReduceMax", "ReduceMin"):
            y = fn(cx, cx.cast(cx.x, "u8"), axes, keep)  # False < True as 0 < 1
            return [cx.cast(y, "bool")]
        return [fn(cx, cx.x, axes, keep)]

    convert.__name__ = f"convert_{op_type.lower()}"
    return convert


for _op, _fn in REDUCTIONS.items():
    converter(_op, 1)(_reduction(_op, _fn))


def _arg(ir_op: str):
    def convert(cx: NodeContext):
        x = cx.x
        return [cx.op(ir_op, x, axis=cx.axis(cx.attr("axis", 0), x.type.rank),
                      keepdims=bool(cx.attr("keepdims", 1)),
                      select_last=bool(cx.attr("select_last_index", 0)))]

    convert.__name__ = f"convert_{ir_op}"
    return convert


converter("ArgMax", 1)(_arg("argmax"))
converter("ArgMin", 1)(_arg("argmin"))
