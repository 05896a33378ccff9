"""aten reductions, matrix products and normalization -> IR ops (convolutions and
pooling: importers/fx_windows.py).

Composite ops are written out from primitives so the fuser sees them, as XLA
does with tf.nn.softmax:
  softmax(x)      = exp(x - max(x)) / sum(exp(x - max(x)))
  log_softmax(x)  = (x - max(x)) - log(sum(exp(x - max(x))))
  layer_norm(x)   = (x - mean) * rstd * w + b,  rstd = 1 / sqrt(var + eps) (biased var)
  batch_norm(x)   = the same per channel, from running (eval) or batch (train) statistics
  mean(x)         = sum(x) / count;  var(x) = sum((x - mean)^2) / (count - correction)
"""

from __future__ import annotations

import numpy as np
import torch

from compiler import dtypes
from importers.fx_context import SEEDED_CHECKED, Ctx, Fallback, converts, norm_dim, norm_dims

aten = torch.ops.aten


def _count(x, axes) -> int:
    n = 1
    for a in axes:
        n *= x.shape[a]
    return n


def reduce(cx: Ctx, op: str, x, axes, keepdim: bool):
    return x if not axes else cx.op(op, x, axes=axes, keepdims=keepdim)


def mean(cx: Ctx, x, axes, keepdim: bool = True):
    total = reduce(cx, "reduce_sum", x, axes, keepdim)
    return cx.op("div", total, cx.scalar(float(_count(x, axes)), x.dtype))


@converts(aten.sum.dim_IntList, aten.sum.default, aten.prod.dim_int, aten.prod.default,
          aten.amax.default, aten.amin.default)
def _reduce(cx: Ctx, x, dims=None, keepdim=False, dtype=None):
    op = {aten.sum: "reduce_sum", aten.prod: "reduce_prod", aten.amax: "reduce_max",
          aten.amin: "reduce_min"}[cx.target.overloadpacket]
    out = cx.out()
    if cx.target is aten.prod.dim_int:
        dims = [dims]
    x = cx.cast(x, out.dtype)
    if out.dtype == "bool":
        raise Fallback("reduction of bool")
    y = reduce(cx, op, x, norm_dims(dims, x.type.rank), keepdim)
    return cx.reshape(y, out.shape)


@converts(aten.mean.dim, aten.mean.default)
def _mean(cx: Ctx, x, dims=None, keepdim=False, dtype=None):
    out = cx.out()
    x = cx.cast(x, out.dtype)
    return cx.reshape(mean(cx, x, norm_dims(dims, x.type.rank), keepdim), out.shape)


@converts(aten.var.correction)
def _var(cx: Ctx, x, dims=None, correction=None, keepdim=False):
    return variance(cx, x, dims, correction, keepdim)[0]


@converts(aten.var_mean.correction)
def _var_mean(cx: Ctx, x, dims=None, correction=None, keepdim=False):
    var, mu = variance(cx, x, dims, correction, keepdim)
    return var, cx.reshape(mu, cx.out(1).shape)


def variance(cx: Ctx, x, dims, correction, keepdim: bool):
    """(var, mean) of x over dims (all: None) with `correction` (None: 1) subtracted
    from the count; var shaped as the node's (first) output, mean with kept dims."""
    out = cx.out(0) if isinstance(cx.vals, (tuple, list)) else cx.out()
    x = cx.cast(x, out.dtype)
    axes = norm_dims(dims, x.type.rank)
    mu = mean(cx, x, axes)
    d = cx.op("sub", x, mu)
    ss = reduce(cx, "reduce_sum", cx.op("mul", d, d), axes, keepdim)
    dof = _count(x, axes) - (1 if correction is None else correction)
    var = cx.op("div", ss, cx.scalar(float(max(dof, 0)), x.dtype))
    return cx.reshape(var, out.shape), mu


@converts(aten.any.default, aten.any.dim, aten.any.dims, aten.all.default, aten.all.dim,
          aten.all.dims)
def _any_all(cx: Ctx, x, dims=None, keepdim=False):
    op = "reduce_max" if cx.target.overloadpacket is aten.any else "reduce_min"
    truth = x if x.dtype == "bool" else cx.op("ne", x, cx.scalar(0, x.dtype))
    y = reduce(cx, op, cx.cast(truth, "u8"), norm_dims(dims, x.type.rank), keepdim)
    return cx.reshape(cx.cast(y, "bool"), cx.out().shape)


