"""ONNX Attention (opset 23 on) -> braze's attention op (kernels/attention.py).

  Y = softmax(scale * Q K^T + mask [+ causal]) V,    scale default 1 / sqrt(head size)

Q, K, V 4-D [batch, heads, seq, head size], or 3-D [batch, seq, heads * head size]
with q_num_heads / kv_num_heads (split into heads here, merged back after). A boolean
mask is True where a key takes part: additive 0 there, -inf elsewhere; a mask shorter
than the keys is padded with -inf; a query row with no key left gives zeros (the spec's
rule; torch gives NaN). Grouped heads (fewer kv heads) read their kv head through a
broadcast. A KV cache (past_key, past_value: a decoder's step) is concatenated ahead of
K and V, which are then the present_key / present_value outputs; the causal mask is
then bottom-right aligned (query i sees keys j <= i + past length: a constant additive
bias, as is a sliding window), without one top-left (j <= i, the kernel's own causal
flag). softcap
(softcap * tanh(scores / softcap) before the mask: Gemma-2) is written out as matmuls,
tanh and a softmax, the reference's order, as is a node whose qk_matmul output (the
scores, or with the mask, or the probabilities) is asked for. The cases braze does not express run on
onnxruntime, each with its reason: unknown
attributes and masks that do not broadcast to the scores. An external cache's
nonpad_kv_seqlen (each batch row's valid keys) becomes a bias computed from it at run
time, its causal frontier per row. float16 nodes compute in float32 (half_as_float).
"""

from __future__ import annotations

import math

import numpy as np

from importers.onnx_ops import Fallback, converter
from importers.onnx_ops.context import NodeContext, half_as_float


