"""Contractions, pooling and softmax: MatMul, Gemm, Conv/ConvTranspose (a run-time
weight: importers/runtime_conv.py), MaxPool (its Indices: importers/pool_indices.py),
MaxUnpool, AveragePool, LpPool, GlobalAveragePool/GlobalMaxPool, Softmax/LogSoftmax.

Softmax is decomposed the numerically stable way, as XLA does with
tf.nn.softmax: m = max(x), e = exp(x - m), y = e / sum(e) (LogSoftmax:
(x - m) - log(sum(e))). Before opset 13 the input is coerced to 2-D at `axis`,
so the reductions run over every axis from `axis` on; from 13 over one axis.

auto_pad SAME_UPPER / SAME_LOWER give out = ceil(in / stride) and split the
total padding with the extra element at the end (UPPER) or the start (LOWER).
ceil_mode grows the end padding until the floor formula yields the ceil size.
"""

from __future__ import annotations

import math

import numpy as np

from compiler.errors import InvalidModelError
from compiler.ops.contraction import window_out_dims
from compiler.passes.windows import count_ratio
from importers import runtime_conv
from importers.onnx_ops import Fallback, converter
from importers.onnx_ops.context import NodeContext
from importers.transposed import conv_transpose_ir, lowering

# -- softmax ----------------------------------------------------------------


def _softmax_axes(cx: NodeContext) -> list[int]:
    rank = cx.x.type.rank
    if cx.version < 13:
        return list(range(cx.axis(cx.attr("axis", 1), rank), rank))
    return [cx.axis(cx.attr("axis", -1), rank)]


def _shifted_exp(cx: NodeContext):
    """(x - max(x), exp(x - max(x)), sum of the exps) over the softmax axes."""
    axes = _softmax_axes(cx)
    shifted = cx.op("sub", cx.x, cx.reduce("max", cx.x, axes))
    e = cx.op("exp", shifted)
    return shifted, e, cx.reduce("sum", e, axes)


@converter("Softmax", 1)
def convert_softmax(cx: NodeContext):
    _, e, total = _shifted_exp(cx)
    return [cx.op("div", e, total)]


@converter("LogSoftmax", 1)
def convert_log_softmax(cx: NodeContext):
    shifted, _, total = _shifted_exp(cx)
    return [cx.op("sub", shifted, cx.op("log", total))]


# -- matmul and gemm ----------------------------------------------------------


def matmul(cx: NodeContext, a, b):
    """numpy matmul semantics, rank-1 operands included (reshaped around the IR op)."""
    if a.type.rank == 0 or b.type.rank == 0:
        raise Fallback("MatMul of a scalar")
    a2 = cx.reshape(a, (1,) + a.shape) if a.type.rank == 1 else a
    b2 = cx.reshape(b, b.shape + (1,)) if b.type.rank == 1 else b
    y = cx.op("matmul", a2, b2)
    shape = y.shape
    if b.type.rank == 1:
        shape = shape[:-1]
    if a.type.rank == 1:
        shape = shape[:-2] + shape[-1:] if b.type.rank > 1 else shape[:-1]
    return cx.reshape(y, shape)


@converter("MatMul", 1)
def convert_matmul(cx: NodeContext):
    return [matmul(cx, cx.inputs[0], cx.inputs[1])]


@converter("Gemm", 7)
def convert_gemm(cx: NodeContext):
    """alpha * A' @ B' + beta * C, A' and B' optionally transposed."""
    a, b, c = cx.input(0), cx.input(1), cx.input(2)
    if a.type.rank != 2 or b.type.rank != 2:
        raise InvalidModelError(f"{cx.describe}: A {a.shape} and B {b.shape} must be matrices")
    if cx.attr("transA", 0):
        a = cx.transpose(a, (1, 0))
    if cx.attr("transB", 0):
        b = cx.transpose(b, (1, 0))
    if a.shape[1] != b.shape[0]:
        raise InvalidModelError(f"{cx.describe}: A' {a.shape} and B' {b.shape} are not "
                                f"matrices that multiply")
    m, n = a.shape[0], b.shape[1]
    if c is not None and (c.type.rank > 2 or any(
            d not in (1, want) for d, want in zip(c.shape[::-1], (n, m)))):
        raise InvalidModelError(f"{cx.describe}: C {c.shape} does not broadcast to {(m, n)}")
    y = cx.op("matmul", a, b)
    alpha, beta = cx.attr("alpha", 1.0), cx.attr("beta", 1.0)
    if alpha != 1.0:
        y = cx.op("mul", y, cx.scalar(alpha, y.dtype))
    if c is not None and beta != 0.0:
        if beta != 1.0:
            c = cx.op("mul", c, cx.scalar(beta, c.dtype))
        y = cx.op("add", y, c)
    return [y]


