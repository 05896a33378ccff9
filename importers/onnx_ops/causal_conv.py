"""CausalConvWithState (opset 27): a causal depthwise conv1d that carries its state.

With x [B, C, L], the weight w [C, 1, k] and the state s [B, C, k - 1] (zeros if absent):
    p = concat(s, x) along the time axis          [B, C, L + k - 1]
    y[b, c, t] = sum_j w[c, 0, j] * p[b, c, t + j] + bias[c]
    y = y * sigmoid(y)                            (activation "silu" or "swish")
    present_state = p[:, :, L:]                   (its last k - 1 positions)
The k taps are k slices of p times a column of w, so the conv is elementwise ops that
fuse into one kernel, whether the weight is a constant or a run-time input. float16 is
computed in float32 (as the spec's reference computes the activation) and cast back.
"""

from __future__ import annotations

from compiler.errors import InvalidModelError
from importers.onnx_ops import Fallback, converter
from importers.onnx_ops.context import NodeContext

ACTIVATIONS = ("none", "silu", "swish")
# Kernels with more taps than this are refused: a sum of as many shifted slices
# (the Mamba and Gated DeltaNet convs this op is for have k = 4).
CAUSAL_CONV_MAX_TAPS = 64


def _check(cx: NodeContext, x, w, b, s) -> int:
    """k, after the spec's shape rules (InvalidModelError) and braze's limits (Fallback)."""
    for v in (x, w, b, s):
        if v is not None and not v.type.static:
            raise Fallback(f"CausalConvWithState with a symbolic shape ({v.type})")
    if x.type.rank != 3 or w.type.rank != 3:
        raise InvalidModelError(f"{cx.describe}: input {x.shape} and weight {w.shape} must "
                                "be rank 3")
    batch, chans, _ = x.shape
    k = w.shape[2]
    if w.shape[:2] != (chans, 1) or k < 1:
        raise InvalidModelError(f"{cx.describe}: weight {w.shape} for {chans} channels is "
                                "not (channels, 1, k >= 1)")
    if b is not None and b.shape != (chans,):
        raise InvalidModelError(f"{cx.describe}: bias {b.shape} for {chans} channels")
    if s is not None and s.shape != (batch, chans, k - 1):
        raise InvalidModelError(f"{cx.describe}: past_state {s.shape}, expected "
                                f"{(batch, chans, k - 1)}")
    if x.dtype not in ("f16", "f32", "f64"):
        raise Fallback(f"CausalConvWithState over {x.dtype}")
    if k > CAUSAL_CONV_MAX_TAPS:
        raise Fallback(f"a causal conv of {k} taps (> CAUSAL_CONV_MAX_TAPS)")
    return k


def _taps(cx: NodeContext, p, w, length: int):
    """sum_j w[:, 0, j] * p[:, :, j : j + length]."""
    batch, chans, _ = p.shape
    y = None
    for j in range(w.shape[2]):
        tap = cx.op("slice", p, starts=(0, 0, j), steps=(1, 1, 1),
                    sizes=(batch, chans, length))
        wj = cx.reshape(cx.op("slice", w, starts=(0, 0, j), steps=(1, 1, 1),
                              sizes=(chans, 1, 1)), (chans, 1))
        term = cx.op("mul", tap, wj)
        y = term if y is None else cx.op("add", y, term)
    return y


@converter("CausalConvWithState", 27)
def convert_causal_conv_with_state(cx: NodeContext):
    x, w, b, s = (cx.input(i) for i in range(4))
    activation = cx.attr("activation", "none")
    if activation not in ACTIVATIONS:
        raise InvalidModelError(f"{cx.describe}: activation {activation!r} is not one of "
                                f"{ACTIVATIONS}")
    k = _check(cx, x, w, b, s)
    work = "f32" if x.dtype == "f16" else x.dtype
    batch, chans, length = x.shape
    xw = cx.cast(x, work)
    if k == 1:
        p = xw
    elif s is None:
        p = cx.op("pad", xw, pads=(0, 0, k - 1, 0, 0, 0), mode="constant", value=0.0)
    else:
        p = cx.op("concat", cx.cast(s, work), xw, axis=2)
    y = _taps(cx, p, cx.cast(w, work), length)
    if b is not None:
        y = cx.op("add", y, cx.reshape(cx.cast(b, work), (chans, 1)))
    if activation != "none":
        y = cx.op("mul", y, cx.op("sigmoid", y))
    state = cx.op("slice", p, starts=(0, 0, min(length, p.shape[2] - 1)), steps=(1, 1, 1),
                  sizes=(batch, chans, k - 1))
    return [cx.cast(y, x.dtype), cx.cast(state, x.dtype)]
