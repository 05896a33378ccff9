"""aten convolutions and pooling -> IR ops.

  convolution        the IR's conv when the weight is a constant (frozen parameters:
                     packed kernels); a weight computed from graph inputs (F.conv2d(x, w)
                     with w an argument) is an im2col and a matmul of two run-time
                     operands (importers/runtime_conv.py, shared with ONNX); a transposed
                     one goes through importers/transposed.py or, with a run-time weight,
                     the same module. A parameter that is an input but not frozen (a
                     training step's weight: import_fx's `trainable`) stays on torch's
                     convolution
  max_pool*          the IR's max_pool; with its indices used, the maximum and its flat
                     position in each (N, C) plane (importers/pool_indices.py)
  avg_pool*          the IR's avg_pool; divisor_override d: the window sum over d, the
                     sum being the average counting padding (zeros) times the kernel size
  adaptive pools     even windows one pool, uneven ones a slice per output (_by_windows);
                     adaptive_max_pool's indices as max_pool's
  *_with_indices_backward  the output gradient added at those indices into zeros (the
                     IR's scatter with reduction add, in torch's order)

Unbatched inputs (C, spatial...) get a batch dim of 1 around the converter.
"""

from __future__ import annotations


import numpy as np
import torch

from compiler.ir import graph_inputs_of
from importers import pool_indices, runtime_conv
from importers.fx_context import Ctx, Fallback, converts
from importers.fx_nn import mean
from importers.transposed import conv_transpose_ir, lowering

aten = torch.ops.aten


def _where(cx: Ctx) -> str:
    return f"{cx.target} node {cx.name!r}"


def _expand(v, n: int, default=None) -> list:
    """An aten int-list argument (one entry for all dims, or one per dim) as n ints."""
    if isinstance(v, int):
        return [v] * n
    if not v:
        return [default] * n
    return list(v) * n if len(v) == 1 else list(v)


# -- convolution --------------------------------------------------------------

@converts(aten.convolution.default)
def _convolution(cx: Ctx, x, w, bias, stride, padding, dilation, transposed, output_padding,
                 groups):
    n = x.type.rank - 2
    strides, dilations = _expand(stride, n), _expand(dilation, n)
    pads = _expand(padding, n) * 2
    if any(v in cx.trainable for v in graph_inputs_of(w) or ()):
        raise Fallback("its weight is a parameter an optimizer may update (not frozen: "
                       "training, or an eval model before its weights held still): torch's "
                       "convolution runs it rather than an im2col over the batch")
    runtime_b = bias is not None and runtime_conv.from_inputs(bias)
    with lowering(Fallback):
        if transposed:
            return _conv_transpose(cx, x, w, bias, strides, pads, dilations,
                                   _expand(output_padding, n), groups)
        if runtime_conv.from_inputs(w):
            return runtime_conv.runtime_conv(cx, x, w, bias, groups, strides, pads,
                                             dilations, _where(cx))
        if runtime_b:  # a constant weight, a run-time bias: added after
            runtime_conv.check_bias(bias, w.shape[0])
            y = cx.op("conv", x, w, strides=strides, pads=pads, dilations=dilations,
                      group=groups)
            return runtime_conv.add_bias(cx, y, bias)
    inputs = [x, w] + ([bias] if bias is not None else [])
    return cx.op("conv", *inputs, strides=strides, pads=pads, dilations=dilations,
                 group=groups)


def _conv_transpose(cx: Ctx, x, w, bias, strides, pads, dilations, out_pad, groups):
    """importers/transposed.py lowers it onto the direct conv when the weight is a
    constant (frozen); a weight computed from graph inputs is importers/runtime_conv.py's
    im2col and matmul."""
    if runtime_conv.from_inputs(w):
        return runtime_conv.runtime_conv_transpose(cx, x, w, bias, strides, pads, dilations,
                                                   out_pad, groups, _where(cx))
    runtime_b = bias is not None and runtime_conv.from_inputs(bias)
    arrays = [v.const_value if v is not None else None for v in (w, bias)]
    if arrays[0] is None or (bias is not None and not runtime_b and arrays[1] is None):
        raise Fallback("a transposed convolution's weight computed from constants at run "
                       "time (neither a frozen parameter nor a graph input)")
    y = conv_transpose_ir(cx, x, arrays[0], None if runtime_b else arrays[1], strides, pads,
                          dilations, out_pad, groups)
    if runtime_b:
        runtime_conv.check_bias(bias, y.shape[1])
        y = runtime_conv.add_bias(cx, y, bias)
    return y


# -- pooling ------------------------------------------------------------------