# -- windows: conv and pooling ------------------------------------------------


def _auto_pads(cx: NodeContext, in_dims, kernel, strides, dilations) -> list[int]:
    """Explicit begin..end pads from auto_pad (or the pads attribute)."""
    n = len(in_dims)
    mode = cx.attr("auto_pad", "NOTSET")
    if mode in ("NOTSET", ""):
        return list(cx.attr("pads", [0] * (2 * n)))
    if mode == "VALID":
        return [0] * (2 * n)
    if mode not in ("SAME_UPPER", "SAME_LOWER"):
        raise Fallback(f"unknown auto_pad {mode!r}")
    begin, end = [], []
    for i in range(n):
        out = -(-in_dims[i] // strides[i])
        total = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - in_dims[i])
        small, big = total // 2, total - total // 2
        begin.append(small if mode == "SAME_UPPER" else big)
        end.append(big if mode == "SAME_UPPER" else small)
    return begin + end


def _window_attrs(cx: NodeContext, in_dims, kernel) -> dict:
    n = len(in_dims)
    strides = list(cx.attr("strides", [1] * n))
    dilations = list(cx.attr("dilations", [1] * n))
    pads = _auto_pads(cx, in_dims, kernel, strides, dilations)
    if cx.attr("ceil_mode", 0):
        pads = _ceil_pads(in_dims, kernel, strides, dilations, pads)
    return {"strides": tuple(strides), "pads": tuple(pads), "dilations": tuple(dilations)}


def _ceil_pads(in_dims, kernel, strides, dilations, pads) -> list[int]:
    """Grow end pads so floor division gives the ceil_mode output size.

    As ONNX Runtime does, a last window that would start inside the end padding
    is dropped.
    """
    n = len(in_dims)
    pads = list(pads)
    for i in range(n):
        span = dilations[i] * (kernel[i] - 1) + 1
        padded = in_dims[i] + pads[i] + pads[i + n]
        out = math.ceil((padded - span) / strides[i]) + 1
        if (out - 1) * strides[i] >= in_dims[i] + pads[i]:
            out -= 1
        pads[i + n] += max(0, (out - 1) * strides[i] + span - padded)
    return pads


@converter("Conv", 1)
def convert_conv(cx: NodeContext):
    """The IR's conv (compiled on kernels that pack its constant weight at compile time);
    a weight computed from graph inputs is an im2col and a matmul
    (importers/runtime_conv.py)."""
    x, w, b = cx.input(0), cx.input(1), cx.input(2)
    kernel = list(cx.attr("kernel_shape", w.shape[2:]))
    if tuple(kernel) != tuple(w.shape[2:]):
        raise Fallback(f"kernel_shape {kernel} differs from the weight's {w.shape[2:]}")
    attrs = _window_attrs(cx, x.shape[2:], kernel)
    group = cx.attr("group", 1)
    with lowering(Fallback):
        if runtime_conv.from_inputs(w):
            return [runtime_conv.runtime_conv(cx, x, w, b, group, where=cx.describe,
                                              **attrs)]
        if b is not None and runtime_conv.from_inputs(b):  # a run-time bias: added after
            runtime_conv.check_bias(b, w.shape[0])
            return [runtime_conv.add_bias(cx, cx.op("conv", x, w, group=group, **attrs), b)]
    inputs = [x, w] + ([b] if b is not None else [])
    return [cx.op("conv", *inputs, group=group, **attrs)]