@converts(aten.argmax.default, aten.argmin.default)
def _arg(cx: Ctx, x, dim=None, keepdim=False):
    op = "argmax" if cx.target is aten.argmax.default else "argmin"
    if dim is None:
        x, dim = cx.reshape(x, (x.type.size,)), 0
    if x.type.rank == 0:
        return cx.const(0, "i64")
    y = cx.op(op, x, axis=norm_dim(dim, x.type.rank), keepdims=keepdim)
    return cx.reshape(y, cx.out().shape)


@converts(aten.max.dim, aten.min.dim)
def _max_dim(cx: Ctx, x, dim, keepdim=False):
    is_max = cx.target is aten.max.dim
    if x.type.rank == 0:
        return x, cx.const(0, "i64")
    d = norm_dim(dim, x.type.rank)
    values = cx.op("reduce_max" if is_max else "reduce_min", x, axes=(d,), keepdims=keepdim)
    index = cx.op("argmax" if is_max else "argmin", x, axis=d, keepdims=keepdim)
    return values, index


@converts(aten.max.default, aten.min.default)
def _max_all(cx: Ctx, x):
    op = "reduce_max" if cx.target is aten.max.default else "reduce_min"
    return cx.reshape(reduce(cx, op, x, tuple(range(x.type.rank)), False), ())


# -- softmax ----------------------------------------------------------------

def _shifted(cx: Ctx, x, dim):
    d = norm_dim(dim, x.type.rank)
    if x.type.rank == 0:
        return cx.op("sub", x, x), ()
    return cx.op("sub", x, cx.op("reduce_max", x, axes=(d,), keepdims=True)), (d,)


@converts(aten._softmax.default)
def _softmax(cx: Ctx, x, dim, half_to_float=False):
    x = cx.cast(x, cx.out().dtype)
    z, axes = _shifted(cx, x, dim)
    e = cx.op("exp", z)
    return cx.op("div", e, reduce(cx, "reduce_sum", e, axes, True))


@converts(aten._log_softmax.default)
def _log_softmax(cx: Ctx, x, dim, half_to_float=False):
    x = cx.cast(x, cx.out().dtype)
    z, axes = _shifted(cx, x, dim)
    return cx.op("sub", z, cx.op("log", reduce(cx, "reduce_sum", cx.op("exp", z), axes, True)))


# -- contractions -----------------------------------------------------------

@converts(aten.mm.default, aten.matmul.default)
def _mm(cx: Ctx, a, b):
    if a.type.rank < 2 or b.type.rank < 2:
        raise Fallback("matmul of a vector")
    return cx.op("matmul", a, b)


# The views aten writes around bmm when it decomposes an N-d matmul.
_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


@converts(aten.bmm.default)
def _bmm(cx: Ctx, a, b):
    """bmm of [B, M, K] and [B, K, N]. aten's decomposition of an N-d matmul merges the
    batch dims into B around it (view, bmm, view); when every reader views the result
    back as P + [M, N] (prod(P) = B), the product is computed over those batch dims P
    instead (reshapes of row-major data commute with a per-batch product), so the IR
    holds the matmul the user wrote, as the ONNX importer's does, and the passes that
    read through it (attention, compiler/passes/attention.py) see the same graph."""
    batch = _batch_dims(cx)
    if batch is None:
        return cx.op("matmul", a, b)
    a = cx.reshape(a, batch + a.shape[1:])
    b = cx.reshape(b, batch + b.shape[1:])
    return cx.reshape(cx.op("matmul", a, b), cx.out().shape)


def _batch_dims(cx: Ctx) -> tuple | None:
    """P when every reader of this [B, M, N] result views it as P + [M, N] with one
    common P of more than one dim, else None."""
    out = cx.out().shape
    shapes = {tuple(val.shape) for target, val in cx.readers
              if target in _VIEWS and isinstance(val, torch.Tensor)}
    if len(shapes) != 1 or len(cx.readers) == 0 or any(t not in _VIEWS for t, _ in cx.readers):
        return None
    (shape,) = shapes
    if (len(shape) < 4 or shape[-2:] != out[-2:] or not all(isinstance(d, int) for d in shape)
            or int(np.prod(shape[:-2])) != out[0]):
        return None
    return tuple(shape[:-2])