def _batched(cx: Ctx, x, spatial: int):
    """(x with a batch dim of 1 if it is unbatched (C, spatial...), a function giving a
    result back its caller's rank)."""
    if x.type.rank == spatial + 2:
        return x, (lambda v: v)
    if x.type.rank != spatial + 1:
        raise Fallback(f"a {spatial}-d pool over {x.type}")
    return cx.reshape(x, (1,) + x.shape), (lambda v: cx.reshape(v, v.shape[1:]))


def _spatial_out(cx: Ctx, i: int | None, spatial: int) -> tuple:
    return tuple(cx.out(i).shape[-spatial:])


def _window(x, kernel, stride, padding, dilation, out_dims):
    """Window attrs for an IR pool; extra end padding reproduces ceil_mode's last window."""
    n = x.type.rank - 2
    kernel = _expand(kernel, n, 1)
    stride = _expand(stride, n) if stride else kernel
    padding, dilation = _expand(padding, n, 0), _expand(dilation, n, 1)
    ends = []
    for i in range(n):
        span = dilation[i] * (kernel[i] - 1) + 1
        need = (out_dims[i] - 1) * stride[i] + span - x.shape[2 + i] - padding[i]
        ends.append(max(need, padding[i]))
    return kernel, stride, padding + ends, dilation


_MAX_POOLS = {aten.max_pool2d_with_indices.default: 2, aten.max_pool3d_with_indices.default: 3,
              aten.max_pool2d.default: 2, aten.max_pool1d.default: 1}


@converts(*_MAX_POOLS)
def _max_pool(cx: Ctx, x, kernel, stride=(), padding=0, dilation=1, ceil_mode=False):
    """The IR's max_pool; with its indices used, pool_indices' chain of selects (the
    maximum and its flat position within each (N, C) plane, torch's)."""
    spatial = _MAX_POOLS[cx.target]
    with_indices = cx.target in (aten.max_pool2d_with_indices.default,
                                 aten.max_pool3d_with_indices.default)
    x, back = _batched(cx, x, spatial)
    out = _spatial_out(cx, 0 if with_indices else None, spatial)
    k, s, pads, dil = _window(x, kernel, stride, padding, dilation, out)
    if with_indices and 1 in cx.used:
        windows = [pool_indices.regular(x.shape[2 + i], out[i], k[i], s[i], pads[i], dil[i])
                   for i in range(spatial)]
        y, at = _with_indices(cx, x, windows)
        return back(y), back(at)
    y = back(cx.op("max_pool", x, kernel=k, strides=s, pads=pads, dilations=dil))
    return (y, None) if with_indices else y


def _with_indices(cx: Ctx, x, windows):
    """(max, index in its plane) as torch's CPU kernel picks them (NaN taken)."""
    with lowering(Fallback):
        return pool_indices.max_with_indices(
            cx, x, windows, pool_indices.plane_strides(x.shape[2:]), nan_wins=True)


_AVG_POOLS = {aten.avg_pool1d.default: 1, aten.avg_pool2d.default: 2,
              aten.avg_pool3d.default: 3}


@converts(*_AVG_POOLS)
def _avg_pool(cx: Ctx, x, kernel, stride=(), padding=0, ceil_mode=False,
              count_include_pad=True, divisor_override=None):
    n = _AVG_POOLS[cx.target]
    x, back = _batched(cx, x, n)
    k, s, pads, dil = _window(x, kernel, stride, padding, [1] * n, _spatial_out(cx, None, n))
    if divisor_override:
        # the window sum (the average counting every tap of the padded window, zeros
        # included, times the kernel's size) over the divisor
        y = cx.op("avg_pool", x, kernel=k, strides=s, pads=pads, dilations=dil,
                  count_include_pad=True)
        return back(cx.op("mul", y, cx.scalar(float(np.prod(k)) / divisor_override,
                                              y.dtype)))
    declared = pads[:n]
    if count_include_pad:
        # torch divides by the part of the window inside the declared padding, never by
        # ceil_mode's overhang past it: pad explicitly, then average over what lies inside
        # the padded input (with no padding and no overhang both counts are the kernel's)
        if any(declared):
            x = cx.op("pad", x, pads=[0, 0] + declared + [0, 0] + declared, mode="constant")
            pads = [0] * n + [e - p for e, p in zip(pads[n:], declared)]
        count_include_pad = False
    return back(cx.op("avg_pool", x, kernel=k, strides=s, pads=pads, dilations=dil,
                      count_include_pad=count_include_pad))


_ADAPTIVE_AVG = {aten._adaptive_avg_pool2d.default: 2, aten.adaptive_avg_pool1d.default: 1,
                 aten._adaptive_avg_pool3d.default: 3}


