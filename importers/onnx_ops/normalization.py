"""Normalizations, decomposed into primitives.

BatchNormalization (inference) is y = x * s + t with per-channel
    s = gamma / sqrt(var + eps),  t = beta - mean * s
computed from the constants at import (folded), shaped (C, 1, ..., 1), so the
fold pass can merge the mul and add into a preceding Conv or Gemm. In training
mode (schema version 14 on) it normalizes with the batch's own statistics over
every axis but the channel (mean and population variance) and returns the running
statistics: running = input * momentum + current * (1 - momentum).
InstanceNormalization, LayerNormalization, RMSNormalization and
GroupNormalization normalize with mean and biased variance over their axes:
    y = (x - mean) / sqrt(var + eps) * scale + bias
"""

from __future__ import annotations

from compiler.errors import InvalidModelError
from importers.onnx_ops import Fallback, converter
from importers.onnx_ops.context import NodeContext


def _channel_shape(x, rank_from: int = 2) -> tuple:
    """(C, 1, ..., 1): a per-channel vector shaped to broadcast against N, C, spatial."""
    return (x.shape[1],) + (1,) * (x.type.rank - rank_from)


def _moments(cx: NodeContext, x, axes):
    """(x - mean, mean, biased variance) over `axes` (the statistics keep their dims)."""
    mean = cx.mean(x, axes)
    centered = cx.op("sub", x, mean)
    return centered, mean, cx.mean(cx.op("mul", centered, centered), axes)


def _normalize(cx: NodeContext, x, axes, eps: float):
    """((x - mean) / sqrt(var + eps), mean, 1 / sqrt(var + eps)) over `axes`."""
    centered, mean, var = _moments(cx, x, axes)
    inv_std = cx.op("reciprocal", cx.op("sqrt", cx.op("add", var, cx.scalar(eps, x.dtype))))
    return cx.op("mul", centered, inv_std), mean, inv_std


@converter("BatchNormalization", 7)
def convert_batch_norm(cx: NodeContext):
    if cx.attr("training_mode", 0):
        return _batch_norm_training(cx)
    if cx.version < 9 and not cx.attr("spatial", 1):
        raise Fallback("BatchNormalization with spatial=0")
    if any(cx.wants_output(i) for i in range(1, 5)):
        raise Fallback("BatchNormalization's running statistics outputs are requested")
    x, gamma, beta, mean, var = cx.inputs[:5]
    eps = cx.attr("epsilon", 1e-5)
    scale = cx.op("div", gamma, cx.op("sqrt", cx.op("add", var, cx.scalar(eps, var.dtype))))
    shift = cx.op("sub", beta, cx.op("mul", mean, scale))
    scale = cx.cast(cx.reshape(scale, _channel_shape(x)), x.dtype)
    shift = cx.cast(cx.reshape(shift, _channel_shape(x)), x.dtype)
    return [cx.op("add", cx.op("mul", x, scale), shift)]


def _batch_norm_training(cx: NodeContext):
    """Y with the batch's statistics, and the running mean and variance (outputs 1, 2)."""
    if any(cx.wants_output(i) for i in range(3, 5)):
        raise Fallback("BatchNormalization's saved statistics outputs are requested")
    x, gamma, beta, mean, var = cx.inputs[:5]
    if x.dtype not in ("f32", "f64"):
        raise Fallback(f"BatchNormalization in training mode over {x.dtype}")
    centered, cur_mean, cur_var = _moments(cx, x, [0] + list(range(2, x.type.rank)))
    eps = cx.scalar(cx.attr("epsilon", 1e-5), x.dtype)
    inv_std = cx.op("reciprocal", cx.op("sqrt", cx.op("add", cur_var, eps)))
    channel = (1,) + _channel_shape(x)
    scale = cx.op("mul", inv_std, cx.reshape(cx.cast(gamma, x.dtype), channel))
    y = cx.op("add", cx.op("mul", centered, scale),
              cx.reshape(cx.cast(beta, x.dtype), channel))
    momentum = cx.attr("momentum", 0.9)

    def running(old, current):
        current = cx.cast(cx.reshape(current, old.shape), old.dtype)
        return cx.op("add", cx.op("mul", old, cx.scalar(momentum, old.dtype)),
                     cx.op("mul", current, cx.scalar(1 - momentum, old.dtype)))

    return [y, running(mean, cur_mean), running(var, cur_var)]


@converter("InstanceNormalization", 6)
def convert_instance_norm(cx: NodeContext):
    x, scale, bias = cx.inputs
    y, _, _ = _normalize(cx, x, range(2, x.type.rank), cx.attr("epsilon", 1e-5))
    y = cx.op("mul", y, cx.reshape(scale, _channel_shape(x)))
    return [cx.op("add", y, cx.reshape(bias, _channel_shape(x)))]