@converter("ConvTranspose", 1)
def convert_conv_transpose(cx: NodeContext):
    """importers/transposed.py lowers it onto the direct conv; a weight computed from
    graph inputs is an im2col and a matmul (importers/runtime_conv.py)."""
    x = cx.x
    wv, bv = cx.input(1), cx.input(2)
    runtime_w = runtime_conv.from_inputs(wv)
    runtime_b = bv is not None and runtime_conv.from_inputs(bv)
    w = wv if runtime_w else cx.const_input(1, "weight")
    b = bv if runtime_w or runtime_b else cx.const_input(2, "bias")
    n = x.type.rank - 2
    kernel = list(cx.attr("kernel_shape", w.shape[2:]))
    if tuple(kernel) != tuple(w.shape[2:]):
        raise Fallback(f"kernel_shape {kernel} differs from the weight's {w.shape[2:]}")
    strides = list(cx.attr("strides", [1] * n))
    dilations = list(cx.attr("dilations", [1] * n))
    out_pad = list(cx.attr("output_padding", [0] * n))
    pads = _transposed_pads(cx, x.shape[2:], kernel, strides, dilations, out_pad)
    group = cx.attr("group", 1)
    with lowering(Fallback):
        if runtime_w:
            return [runtime_conv.runtime_conv_transpose(
                cx, x, w, b, strides, pads, dilations, out_pad, group, cx.describe)]
        y = conv_transpose_ir(cx, x, w, None if runtime_b else b, strides, pads, dilations,
                              out_pad, group)
        if runtime_b:
            runtime_conv.check_bias(b, y.shape[1])
            y = runtime_conv.add_bias(cx, y, b)
    return [y]


def _transposed_pads(cx: NodeContext, in_dims, kernel, strides, dilations, out_pad) -> list:
    """ConvTranspose's begin..end pads: given, or from output_shape / auto_pad (ONNX's
    formulas: the total padding split with the odd one at the end for SAME_UPPER)."""
    n = len(in_dims)
    mode = cx.attr("auto_pad", "NOTSET")
    shape = cx.attr("output_shape")
    if shape is None and mode not in ("SAME_UPPER", "SAME_LOWER"):
        return [0] * (2 * n) if mode == "VALID" else list(cx.attr("pads", [0] * (2 * n)))
    shape = list(shape)[-n:] if shape is not None else [d * s for d, s in zip(in_dims, strides)]
    begin, end = [], []
    for i in range(n):
        total = strides[i] * (in_dims[i] - 1) + out_pad[i] + (kernel[i] - 1) * dilations[i] \
            + 1 - shape[i]
        small, big = total // 2, total - total // 2
        begin.append(small if mode == "SAME_UPPER" else big)
        end.append(big if mode == "SAME_UPPER" else small)
    return begin + end


@converter("MaxPool", 1)
def convert_max_pool(cx: NodeContext):
    """The IR's max_pool; integers of up to 16 bits pooled as float32 (exact; the pool
    kernels are float); with the Indices output wanted, importers/pool_indices.py."""
    x = cx.x
    kernel = list(cx.attr("kernel_shape"))
    attrs = _window_attrs(cx, x.shape[2:], kernel)
    if cx.wants_output(1):
        return list(_max_pool_with_indices(cx, kernel, attrs))
    if x.dtype in _POOLED_AS_F32:
        y = cx.op("max_pool", cx.cast(x, "f32"), kernel=tuple(kernel), **attrs)
        return [cx.cast(y, x.dtype)]
    return [cx.op("max_pool", x, kernel=tuple(kernel), **attrs)]


# Integer dtypes float32 holds exactly, whose max pooling runs on the float kernels.
_POOLED_AS_F32 = ("u8", "i8", "u16", "i16")


def _max_pool_with_indices(cx: NodeContext, kernel, attrs: dict):
    """(Y, Indices): the indices flat over the whole N, C, spatial tensor, the spatial
    dims row-major (storage_order 0) or column-major (1), as onnxruntime computes them
    (strictly greater: the first maximum; its NaN is not taken)."""
    from importers import pool_indices

    x = cx.x
    n = x.type.rank - 2
    dims = x.shape[2:]
    out = window_out_dims(dims, kernel, attrs["strides"], attrs["pads"], attrs["dilations"],
                          cx.describe)
    windows = [pool_indices.regular(dims[i], out[i], kernel[i], attrs["strides"][i],
                                    attrs["pads"][i], attrs["dilations"][i])
               for i in range(n)]
    strides = pool_indices.plane_strides(dims, column_major=bool(cx.attr("storage_order", 0)))
    with lowering(Fallback):
        y, at = pool_indices.max_with_indices(cx, x, windows, strides, nan_wins=False)
    plane = math.prod(dims)
    planes = np.arange(x.shape[0] * x.shape[1], dtype=np.int64) * plane
    at = cx.op("add", at, cx.const(planes.reshape(tuple(x.shape[:2]) + (1,) * n)))
    return y, at


