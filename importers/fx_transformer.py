"""torch's fused transformer ops (the "fast path" of nn.MultiheadAttention and
nn.TransformerEncoderLayer in eval mode) -> braze IR, written out as torch's own
CPU implementations compute them (aten/src/ATen/native/transformers):

  _native_multi_head_attention(q_in, k_in, v_in, E, H, W_qkv, b_qkv, W_o, b_o)
    q, k, v = split(q_in, k_in, v_in @ W_qkv^T + b_qkv)  (one [E, 3E] product for
              self-attention, where the three inputs are one tensor)
    o       = attention(heads(q), heads(k), heads(v), scale = 1/sqrt(E/H))
    out     = merge_heads(o) @ W_o^T + b_o
  _transformer_encoder_layer_fwd(x, ...)   (post-norm; pre-norm with norm_first)
    x = norm1(x + mha(x)),  out = norm2(x + ffn(x)),  ffn = W2 act(W1 x + b1) + b2
    (act: exact gelu or relu); norm_first: x = x + mha(norm1(x)), out = x + ffn(norm2(x))

The attention is one `attention` node (kernels/attention.py) where the kernel takes the
shapes, else softmax(q k^T * scale) v written out. Refused (the op runs on torch):
masks (their boolean conventions differ by mask_type), attention weights that are
read (need_weights), inputs that are not [batch, tokens, E] float32.
"""

from __future__ import annotations

import torch

from importers.fx_context import Ctx, Fallback, converts
from importers.fx_elementwise import _gelu
from importers.fx_nn import layer_norm

aten = torch.ops.aten


def _linear(cx: Ctx, x, w, b):
    """x @ w^T + b for a [out, in] weight (constant weights are transposed at compile time)."""
    y = cx.op("matmul", x, cx.op("transpose", w, perm=(1, 0)))
    return y if b is None else cx.op("add", y, b)


def _check_input(x, embed_dim: int) -> None:
    if x.type.rank != 3 or x.shape[-1] != embed_dim:
        raise Fallback(f"input of shape {x.shape}: braze writes out [batch, tokens, "
                       f"{embed_dim}] only")
    if x.dtype != "f32":
        raise Fallback(f"dtype {x.dtype}: written out for float32 only")


def _heads(cx: Ctx, x, heads: int):
    """[B, T, E] -> [B, H, T, E/H]."""
    b, t, e = x.shape
    return cx.op("transpose", cx.reshape(x, (b, t, heads, e // heads)), perm=(0, 2, 1, 3))


def _projections(cx: Ctx, query, key, value, embed_dim: int, w, bias):
    """q, k, v projected by the packed [3E, E] weight (one product for self-attention)."""
    if query is key and key is value:
        qkv = _linear(cx, query, w, bias)
        size = qkv.shape[:2] + (embed_dim,)
        return [cx.op("slice", qkv, starts=(0, 0, i * embed_dim), sizes=size, steps=(1, 1, 1))
                for i in range(3)]
    out = []
    for i, x in enumerate((query, key, value)):
        wi = cx.op("slice", w, starts=(i * embed_dim, 0), sizes=(embed_dim, embed_dim),
                   steps=(1, 1))
        bi = cx.op("slice", bias, starts=(i * embed_dim,), sizes=(embed_dim,), steps=(1,))
        out.append(_linear(cx, x, wi, bi))
    return out


def _attend(cx: Ctx, q, k, v, scale: float):
    """softmax(q k^T * scale) v over [B, H, T, D]: one attention node, or written out where
    the kernel refuses the shapes."""
    from compiler.kernels import attention

    if attention.refusal_for(q, v.shape, k.shape[-2]) is None:
        return cx.op("attention", q, k, v, scale=scale, causal=False)
    s = cx.op("mul", cx.op("matmul", q, cx.op("transpose", k, perm=(0, 1, 3, 2))),
              cx.scalar(scale, q.dtype))
    z = cx.op("sub", s, cx.op("reduce_max", s, axes=(3,), keepdims=True))
    e = cx.op("exp", z)
    p = cx.op("div", e, cx.op("reduce_sum", e, axes=(3,), keepdims=True))
    return cx.op("matmul", p, v)


def multi_head_attention(cx: Ctx, query, key, value, embed_dim: int, heads: int, w_qkv, b_qkv,
                         w_o, b_o):
    """[B, T, E] attention output (torch's native MHA, no mask)."""
    for x in (query, key, value):
        _check_input(x, embed_dim)
    if embed_dim % heads:
        raise Fallback(f"embed_dim {embed_dim} is not a multiple of num_heads {heads}")
    q, k, v = (_heads(cx, x, heads) for x in _projections(cx, query, key, value, embed_dim,
                                                           w_qkv, b_qkv))
    o = _attend(cx, q, k, v, 1.0 / (embed_dim // heads) ** 0.5)
    o = cx.reshape(cx.op("transpose", o, perm=(0, 2, 1, 3)), query.shape[:2] + (embed_dim,))
    return _linear(cx, o, w_o, b_o)


@converts(aten._native_multi_head_attention.default)
def _native_mha(cx: Ctx, query, key, value, embed_dim, num_head, qkv_weight, qkv_bias,
                proj_weight, proj_bias, mask=None, need_weights=True, average_attn_weights=True,
                mask_type=None):
    if mask is not None:
        raise Fallback("a mask (its meaning depends on mask_type): torch runs it")
    weights = cx.vals[1]
    if 1 in cx.used and isinstance(weights, torch.Tensor) and weights.numel():
        raise Fallback("its attention weights are read (need_weights)")
    return multi_head_attention(cx, query, key, value, embed_dim, num_head, qkv_weight,
                                qkv_bias, proj_weight, proj_bias), None


@converts(aten._transformer_encoder_layer_fwd.default)
def _encoder_layer(cx: Ctx, src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight,
                   proj_bias, use_gelu, norm_first, eps, norm_weight_1, norm_bias_1,
                   norm_weight_2, norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2,
                   ffn_bias_2, mask=None, mask_type=None):
    if mask is not None:
        raise Fallback("a mask (its meaning depends on mask_type): torch runs it")

    def norm(x, w, b):
        return layer_norm(cx, x, 1, w, b, eps)[0]

    def mha(x):
        return multi_head_attention(cx, x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias,
                                    proj_weight, proj_bias)

    def ffn(x):
        h = _linear(cx, x, ffn_weight_1, ffn_bias_1)
        h = _gelu(cx, h) if use_gelu else cx.op("max", h, cx.scalar(0, h.dtype))
        return _linear(cx, h, ffn_weight_2, ffn_bias_2)

    _check_input(src, embed_dim)
    if norm_first:
        x = cx.op("add", src, mha(norm(src, norm_weight_1, norm_bias_1)))
        return cx.op("add", x, ffn(norm(x, norm_weight_2, norm_bias_2)))
    x = norm(cx.op("add", mha(src), src), norm_weight_1, norm_bias_1)
    return norm(cx.op("add", ffn(x), x), norm_weight_2, norm_bias_2)