@converts(*_ADAPTIVE_AVG)
def _adaptive_avg_pool(cx: Ctx, x, output_size):
    """Even windows: one avg_pool. Uneven ones (8 -> 5: windows of 2 and 3 that
    overlap): per uneven dim, the mean over a slice for each output (`_by_windows`)."""
    spatial = _ADAPTIVE_AVG[cx.target]
    x, back = _batched(cx, x, spatial)
    dims = x.shape[2:]
    out = _spatial_out(cx, None, spatial)
    if all(o == 1 for o in out):
        return back(mean(cx, x, tuple(range(2, x.type.rank))))
    if any(o == 0 for o in out) or not x.type.static:
        raise Fallback(f"adaptive pooling {tuple(dims)} -> {tuple(out)}")
    if all(i % o == 0 for i, o in zip(dims, out)):
        k = [i // o for i, o in zip(dims, out)]
        return back(cx.op("avg_pool", x, kernel=k, strides=k, pads=[0] * 2 * len(k),
                          dilations=[1] * len(k)))
    return back(_by_windows(cx, x, out, lambda part, d: mean(cx, part, (d,))))


_ADAPTIVE_MAX = {aten.adaptive_max_pool2d.default: 2, aten.adaptive_max_pool3d.default: 3}


@converts(*_ADAPTIVE_MAX)
def _adaptive_max_pool(cx: Ctx, x, output_size):
    """The max over a slice for each output, dim by dim (`_by_windows`); with its indices
    used, pool_indices' chain over torch's adaptive windows."""
    spatial = _ADAPTIVE_MAX[cx.target]
    x, back = _batched(cx, x, spatial)
    out = _spatial_out(cx, 0, spatial)
    if not x.type.static or any(o == 0 for o in out) or any(i == 0 for i in x.shape[2:]):
        raise Fallback(f"adaptive max pooling {x.type} -> {tuple(out)}")
    if 1 in cx.used:
        windows = [pool_indices.adaptive(i, o) for i, o in zip(x.shape[2:], out)]
        y, at = _with_indices(cx, x, windows)
        return back(y), back(at)
    return back(_by_windows(cx, x, out, lambda part, d: cx.op("reduce_max", part, axes=(d,),
                                                              keepdims=True))), None


def _by_windows(cx: Ctx, x, out, pool):
    """Adaptive pooling as separable passes: for each spatial dim whose size changes, a
    slice for each of its outputs' windows ([floor(k I / O), ceil((k + 1) I / O)),
    torch's), pooled along that dim by `pool(part, dim)` and concatenated: O slices a
    dim, for the small outputs of classifier heads and pyramid pooling. (An averaging
    matrix would be one GEMM, but its zeros times an inf or NaN outside a window make
    NaN there.)"""
    for d, o in enumerate(out, start=2):
        i = x.shape[d]
        if i == o:
            continue
        parts = []
        for k in range(o):
            lo, hi = k * i // o, -(-(k + 1) * i // o)
            starts, sizes = [0] * x.type.rank, list(x.shape)
            starts[d], sizes[d] = lo, hi - lo
            parts.append(pool(cx.op("slice", x, starts=tuple(starts),
                                    steps=(1,) * x.type.rank, sizes=tuple(sizes)), d))
        x = parts[0] if len(parts) == 1 else cx.op("concat", *parts, axis=d)
    return x


@converts(aten.max_pool2d_with_indices_backward.default,
          aten.max_pool3d_with_indices_backward.default)
def _max_pool_backward(cx: Ctx, grad, x, kernel, stride, padding, dilation, ceil_mode,
                       indices):
    """grad_input: zeros shaped as x with each output's gradient added at its index in
    its (N, C) plane (the IR's scatter, reduction add, in row-major order as torch's CPU
    kernel adds them)."""
    from importers.scatter import flat_scatter

    out = cx.out()
    if not grad.type.static or not x.type.static or grad.shape != indices.shape:
        raise Fallback(f"max pooling's backward over {grad.type} and {indices.type}")
    spatial = 2 if cx.target is aten.max_pool2d_with_indices_backward.default else 3
    plane = int(np.prod(x.shape[-spatial:]))
    planes = int(np.prod(x.shape[:-spatial]))
    offsets = (np.arange(planes, dtype=np.int64) * plane).reshape(
        tuple(grad.shape[:-spatial]) + (1,) * spatial)
    flat = cx.op("add", cx.cast(indices, "i64"), cx.const(offsets))
    zeros = cx.op("broadcast", cx.scalar(0, out.dtype), shape=tuple(out.shape))
    return cx.reshape(flat_scatter(cx, zeros, flat, cx.cast(grad, out.dtype), "add"),
                      out.shape)