@converter("MaxUnpool", 9)
def convert_max_unpool(cx: NodeContext):
    """Zeros of the output shape (given, or (in - 1) * stride + kernel - pads per spatial
    dim) with Y.flat[I] = X: the IR's scatter at the flat positions I (an index out of
    range is reported at run time)."""
    from importers.scatter import flat_scatter

    x, idx = cx.x, cx.input(1)
    n = x.type.rank - 2
    kernel = list(cx.attr("kernel_shape"))
    strides = list(cx.attr("strides", [1] * n))
    pads = list(cx.attr("pads", [0] * (2 * n)))
    shape = cx.ints_input(2, "output_shape")
    if shape is None:
        shape = list(x.shape[:2]) + [(x.shape[2 + i] - 1) * strides[i] + kernel[i] - pads[i]
                                     - pads[n + i] for i in range(n)]
    if not x.type.static or tuple(idx.shape) != tuple(x.shape) or len(shape) != n + 2:
        raise Fallback(f"MaxUnpool of {x.type} at {idx.type} into {shape}")
    zeros = cx.op("broadcast", cx.scalar(0, x.dtype), shape=tuple(shape))
    return [flat_scatter(cx, zeros, cx.cast(idx, "i64"), x)]


@converter("AveragePool", 1)
def convert_avg_pool(cx: NodeContext):
    kernel = list(cx.attr("kernel_shape"))
    include_pad = bool(cx.attr("count_include_pad", 0))
    attrs = _window_attrs(cx, cx.x.shape[2:], kernel)
    if include_pad and cx.attr("ceil_mode", 0):
        return [_ceil_average_counting_pads(cx, kernel, attrs)]
    return [cx.op("avg_pool", cx.x, kernel=tuple(kernel), count_include_pad=include_pad,
                  **attrs)]


def _ceil_average_counting_pads(cx: NodeContext, kernel, attrs: dict):
    """AveragePool with ceil_mode and count_include_pad: the divisor counts the declared
    pads but not the end padding ceil_mode adds (ONNX's reference, onnxruntime). As the
    average over whole windows (count_include_pad over the grown pads: a divisor of the
    kernel's size everywhere) times, per output position, (kernel size) / (its elements
    in the image or the declared pads): both known here, per dim, and multiply."""
    in_dims = cx.x.shape[2:]
    declared = _auto_pads(cx, in_dims, kernel, attrs["strides"], attrs["dilations"])
    pooled = cx.op("avg_pool", cx.x, kernel=tuple(kernel), count_include_pad=True, **attrs)
    return cx.op("mul", pooled, cx.const(count_ratio(in_dims, pooled.shape[2:], kernel, attrs,
                                                     declared)))


@converter("LpPool", 2)
def convert_lp_pool(cx: NodeContext):
    """(sum over the window of |x|^p)^(1/p): the window sum is an average counting the
    pads (zeros, as here) times the kernel's size; with ceil_mode, windows running past
    the end padding are averaged over the kernel's size too (avg_pool with
    count_include_pad over the grown pads), so that product is the sum everywhere."""
    x = cx.x
    kernel = list(cx.attr("kernel_shape"))
    p = cx.attr("p", 2)
    if x.dtype not in ("f32", "f64") or p <= 0:
        raise Fallback(f"LpPool with p={p} over {x.type}")
    attrs = _window_attrs(cx, x.shape[2:], kernel)
    powered = cx.op("mul", x, x) if p == 2 else cx.op("abs", x) if p == 1 else \
        cx.op("pow", cx.op("abs", x), cx.scalar(p, x.dtype))
    pooled = cx.op("avg_pool", powered, kernel=tuple(kernel), count_include_pad=True, **attrs)
    total = cx.op("mul", pooled, cx.scalar(math.prod(kernel), x.dtype))
    if p == 1:
        return [total]
    if p == 2:
        return [cx.op("sqrt", total)]
    return [cx.op("pow", total, cx.scalar(1.0 / p, x.dtype))]


@converter("GlobalAveragePool", 1)
def convert_global_avg_pool(cx: NodeContext):
    return [cx.mean(cx.x, range(2, cx.x.type.rank))]


@converter("GlobalMaxPool", 1)
def convert_global_max_pool(cx: NodeContext):
    return [cx.reduce("max", cx.x, range(2, cx.x.type.rank))]
