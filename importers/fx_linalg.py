"""aten converters for matrix products with a bias, distances and bilinear forms: addbmm,
addmv, _cdist_forward (torch.cdist), _pdist_forward (torch.pdist), dist and _trilinear (F.bilinear).

  addbmm(input, A, B) = beta * input + alpha * sum_b sum_k A[b, :, k] B[b, k, :]
added one outer product after another onto beta * input: the order of torch's loop
of addmm, whose BLAS accumulates onto the output (on the small products measured,
eager's result bit for bit). Summed otherwise (one matmul over b and k, or per-batch
products added to the bias) the result is off by more than float32's tolerance where
terms cancel. That is four IR ops a term; past ADDBMM_CHAIN terms (b * k) a batched
matmul gives the per-batch products, summed after the bias by one reduce_sum (another
rounding).
  addmv(input, M, v)  = beta * input + alpha * (M @ v)   (v as an (m, 1) matrix)
beta = 0 drops input altogether (its NaN and infinities too), as torch does.

_cdist_forward(x1, x2, p, compute_mode): out[..., i, j] = ||x1[..., i, :] - x2[..., j, :]||_p
over the difference d of every pair (batch dims broadcast):
  p = 0: sum min(ceil(|d|), 1)  (the count of d != 0, as torch's kernel writes it)
  p = 1: sum |d|;  p = 2: sqrt(sum d^2);  p = inf: max |d|;  else (sum |d|^p)^(1/p)
For p = 2 torch uses matrix products instead where compute_mode asks for them (1,
"use_mm_for_euclid_dist"), or by default (None or 0) where either side has more than
25 rows (EUCLID_MM_ROWS):
  out = sqrt(max([-2 x1, |x1|^2, 1] @ [x2, 1, |x2|^2]^T, 0))
braze takes the same branch, so its rounding follows torch's.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from compiler import dtypes
from importers.fx_context import Ctx, Fallback, converts

aten = torch.ops.aten

# The most outer-product terms (batch * k) addbmm adds one by one in eager's order
# (four IR ops each); beyond it one batched matmul computes them (module doc).
ADDBMM_CHAIN = 64

# torch's default compute_mode takes the matrix-product path for p = 2 above this many
# rows on either side (aten/src/ATen/native/Distance.cpp).
EUCLID_MM_ROWS = 25


def _scaled_bias(cx: Ctx, bias, beta):
    """beta * bias in the output's dtype and shape, or None where beta = 0."""
    out = cx.out()
    if out.dtype == "bool":
        raise Fallback("a matrix product of bools")
    if beta == 0:
        return None
    bias = cx.cast(bias, out.dtype)
    if beta != 1:
        bias = cx.op("mul", bias, cx.scalar(beta, out.dtype))
    if tuple(bias.shape) != tuple(out.shape):
        bias = cx.op("broadcast", bias, shape=out.shape)
    return bias


def _product(cx: Ctx, a, b, alpha, shape):
    """alpha * (a @ b) in the output's dtype (zeros of `shape` where the contraction is
    empty)."""
    dt = cx.out().dtype
    if a.shape[-1] == 0:
        return cx.const(np.zeros(shape, dtypes.to_numpy(dt)))
    prod = cx.cast(cx.op("matmul", a, b), dt)
    return prod if alpha == 1 else cx.op("mul", prod, cx.scalar(alpha, dt))


@converts(aten.addbmm.default)
def _addbmm(cx: Ctx, bias, a, b, *, beta=1, alpha=1):
    """beta * input, then the products added in torch's order (module doc)."""
    out = cx.out()
    first = _scaled_bias(cx, bias, beta)
    nb, n, k = a.shape
    p = b.shape[2]
    if nb * k == 0:
        return first if first is not None else cx.const(
            np.zeros(out.shape, dtypes.to_numpy(out.dtype)))
    if nb * k > ADDBMM_CHAIN:
        prods = _product(cx, a, b, alpha, (nb, n, p))
        if first is not None:
            prods = cx.op("concat", cx.reshape(first, (1, n, p)), prods, axis=0)
        return cx.op("reduce_sum", prods, axes=(0,), keepdims=False)
    cols = cx.reshape(cx.op("transpose", cx.cast(a, out.dtype), perm=(0, 2, 1)),
                      (nb * k, n, 1))
    rows = cx.reshape(cx.cast(b, out.dtype), (nb * k, 1, p))
    y = first
    for t in range(nb * k):
        at = cx.const(np.int64(t))
        term = cx.op("mul", cx.op("gather", cols, at, axis=0), cx.op("gather", rows, at, axis=0))
        if alpha != 1:
            term = cx.op("mul", term, cx.scalar(alpha, out.dtype))
        y = term if y is None else cx.op("add", y, term)
    return y if tuple(y.shape) == tuple(out.shape) else cx.op("broadcast", y, shape=out.shape)


