"""Activation functions, decomposed into primitive elementwise IR ops.

    Relu        max(x, 0)
    LeakyRelu   x < 0 ? alpha*x : x                PRelu: same, alpha a tensor
    Elu         x < 0 ? alpha*expm1(x) : x
    Selu        gamma * (x <= 0 ? alpha*expm1(x) : x)
    Celu        max(x, 0) + min(0, alpha*expm1(x/alpha))
    Softplus    max(x, 0) + log1p(exp(-|x|))       (stable for large |x|)
    Softsign    x / (1 + |x|)
    HardSigmoid max(0, min(1, alpha*x + beta));    HardSwish: x * HardSigmoid(x; 1/6, 1/2)
    Gelu        x/2 * (1 + erf(x/sqrt 2))  or the tanh approximation
    Mish        x * tanh(softplus(x));             Swish: x * sigmoid(alpha*x)
    Clip        min(max(x, lo), hi)                Shrink, ThresholdedRelu
"""

from __future__ import annotations

import math

import numpy as np

from importers.onnx_ops import converter
from importers.onnx_ops.context import NodeContext


def _where_negative(cx: NodeContext, x, negative, *, inclusive: bool = False):
    """select(x < 0, negative, x) (x <= 0 if inclusive)."""
    cond = cx.op("le" if inclusive else "lt", x, cx.scalar(0, x.dtype))
    return cx.op("select", cond, negative, x)


def _softplus(cx: NodeContext, x):
    zero = cx.scalar(0, x.dtype)
    tail = cx.op("log1p", cx.op("exp", cx.op("neg", cx.op("abs", x))))
    return cx.op("add", cx.op("max", x, zero), tail)


def _hard_sigmoid(cx: NodeContext, x, alpha: float, beta: float):
    lin = cx.op("add", cx.op("mul", x, cx.scalar(alpha, x.dtype)), cx.scalar(beta, x.dtype))
    return cx.op("max", cx.op("min", lin, cx.scalar(1, x.dtype)), cx.scalar(0, x.dtype))


@converter("Relu", 6)
def convert_relu(cx: NodeContext):
    return [cx.op("max", cx.x, cx.scalar(0, cx.x.dtype))]


@converter("LeakyRelu", 6)
def convert_leaky_relu(cx: NodeContext):
    x = cx.x
    return [_where_negative(cx, x, cx.op("mul", x, cx.scalar(cx.attr("alpha", 0.01), x.dtype)))]


@converter("PRelu", 7)
def convert_prelu(cx: NodeContext):
    x, slope = cx.inputs
    return [_where_negative(cx, x, cx.op("mul", x, slope))]


@converter("Elu", 6)
def convert_elu(cx: NodeContext):
    x = cx.x
    neg = cx.op("mul", cx.op("expm1", x), cx.scalar(cx.attr("alpha", 1.0), x.dtype))
    return [_where_negative(cx, x, neg)]


@converter("Selu", 6)
def convert_selu(cx: NodeContext):
    x = cx.x
    alpha = cx.attr("alpha", 1.67326319217681884765625)
    gamma = cx.attr("gamma", 1.05070102214813232421875)
    neg = cx.op("mul", cx.op("expm1", x), cx.scalar(alpha, x.dtype))
    return [cx.op("mul", _where_negative(cx, x, neg, inclusive=True), cx.scalar(gamma, x.dtype))]


@converter("Celu", 12)
def convert_celu(cx: NodeContext):
    x = cx.x
    alpha = cx.scalar(cx.attr("alpha", 1.0), x.dtype)
    zero = cx.scalar(0, x.dtype)
    neg = cx.op("mul", cx.op("expm1", cx.op("div", x, alpha)), alpha)
    return [cx.op("add", cx.op("max", x, zero), cx.op("min", neg, zero))]


@converter("Softplus", 1)
def convert_softplus(cx: NodeContext):
    return [_softplus(cx, cx.x)]


@converter("Softsign", 1)
def convert_softsign(cx: NodeContext):
    x = cx.x
    return [cx.op("div", x, cx.op("add", cx.op("abs", x), cx.scalar(1, x.dtype)))]


@converter("HardSigmoid", 6)
def convert_hard_sigmoid(cx: NodeContext):
    return [_hard_sigmoid(cx, cx.x, cx.attr("alpha", 0.2), cx.attr("beta", 0.5))]


@converter("HardSwish", 14)
def convert_hard_swish(cx: NodeContext):
    return [cx.op("mul", cx.x, _hard_sigmoid(cx, cx.x, 1 / 6, 0.5))]


@converter("Gelu", 20)
def convert_gelu(cx: NodeContext):
    x = cx.x
    half = cx.op("mul", x, cx.scalar(0.5, x.dtype))
    if cx.attr("approximate", "none") == "tanh":
        cube = cx.op("mul", cx.op("mul", x, x), x)
        inner = cx.op("add", x, cx.op("mul", cube, cx.scalar(0.044715, x.dtype)))
        inner = cx.op("mul", inner, cx.scalar(math.sqrt(2 / math.pi), x.dtype))
        return [cx.op("mul", half, cx.op("add", cx.op("tanh", inner), cx.scalar(1, x.dtype)))]
    erf = cx.op("erf", cx.op("mul", x, cx.scalar(1 / math.sqrt(2), x.dtype)))
    return [cx.op("mul", half, cx.op("add", erf, cx.scalar(1, x.dtype)))]


@converter("Mish", 18)
def convert_mish(cx: NodeContext):
    return [cx.op("mul", cx.x, cx.op("tanh", _softplus(cx, cx.x)))]


@converter("Swish", 24)
def convert_swish(cx: NodeContext):
    x = cx.x
    scaled = cx.op("mul", x, cx.scalar(cx.attr("alpha", 1.0), x.dtype))
    return [cx.op("mul", x, cx.op("sigmoid", scaled))]


@converter("ThresholdedRelu", 10)
def convert_thresholded_relu(cx: NodeContext):
    x = cx.x
    cond = cx.op("gt", x, cx.scalar(cx.attr("alpha", 1.0), x.dtype))
    return [cx.op("select", cond, x, cx.scalar(0, x.dtype))]


@converter("Shrink", 9)
def convert_shrink(cx: NodeContext):
    x = cx.x
    lambd, bias = cx.attr("lambd", 0.5), cx.attr("bias", 0.0)
    zero = cx.scalar(0, x.dtype)
    low = cx.op("select", cx.op("lt", x, cx.scalar(-lambd, x.dtype)),
                cx.op("add", x, cx.scalar(bias, x.dtype)), zero)
    return [cx.op("select", cx.op("gt", x, cx.scalar(lambd, x.dtype)),
                  cx.op("sub", x, cx.scalar(bias, x.dtype)), low)]


@converter("Clip", 6, 10)
def convert_clip_attrs(cx: NodeContext):
    """Opset < 11: bounds are float attributes."""
    x = cx.x
    lo = cx.attr("min", float(np.finfo(np.float32).min))
    hi = cx.attr("max", float(np.finfo(np.float32).max))
    return [cx.op("min", cx.op("max", x, cx.scalar(lo, x.dtype)), cx.scalar(hi, x.dtype))]


@converter("Clip", 11)
def convert_clip(cx: NodeContext):
    """Opset >= 11: optional scalar inputs min and max (any value, constant or not)."""
    y = cx.x
    if cx.input(1) is not None:
        y = cx.op("max", y, cx.input(1))
    if cx.input(2) is not None:
        y = cx.op("min", y, cx.input(2))
    return [y]