def _heads(cx: NodeContext, x, heads: int):
    """[B, S, H * D] -> [B, H, S, D]."""
    if not heads or x.shape[-1] % heads:
        raise Fallback("3-D inputs without a head count that divides their width")
    b, s, w = x.shape
    return cx.transpose(cx.reshape(x, (b, s, heads, w // heads)), (0, 2, 1, 3))


# Attributes the converter reads (the others it does not express, so it refuses them).
_KNOWN = {"is_causal", "q_num_heads", "kv_num_heads", "scale", "softcap",
          "qk_matmul_output_mode", "softmax_precision", "left_window_size",
          "right_window_size"}


def _grouped(cx: NodeContext, x, heads: int):
    """[B, Hkv, S, D] -> [B, heads, S, D], query head h reading kv head h // (heads / Hkv)
    (grouped-query attention): movement ops only, which the kernel reads through."""
    b, hkv, s, d = x.shape
    if hkv == heads:
        return x
    g = heads // hkv
    x = cx.op("broadcast", cx.reshape(x, (b, hkv, 1, s, d)), shape=(b, hkv, g, s, d))
    return cx.reshape(x, (b, heads, s, d))


def _refusal(cx: NodeContext) -> str | None:
    unknown = sorted(set(cx.attrs) - _KNOWN)
    if unknown:
        return f"attributes {unknown}"
    if (cx.input(4) is None) != (cx.input(5) is None):
        return "past_key without past_value, or the other way"
    if cx.input(6) is not None and cx.input(4) is not None:
        return "nonpad_kv_seqlen with a past key and value (the spec forbids it)"
    if cx.attr("qk_matmul_output_mode", 0) not in (0, 1, 2, 3):
        return f"qk_matmul_output_mode {cx.attr('qk_matmul_output_mode')}"
    return None


@converter("Attention", 23)
@half_as_float
def convert_attention(cx: NodeContext):
    reason = _refusal(cx)
    if reason is not None:
        raise Fallback(reason)
    q, k, v = cx.input(0), cx.input(1), cx.input(2)
    three_d = q.type.rank == 3
    if three_d:
        q = _heads(cx, q, cx.attr("q_num_heads", 0))
        k = _heads(cx, k, cx.attr("kv_num_heads", 0))
        v = _heads(cx, v, cx.attr("kv_num_heads", 0))
    past = 0
    if cx.input(4) is not None:
        pk, pv = cx.input(4), cx.input(5)
        if pk.type.rank != 4 or pv.type.rank != 4 or pk.shape[2] != pv.shape[2]:
            raise Fallback(f"past key {pk.shape} and value {pv.shape}")
        past = pk.shape[2]
        k, v = cx.op("concat", pk, k, axis=2), cx.op("concat", pv, v, axis=2)
    present_k, present_v = k, v
    if q.type.rank != 4 or k.shape[:2] != v.shape[:2] or q.shape[0] != k.shape[0] or \
            q.shape[1] % k.shape[1]:
        raise Fallback(f"q {q.shape}, k {k.shape}, v {v.shape}: heads that do not group")
    k, v = _grouped(cx, k, q.shape[1]), _grouped(cx, v, q.shape[1])
    scale = cx.attr("scale", None)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    softcap = float(cx.attr("softcap", 0.0) or 0.0)
    mask = _mask(cx, q, k)
    causal = bool(cx.attr("is_causal", 0))
    left, right = cx.attr("left_window_size", -1), cx.attr("right_window_size", -1)
    if cx.input(6) is not None:  # a static cache: each batch row's own valid length
        bias = _per_batch_bias(cx, q, k, cx.input(6), causal, left, right)
        mask = bias if mask is None else cx.op("add", mask, bias)
        causal = False
    elif (causal and (past or softcap > 0)) or left >= 0 or right >= 0:
        # the kernel's causal flag is top-left aligned: a constant bias instead
        allowed = _allowed(q.shape[2], k.shape[2], past, causal, left, right)
        bias = cx.const(np.where(allowed, 0.0, -np.inf).astype(
            np.float32 if q.dtype == "f32" else np.float64))
        mask = bias if mask is None else cx.op("add", mask, bias)
        causal = False
    qk = None
    if softcap > 0 or cx.wants_output(3):
        y, qk = _written_out(cx, q, k, v, scale, softcap, mask,
                             cx.attr("qk_matmul_output_mode", 0))
    else:
        from compiler.kernels import attention

        reason = attention.refusal_for(q, v.shape, k.shape[-2])
        if reason is not None:  # onnxruntime's own Attention then runs it
            raise Fallback(f"braze's attention kernel refuses it: {reason}")
        inputs = [q, k, v] + ([] if mask is None else [mask])
        y = cx.op("attention", *inputs, scale=scale, causal=causal, empty_rows_zero=True)
    if three_d:
        b, h, s, d = y.shape
        y = cx.reshape(cx.transpose(y, (0, 2, 1, 3)), (b, s, h * d))
    return [y, present_k, present_v, qk]


def _allowed(t: int, n: int, past: int, causal: bool, left: int, right: int) -> np.ndarray:
    """[t, n] bool: query i (at position past + i) may see key j: j <= past + i when
    causal, within `left` keys before it and `right` after it where those are >= 0
    (a sliding window: Mistral's, Gemma-2's local layers)."""
    diff = past + np.arange(t)[:, None] - np.arange(n)[None, :]
    allowed = np.ones((t, n), bool)
    if causal:
        allowed &= diff >= 0
    if left >= 0:
        allowed &= diff <= left
    if right >= 0:
        allowed &= -diff <= right
    return allowed


def _per_batch_bias(cx: NodeContext, q, k, lengths, causal: bool, left: int, right: int):
    """The additive [B, 1, T, S] bias of an external (static) KV cache whose batch row b
    holds lengths[b] valid keys: keys from lengths[b] on are masked, and the causal
    frontier and window sit at offset lengths[b] - T (the spec's bottom-right alignment),
    computed at run time from the lengths input."""
    b, t, n = q.shape[0], q.shape[2], k.shape[2]
    length = cx.reshape(cx.cast(lengths, "i64"), (b, 1, 1, 1))
    j = cx.const(np.arange(n, dtype=np.int64).reshape(1, 1, 1, n))
    i = cx.const(np.arange(t, dtype=np.int64).reshape(1, 1, t, 1))
    allowed = cx.op("lt", j, length)
    diff = cx.op("sub", cx.op("add", i, cx.op("sub", length, cx.scalar(t, "i64"))), j)
    if causal:
        allowed = cx.op("and", allowed, cx.op("ge", diff, cx.scalar(0, "i64")))
    if left >= 0:
        allowed = cx.op("and", allowed, cx.op("le", diff, cx.scalar(left, "i64")))
    if right >= 0:
        allowed = cx.op("and", allowed, cx.op("ge", diff, cx.scalar(-right, "i64")))
    return cx.op("select", allowed, cx.scalar(0.0, q.dtype), cx.scalar(-math.inf, q.dtype))


def _mask(cx: NodeContext, q, k):
    """The attn_mask input as an additive mask broadcastable to the scores (padded with
    -inf to the keys' length), or None."""
    mask = cx.input(3)
    if mask is None:
        return None
    if mask.dtype == "bool":
        mask = cx.op("select", mask, cx.scalar(0.0, q.dtype), cx.scalar(-math.inf, q.dtype))
    n = k.shape[-2]
    if mask.type.rank and mask.shape[-1] < n:
        pads = [0] * (2 * mask.type.rank)
        pads[2 * mask.type.rank - 1] = n - mask.shape[-1]
        mask = cx.op("pad", mask, pads=tuple(pads), mode="constant", value=-math.inf)
    scores = q.shape[:-1] + (n,)
    if mask.type.rank > 4 or any(d not in (1, s) for d, s in zip(mask.shape[::-1],
                                                                scores[::-1])):
        raise Fallback(f"mask {mask.shape} does not broadcast to the scores {scores}")
    return mask


def _written_out(cx: NodeContext, q, k, v, scale: float, softcap: float, mask,
                 mode: int) -> tuple:
    """(softmax(softcap * tanh(sqrt(scale) Q (sqrt(scale) K)^T / softcap) + mask) V, the
    qk_matmul output of `mode`: the scores (softcapped where softcap is set) for 0 and
    1, with the mask for 2, the probabilities for 3), a row whose mask is all -inf giving
    zeros: the spec's reference, op for op."""
    from importers.onnx_ops.nn import matmul

    root = cx.scalar(math.sqrt(scale), q.dtype)
    s = matmul(cx, cx.op("mul", q, root), cx.transpose(cx.op("mul", k, root), (0, 1, 3, 2)))
    if softcap > 0:
        cap = cx.scalar(softcap, q.dtype)
        s = cx.op("mul", cx.op("tanh", cx.op("div", s, cap)), cap)
    scores = s
    if mask is not None:
        s = cx.op("add", s, mask)
    shifted = cx.op("sub", s, cx.reduce("max", s, (3,)))
    e = cx.op("exp", shifted)
    p = cx.op("div", e, cx.reduce("sum", e, (3,)))
    if mask is not None:  # rows with no key: zeros (decided on the mask, as the spec)
        full = cx.op("broadcast", mask, shape=s.shape)
        empty = cx.op("eq", cx.reduce("max", full, (3,)), cx.scalar(-math.inf, q.dtype))
        p = cx.op("select", empty, cx.scalar(0.0, q.dtype), p)
    qk = {2: s, 3: p}.get(mode, scores)
    return matmul(cx, p, v), qk