@converter("LayerNormalization", 17)
def convert_layer_norm(cx: NodeContext):
    """Normalize over axes axis..rank-1; stash_type=1 computes in f32 (as ONNX says)."""
    x, scale, bias = cx.input(0), cx.input(1), cx.input(2)
    rank = x.type.rank
    axes = range(cx.axis(cx.attr("axis", -1), rank), rank)
    stash = "f32" if cx.attr("stash_type", 1) == 1 else x.dtype
    y, mean, inv_std = _normalize(cx, cx.cast(x, stash), axes, cx.attr("epsilon", 1e-5))
    y = cx.cast(y, x.dtype)
    y = cx.op("mul", y, scale)
    if bias is not None:
        y = cx.op("add", y, bias)
    return [y, mean, inv_std]


@converter("RMSNormalization", 23)
def convert_rms_norm(cx: NodeContext):
    """x / sqrt(mean(x^2) + eps) * scale over axes axis..rank-1."""
    x, scale = cx.input(0), cx.input(1)
    rank = x.type.rank
    axes = range(cx.axis(cx.attr("axis", -1), rank), rank)
    stash = "f32" if cx.attr("stash_type", 1) == 1 else x.dtype
    xs = cx.cast(x, stash)
    ms = cx.mean(cx.op("mul", xs, xs), axes)
    eps = cx.scalar(cx.attr("epsilon", 1e-5), stash)
    inv = cx.op("reciprocal", cx.op("sqrt", cx.op("add", ms, eps)))
    return [cx.op("mul", cx.cast(cx.op("mul", xs, inv), x.dtype), scale)]


@converter("GroupNormalization", 21)
def convert_group_norm(cx: NodeContext):
    """Reshape to (N, G, rest), normalize over rest, reshape back, per-channel affine."""
    x, scale, bias = cx.inputs
    groups = cx.attr("num_groups")
    n, c = x.shape[:2]
    if groups <= 0 or c % groups:
        raise Fallback(f"{c} channels do not split into {groups} groups")
    stash = "f32" if cx.attr("stash_type", 1) == 1 else x.dtype
    grouped = cx.reshape(cx.cast(x, stash), (n, groups, x.type.size // max(n * groups, 1)))
    y, _, _ = _normalize(cx, grouped, [2], cx.attr("epsilon", 1e-5))
    y = cx.cast(cx.reshape(y, x.shape), x.dtype)
    y = cx.op("mul", y, cx.reshape(scale, _channel_shape(x)))
    return [cx.op("add", y, cx.reshape(bias, _channel_shape(x)))]


@converter("LpNormalization", 1)
def convert_lp_normalization(cx: NodeContext):
    """x / ||x||_p along `axis`, p 1 or 2; 0 where the norm is 0 (onnxruntime, ONNX's
    reference)."""
    x = cx.x
    p, axis = cx.attr("p", 2), cx.axis(cx.attr("axis", -1), cx.x.type.rank)
    if p not in (1, 2):
        raise InvalidModelError(f"{cx.describe}: p must be 1 or 2, not {p}")
    if x.dtype not in ("f32", "f64"):
        raise Fallback(f"LpNormalization over {x.type}")
    if p == 1:
        norm = cx.reduce("sum", cx.op("abs", x), [axis])
    else:
        norm = cx.op("sqrt", cx.reduce("sum", cx.op("mul", x, x), [axis]))
    zero = cx.scalar(0, x.dtype)
    return [cx.op("select", cx.op("eq", norm, zero), zero, cx.op("div", x, norm))]


@converter("LRN", 1)
def convert_lrn(cx: NodeContext):
    """Local response normalization across channels (AlexNet, GoogLeNet, ZFNet):
    y = x / (bias + alpha / size * sum of x^2 over the `size` channels around c)^beta,
    the window cut at the channel ends: the squares padded with zeros along the
    channels, summed over `size` shifted slices."""
    x = cx.x
    if x.dtype not in ("f32", "f64") or x.shape[1] is None:
        raise Fallback(f"LRN over {x.type}")
    size = int(cx.attr("size", 0))
    if size < 1 or size % 2 == 0 or x.type.rank != 4:
        # onnxruntime takes odd sizes over 4-d inputs only, and braze refuses what it does
        raise InvalidModelError(f"{cx.describe}: LRN of size {size} over a rank-"
                                f"{x.type.rank} input (onnxruntime takes odd sizes, 4-d)")
    alpha, beta = float(cx.attr("alpha", 1e-4)), float(cx.attr("beta", 0.75))
    bias = float(cx.attr("bias", 1.0))
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    square = cx.op("mul", x, x)
    pads = [0] * (2 * x.type.rank)
    pads[1], pads[x.type.rank + 1] = before, after
    padded = cx.op("pad", square, pads=tuple(pads), mode="constant", value=0.0)
    total = None
    for j in range(size):
        starts = [0] * x.type.rank
        starts[1] = j
        part = cx.op("slice", padded, starts=tuple(starts), steps=(1,) * x.type.rank,
                     sizes=x.shape)
        total = part if total is None else cx.op("add", total, part)
    scaled = cx.op("add", cx.op("mul", total, cx.scalar(alpha / size, x.dtype)),
                   cx.scalar(bias, x.dtype))
    return [cx.op("div", x, cx.op("pow", scaled, cx.scalar(beta, x.dtype)))]