@converts(aten.addmm.default, aten.baddbmm.default)
def _addmm(cx: Ctx, bias, a, b, beta=1, alpha=1):
    dt = cx.out().dtype
    prod = cx.op("matmul", a, b)
    if alpha != 1:
        prod = cx.op("mul", prod, cx.scalar(alpha, dt))
    if beta == 0:
        return prod
    bias = cx.cast(bias, dt)
    if beta != 1:
        bias = cx.op("mul", bias, cx.scalar(beta, dt))
    return cx.op("add", prod, bias)


# -- normalization ----------------------------------------------------------

def _channel(cx: Ctx, v, rank: int):
    """A per-channel vector reshaped to broadcast against N, C, spatial..."""
    return cx.reshape(v, (1, v.shape[0]) + (1,) * (rank - 2))


def _affine(cx: Ctx, y, w, b, shape_fn):
    if w is not None:
        y = cx.op("mul", y, shape_fn(cx.cast(w, y.dtype)))
    if b is not None:
        y = cx.op("add", y, shape_fn(cx.cast(b, y.dtype)))
    return y


@converts(aten.native_layer_norm.default)
def _layer_norm(cx: Ctx, x, normalized_shape, w, b, eps):
    y, mu, rstd = layer_norm(cx, x, len(normalized_shape), w, b, eps)
    return y, cx.cast(mu, cx.out(1).dtype), cx.cast(rstd, cx.out(2).dtype)


def layer_norm(cx: Ctx, x, k: int, w, b, eps: float):
    """(y, mean, rstd) of layer norm over x's last k dims (w, b: None or Values)."""
    if x.dtype not in dtypes.FLOATS:
        raise Fallback(f"layer norm of {x.dtype}")
    axes = tuple(range(x.type.rank - k, x.type.rank))
    mu = mean(cx, x, axes)
    d = cx.op("sub", x, mu)
    var = mean(cx, cx.op("mul", d, d), axes)
    rstd = cx.op("reciprocal", cx.op("sqrt", cx.op("add", var, cx.scalar(eps, x.dtype))))
    return _affine(cx, cx.op("mul", d, rstd), w, b, lambda v: v), mu, rstd


@converts(aten._native_batch_norm_legit_no_training.default)
def _batch_norm_eval(cx: Ctx, x, w, b, running_mean, running_var, momentum, eps):
    shape = (lambda v: _channel(cx, v, x.type.rank))
    rm, rv = cx.cast(running_mean, x.dtype), cx.cast(running_var, x.dtype)
    rstd = cx.op("reciprocal", cx.op("sqrt", cx.op("add", rv, cx.scalar(eps, x.dtype))))
    y = cx.op("mul", cx.op("sub", x, shape(rm)), shape(rstd))
    return _affine(cx, y, w, b, shape), _empty(cx, 1), _empty(cx, 2)


def _empty(cx: Ctx, i: int):
    t = cx.out(i)
    if t.size:
        raise Fallback(f"output {i} is not empty")
    return cx.const(torch.zeros(t.shape).numpy(), t.dtype)


def _batch_statistics(cx: Ctx, x, w, b, eps: float):
    """Batch norm by x's own per-channel statistics (over every dim but 1): (y, mean,
    rstd, sum of squared deviations, count), mean and rstd shaped to broadcast."""
    rank = x.type.rank
    axes = (0,) + tuple(range(2, rank))
    mu = mean(cx, x, axes)
    d = cx.op("sub", x, mu)
    ss = reduce(cx, "reduce_sum", cx.op("mul", d, d), axes, True)
    n = _count(x, axes)
    var = cx.op("div", ss, cx.scalar(float(n), x.dtype))
    rstd = cx.op("reciprocal", cx.op("sqrt", cx.op("add", var, cx.scalar(eps, x.dtype))))
    y = _affine(cx, cx.op("mul", d, rstd), w, b, lambda v: _channel(cx, v, rank))
    return y, mu, rstd, ss, n


