"""DynamicQuantizeLinear: float32 to uint8 with a scale and zero point from the data.

    lo = min(0, min(x))     hi = max(0, max(x))     scale = (hi - lo) / 255
    zero_point = round(saturate(0 - lo / scale))
    y = saturate(round(x / scale) + zero_point)
round is to nearest, ties to even (the IR's `round`); saturate clips to [0, 255] before
the cast to uint8. Where x is all zeros (hi = lo) the scale is 1, as onnxruntime makes it
(the spec's formula would divide 0 by 0).

Each quotient is the correctly rounded float32 quotient, as the spec's float32 arithmetic
gives: braze's kernels divide by a row-invariant value (a scalar) as a multiply by its
reciprocal, within 1 ulp, and a quotient 1 ulp off a .5 tie would round the other way.
So the divisions run in float64 and are rounded to float32 once (the exact quotient of
two float32 numbers is never a float32 tie, nor within float64's rounding error of one).
"""

from __future__ import annotations

from importers.onnx_ops import Fallback, converter
from importers.onnx_ops.context import NodeContext

Q_MAX = 255.0  # uint8's range is [0, 255]: the only output type the spec allows


def _saturate(cx: NodeContext, v):
    """v clipped to [0, 255]."""
    zero, top = cx.scalar(0.0, v.dtype), cx.scalar(Q_MAX, v.dtype)
    return cx.op("min", cx.op("max", v, zero), top)


def _quotient(cx: NodeContext, a, b):
    """a / b (float32), correctly rounded: computed in float64, rounded once."""
    return cx.cast(cx.op("div", cx.cast(a, "f64"), cx.cast(b, "f64")), "f32")


@converter("DynamicQuantizeLinear", 11)
def convert_dynamic_quantize_linear(cx: NodeContext):
    x = cx.x
    if x.dtype != "f32":
        raise Fallback(f"DynamicQuantizeLinear of {x.dtype} (the spec takes float32)")
    if not x.type.static or x.type.size == 0:
        raise Fallback(f"DynamicQuantizeLinear of {x.type}: no range to quantize over")
    axes = list(range(x.type.rank))
    zero = cx.scalar(0.0, "f32")
    lo = cx.op("min", cx.reduce("min", x, axes, keepdims=False), zero)
    hi = cx.op("max", cx.reduce("max", x, axes, keepdims=False), zero)
    spread = cx.op("sub", hi, lo)
    scale = cx.op("select", cx.op("eq", spread, zero), cx.scalar(1.0, "f32"),
                  _quotient(cx, spread, cx.scalar(Q_MAX, "f32")))
    zp = cx.op("round", _saturate(cx, cx.op("sub", zero, _quotient(cx, lo, scale))))
    # round first, then add: round(q) + zp differs from round(q + zp) at ties (2.5 + 1)
    y = _saturate(cx, cx.op("add", cx.op("round", _quotient(cx, x, scale)), zp))
    return [cx.cast(y, "u8"), scale, cx.cast(zp, "u8")]
