"""ONNX Attention (opset 23 on) -> braze's attention op (kernels/attention.py).

  Y = softmax(scale * Q K^T + mask [+ causal]) V,    scale default 1 / sqrt(head size)

Q, K, V 4-D [batch, heads, seq, head size], or 3-D [batch, seq, heads * head size]
with q_num_heads / kv_num_heads (split into heads here, merged back after). A boolean
mask is True where a key takes part: additive 0 there, -inf elsewhere; a query row with
no key left gives zeros (the spec's rule; torch gives NaN). Grouped heads (fewer kv
heads) read their kv head through a broadcast. Without past keys the causal mask is
top-left aligned (j <= i). The cases braze does not express run on onnxruntime, each
with its reason: past keys and values, the present/qk outputs, softcap, sliding
windows, unknown attributes and masks that do not broadcast to the scores.
"""

from __future__ import annotations

import math

from importers.onnx_ops import Fallback, converter
from importers.onnx_ops.context import NodeContext


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
    if cx.attr("left_window_size", -1) != -1 or cx.attr("right_window_size", -1) != -1:
        return "a sliding window"
    if any(cx.input(i) is not None for i in (4, 5, 6)):
        return "past keys and values or nonpad_kv_seqlen"
    if any(cx.wants_output(i) for i in (1, 2, 3)):
        return "present key/value or qk_matmul outputs requested"
    if cx.attr("softcap", 0.0):
        return "softcap"
    return None


@converter("Attention", 23)
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
    if q.type.rank != 4 or k.shape[:2] != v.shape[:2] or q.shape[0] != k.shape[0] or \
            q.shape[1] % k.shape[1]:
        raise Fallback(f"q {q.shape}, k {k.shape}, v {v.shape}: heads that do not group")
    k, v = _grouped(cx, k, q.shape[1]), _grouped(cx, v, q.shape[1])
    causal = bool(cx.attr("is_causal", 0))  # no past: top-left aligned (offset 0)
    from compiler.kernels import attention

    reason = attention.refusal_for(q, v, k.shape[-2])
    if reason is not None:  # onnxruntime's own Attention then runs it
        raise Fallback(f"braze's attention kernel refuses it: {reason}")
    scale = cx.attr("scale", None)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    inputs = [q, k, v]
    mask = cx.input(3)
    if mask is not None:
        if mask.dtype == "bool":
            mask = cx.op("select", mask, cx.scalar(0.0, q.dtype), cx.scalar(-math.inf, q.dtype))
        scores = q.shape[:-1] + (k.shape[-2],)
        if mask.type.rank > 4 or any(d not in (1, s) for d, s in zip(
                mask.shape[::-1], scores[::-1])):
            raise Fallback(f"mask {mask.shape} does not broadcast to the scores {scores}")
        inputs.append(mask)
    y = cx.op("attention", *inputs, scale=scale, causal=causal, empty_rows_zero=True)
    if three_d:
        b, h, s, d = y.shape
        y = cx.reshape(cx.transpose(y, (0, 2, 1, 3)), (b, s, h * d))
    return [y]