@converts(aten.addmv.default)
def _addmv(cx: Ctx, bias, mat, vec, *, beta=1, alpha=1):
    """The matrix-vector product as a matmul with an (m, 1) matrix."""
    n, m = mat.shape
    prod = cx.reshape(_product(cx, mat, cx.reshape(vec, (m, 1)), alpha, (n, 1)), (n,))
    first = _scaled_bias(cx, bias, beta)
    return prod if first is None else cx.op("add", first, prod)


@converts(aten._cdist_forward.default)
def _cdist(cx: Ctx, x1, x2, p, compute_mode=None):
    """Pairwise p-norm distances (module doc)."""
    out = cx.out()
    if out.dtype not in dtypes.FLOATS:
        raise Fallback(f"cdist of {out.dtype}")
    if p < 0 or math.isnan(p):
        raise Fallback(f"cdist with p={p} (torch raises)")
    if out.size == 0 or x1.shape[-1] == 0:
        return cx.const(np.zeros(out.shape, dtypes.to_numpy(out.dtype)))
    rows = max(x1.shape[-2], x2.shape[-2])
    mode = compute_mode or 0
    if p == 2 and (mode == 1 or (mode == 0 and rows > EUCLID_MM_ROWS)):
        return _euclid_by_products(cx, x1, x2, out)
    d = cx.op("sub", cx.reshape(x1, x1.shape[:-1] + (1, x1.shape[-1])),
              cx.reshape(x2, x2.shape[:-2] + (1,) + x2.shape[-2:]))
    y = _norm_of_last(cx, d, p)
    return y if tuple(y.shape) == tuple(out.shape) else cx.op("broadcast", y, shape=out.shape)


@converts(aten.dist.default)
def _dist(cx: Ctx, a, b, p=2):
    """torch.dist: the p-norm of a - b (broadcast) over all its elements, as torch.norm
    computes it: p = 0 counts the nonzero differences (NaN among them), p = -inf is the
    smallest |d|, other p as `_norm_of_last`."""
    out = cx.out()
    if out.dtype not in dtypes.FLOATS or not isinstance(p, (int, float)) or math.isnan(p):
        raise Fallback(f"dist of {out.dtype} with p={p!r}")
    d = cx.op("sub", a, b) if a.shape == b.shape else cx.op("sub", *_broadcast(cx, a, b))
    if d.type.size == 0:
        return cx.const(np.zeros((), dtypes.to_numpy(out.dtype)))
    flat = cx.reshape(d, (d.type.size,))
    if p == 0:
        nonzero = cx.op("cast", cx.op("ne", flat, cx.scalar(0.0, flat.dtype)), to=flat.dtype)
        return cx.op("reduce_sum", nonzero, axes=(0,), keepdims=False)
    if math.isinf(p) and p < 0:
        return cx.op("reduce_min", cx.op("abs", flat), axes=(0,), keepdims=False)
    return _norm_of_last(cx, flat, float(p))


@converts(aten._pdist_forward.default)
def _pdist(cx: Ctx, x, p=2):
    """torch.pdist: ||x[i] - x[j]||_p for i < j, row-major over the pairs (the upper
    triangle of cdist(x, x) without its diagonal): every pair's norm (`_norm_of_last`,
    torch's pdist kernel computes p = 2 directly, never by matrix products), then one
    gather of the N (N - 1) / 2 upper-triangle positions."""
    out = cx.out()
    if out.dtype not in dtypes.FLOATS or p < 0 or math.isnan(p):
        raise Fallback(f"pdist of {out.dtype} with p={p!r}")
    n, m = x.shape
    if out.size == 0:
        return cx.const(np.zeros(out.shape, dtypes.to_numpy(out.dtype)))
    if m == 0:
        return cx.const(np.zeros(out.shape, dtypes.to_numpy(out.dtype)))
    d = cx.op("sub", cx.reshape(x, (n, 1, m)), cx.reshape(x, (1, n, m)))
    pairs = cx.reshape(_norm_of_last(cx, d, float(p)), (n * n,))
    i, j = np.triu_indices(n, k=1)
    return cx.op("gather", pairs, cx.const((i * n + j).astype(np.int64)), axis=0)