@converts(aten._native_batch_norm_legit_functional.default)
def _batch_norm_train(cx: Ctx, x, w, b, running_mean, running_var, training, momentum, eps):
    if not training:
        raise Fallback("functional batch norm outside training")
    y, mu, rstd, ss, n = _batch_statistics(cx, x, w, b, eps)
    flat = (lambda v: cx.reshape(v, (x.shape[1],)))
    unbiased = cx.op("div", ss, cx.scalar(float(max(n - 1, 1)), x.dtype))
    new_rm = _momentum(cx, running_mean, flat(mu), momentum)
    new_rv = _momentum(cx, running_var, flat(unbiased), momentum)
    return y, flat(mu), flat(rstd), new_rm, new_rv


@converts(aten._native_batch_norm_legit.no_stats)
def _batch_norm_no_stats(cx: Ctx, x, w, b, training, momentum, eps):
    """Batch norm with no running statistics to read or update: instance norm
    (F.instance_norm normalizes an (1, N * C, ...) view by its batch statistics:
    RAFT's encoders, style transfer, GAN generators) and BatchNorm with
    track_running_stats=False."""
    if not training:
        raise Fallback("batch norm without running statistics outside training mode")
    if x.dtype not in dtypes.FLOATS:
        raise Fallback(f"batch norm of {x.dtype}")
    y, mu, rstd, _, _ = _batch_statistics(cx, x, w, b, eps)
    return y, _statistic(cx, mu, 1), _statistic(cx, rstd, 2)


@converts(aten.native_group_norm.default)
def _group_norm(cx: Ctx, x, w, b, n: int, c: int, hw: int, group: int, eps: float):
    """GroupNorm (diffusion U-Nets, detection heads, ResNets with GN): x viewed as
    (N, group, C / group * spatial), each row normalized by its own mean and variance,
    then the per-channel affine. Outputs (y, mean, rstd), the statistics (N, group)."""
    if x.dtype not in dtypes.FLOATS:
        raise Fallback(f"group norm of {x.dtype}")
    if group <= 0 or c % group or x.type.size != n * c * hw:
        raise Fallback(f"group norm of {tuple(x.shape)} in {group} groups")
    rows = cx.reshape(x, (n, group, (c // group) * hw))
    y, mu, rstd = layer_norm(cx, rows, 1, None, None, eps)
    y = _affine(cx, cx.reshape(y, tuple(x.shape)), w, b,
                lambda v: _channel(cx, v, x.type.rank))
    return y, _statistic(cx, mu, 1), _statistic(cx, rstd, 2)


def _statistic(cx: Ctx, v, i: int):
    """A normalization's mean or rstd as the node's output i (its shape and dtype)."""
    out = cx.out(i)
    return cx.cast(cx.reshape(v, out.shape), out.dtype)


def _momentum(cx: Ctx, running, batch, momentum: float):
    dt = running.dtype
    keep = cx.op("mul", running, cx.scalar(1.0 - momentum, dt))
    return cx.op("add", keep, cx.op("mul", cx.cast(batch, dt), cx.scalar(momentum, dt)))


# -- attention --------------------------------------------------------------

@converts(aten._scaled_dot_product_flash_attention_for_cpu.default)
def _sdpa(cx: Ctx, q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    """torch's SDPA (what dynamo's decompositions leave on CPU) -> one attention node; a
    boolean mask becomes additive (0 where kept, -inf elsewhere). Its logsumexp output
    is for the backward only: used, the op runs on torch."""
    from compiler.kernels import attention

    if 1 in cx.used:
        raise Fallback("its logsumexp output is used (the backward of attention)")
    if dropout_p:
        raise Fallback(f"dropout_p={dropout_p}: random")
    reason = attention.refusal_for(q, v.shape, k.shape[-2])
    if reason is not None:
        raise Fallback(f"braze's attention kernel refuses it: {reason}")
    inputs = [q, k, v]
    if attn_mask is not None:
        if attn_mask.dtype == "bool":
            attn_mask = cx.op("select", attn_mask, cx.scalar(0.0, q.dtype),
                              cx.scalar(float("-inf"), q.dtype))
        inputs.append(attn_mask)
    if scale is None:
        scale = 1.0 / q.shape[-1] ** 0.5
    y = cx.op("attention", *inputs, scale=scale, causal=bool(is_causal))
    return (y, None)


SEEDED_CHECKED.add(aten._scaled_dot_product_flash_attention_for_cpu.default)