def _broadcast(cx: Ctx, a, b):
    """a and b broadcast to their common shape."""
    shape = tuple(np.broadcast_shapes(a.shape, b.shape))
    return [v if v.shape == shape else cx.op("broadcast", v, shape=shape) for v in (a, b)]


def _norm_of_last(cx: Ctx, d, p: float):
    """The p-norm of d over its last dim, as torch's cdist kernel computes it."""
    axes, dt = (d.type.rank - 1,), d.dtype
    a = cx.op("abs", d)
    if p == 0:
        ones = cx.op("min", cx.op("ceil", a), cx.scalar(1.0, dt))
        return cx.op("reduce_sum", ones, axes=axes, keepdims=False)
    if p == 1:
        return cx.op("reduce_sum", a, axes=axes, keepdims=False)
    if p == 2:
        return cx.op("sqrt", cx.op("reduce_sum", cx.op("mul", d, d), axes=axes, keepdims=False))
    if math.isinf(p):
        return cx.op("reduce_max", a, axes=axes, keepdims=False)
    total = cx.op("reduce_sum", cx.op("pow", a, cx.scalar(p, dt)), axes=axes, keepdims=False)
    return cx.op("pow", total, cx.scalar(1.0 / p, dt))


def _euclid_by_products(cx: Ctx, x1, x2, out):
    """torch's _euclidean_dist: one matmul of norm-augmented rows (module doc)."""
    batch = tuple(out.shape[:-2])
    x1 = cx.op("broadcast", x1, shape=batch + tuple(x1.shape[-2:])) if batch else x1
    x2 = cx.op("broadcast", x2, shape=batch + tuple(x2.shape[-2:])) if batch else x2
    dt, last = x1.dtype, x1.type.rank - 1

    def norm(x):
        return cx.op("reduce_sum", cx.op("mul", x, x), axes=(last,), keepdims=True)

    def ones(x):
        return cx.op("broadcast", cx.scalar(1.0, dt), shape=tuple(x.shape[:-1]) + (1,))

    lhs = cx.op("concat", cx.op("mul", x1, cx.scalar(-2.0, dt)), norm(x1), ones(x1),
                axis=last)
    rhs = cx.op("concat", x2, ones(x2), norm(x2), axis=last)
    perm = tuple(range(last - 1)) + (last, last - 1)
    sq = cx.op("matmul", lhs, cx.op("transpose", rhs, perm=perm))
    return cx.op("sqrt", cx.op("max", sq, cx.scalar(0.0, dt)))


@converts(aten._trilinear.default)
def _trilinear(cx: Ctx, i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    """aten's _trilinear (F.bilinear / nn.Bilinear: x1[n, i] A[o, i, j] x2[n, j] summed
    over i and j): each operand with size-1 dims inserted at its `expand` positions,
    the three multiplied (broadcast) and summed over `sumdim`; the product and sum are
    one fused reduction, not a materialized 4-d tensor."""
    dt = cx.out().dtype
    if dt not in dtypes.FLOATS:
        raise Fallback(f"_trilinear giving {dt}")

    def unsqueezed(x, dims):
        shape = list(x.shape)
        for d in sorted(int(d) for d in dims):
            shape.insert(d, 1)
        return cx.reshape(cx.cast(x, dt), tuple(shape))

    a, b, c = unsqueezed(i1, expand1), unsqueezed(i2, expand2), unsqueezed(i3, expand3)
    prod = cx.op("mul", cx.op("mul", a, b), c)
    if sumdim:
        prod = cx.op("reduce_sum", prod, axes=tuple(sorted(int(d) for d in sumdim)),
                     keepdims=False)
    return cx.reshape(prod, tuple(cx.out().shape))
