"""Contractions, pooling and softmax: MatMul, Gemm, Conv, MaxPool/AveragePool,
GlobalAveragePool/GlobalMaxPool, Softmax/LogSoftmax.

Softmax is decomposed the numerically stable way, as XLA does with
tf.nn.softmax: m = max(x), e = exp(x - m), y = e / sum(e) (LogSoftmax:
(x - m) - log(sum(e))). Before opset 13 the input is coerced to 2-D at `axis`,
so the reductions run over every axis from `axis` on; from 13 over one axis.

auto_pad SAME_UPPER / SAME_LOWER give out = ceil(in / stride) and split the
total padding with the extra element at the end (UPPER) or the start (LOWER).
ceil_mode grows the end padding until the floor formula yields the ceil size.
"""

from __future__ import annotations

import itertools
import math

from compiler.errors import InvalidModelError
from compiler.ops.contraction import window_out_dims
from compiler.passes.windows import count_ratio
from importers.onnx_ops import Fallback, converter
from importers.onnx_ops.context import NodeContext, graph_inputs_of

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
    a weight computed from graph inputs is an im2col and a matmul (`_runtime_conv`)."""
    x, w, b = cx.input(0), cx.input(1), cx.input(2)
    kernel = list(cx.attr("kernel_shape", w.shape[2:]))
    if tuple(kernel) != tuple(w.shape[2:]):
        raise Fallback(f"kernel_shape {kernel} differs from the weight's {w.shape[2:]}")
    attrs = _window_attrs(cx, x.shape[2:], kernel)
    group = cx.attr("group", 1)
    if _from_inputs(w):
        return [_runtime_conv(cx, x, w, b, group, **attrs)]
    if b is not None and _from_inputs(b):  # a constant weight, a run-time bias: added after
        _check_bias(b, w.shape[0])
        return [_add_bias(cx, cx.op("conv", x, w, group=group, **attrs), b)]
    inputs = [x, w] + ([b] if b is not None else [])
    return [cx.op("conv", *inputs, group=group, **attrs)]


@converter("ConvTranspose", 1)
def convert_conv_transpose(cx: NodeContext):
    """importers/transposed.py lowers it onto the direct conv; a weight computed from
    graph inputs is an im2col and a matmul here (`_runtime_conv_transpose`)."""
    from importers.transposed import NotLowered, conv_transpose_ir

    x = cx.x
    wv, bv = cx.input(1), cx.input(2)
    runtime_w = _from_inputs(wv)
    runtime_b = bv is not None and _from_inputs(bv)
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
    if runtime_w:
        return [_runtime_conv_transpose(cx, x, w, b, strides, pads, dilations, out_pad,
                                        group)]
    try:
        y = conv_transpose_ir(cx, x, w, None if runtime_b else b, strides, pads, dilations,
                              out_pad, group)
    except NotLowered as e:
        raise Fallback(str(e)) from None
    if runtime_b:
        _check_bias(b, y.shape[1])
        y = _add_bias(cx, y, b)
    return [y]


# -- conv and ConvTranspose with a run-time weight ------------------------------
#
# braze's conv kernels pack a constant weight at compile time. A weight computed from graph
# inputs (dynamic filters, ONNX's node tests) is instead an im2col as index arithmetic --
# pad, then one strided slice of the padded input per kernel tap (its offset the tap times
# the dilation, its steps the strides), concatenated on a tap axis -- and a matmul of two
# run-time operands (compiler/kernels/batched.py in float32, B packed per call):
#
#   y[n, g, m, p] = sum over (c, tap) of W[g, m, (c, tap)] * cols[n, g, (c, tap), p]
#
# the groups a batch dim of the matmul, p the output pixels; the result is N, C, spatial
# as it comes (no transpose), the bias added on the matmul's shape (its epilogue). The
# im2col is movement ops only, so the matmul's packing loop reads the input through them
# (no im2col buffer). ConvTranspose is the stride-1
# conv of the zero-spread, padded input with the kernel flipped (the taps read in reverse
# order) and its channels swapped within each group (importers/transposed.py's
# arithmetic), or, for non-overlapping windows, one matmul and a depth-to-space.

# Kernels with more taps than this are refused (a concat of as many slices).
RUNTIME_CONV_MAX_TAPS = 512


def _from_inputs(v) -> bool:
    """Whether `v` is computed from a graph input (a weight only made of constants, folded
    by the compiler's passes if not at import, keeps the packed kernels)."""
    return bool(graph_inputs_of(v))


def _check_bias(b, channels: int) -> None:
    if b.shape != (channels,):
        raise Fallback(f"bias {b.shape} for {channels} output channels")


def _add_bias(cx: NodeContext, y, b):
    """y (N, C, spatial...) + b (C,) along the channel axis."""
    return cx.op("add", y, cx.reshape(b, (b.shape[0],) + (1,) * (y.type.rank - 2)))


def _runtime_checks(x, w, b) -> None:
    """Fallback for what the im2col + matmul form does not express."""
    for v in (x, w) + ((b,) if b is not None else ()):
        if not v.type.static:
            raise Fallback(f"a run-time conv weight with symbolic dims ({v.type})")
    if x.dtype not in ("f32", "f64") or w.dtype != x.dtype or (b is not None
                                                                and b.dtype != x.dtype):
        raise Fallback(f"a run-time conv weight over {x.dtype} x {w.dtype}: float32 or "
                       f"float64 only")
    if x.type.rank < 3 or w.type.rank != x.type.rank:
        raise Fallback(f"input {x.shape} and weight {w.shape} ranks")
    if 0 in x.shape or 0 in w.shape:
        raise Fallback("an empty conv (input or weight with a zero dim)")
    taps = math.prod(w.shape[2:])
    if taps > RUNTIME_CONV_MAX_TAPS:
        raise Fallback(f"a run-time conv weight of {taps} taps (> RUNTIME_CONV_MAX_TAPS)")


def _im2col(cx: NodeContext, x, kernel, strides, pads, dilations, flip: bool = False):
    """(cols [N, C, taps, P], the output dims): tap t's slice of the padded input at
    offsets t * dilation (taps in reverse order if `flip`), P the output pixels."""
    n = len(kernel)
    batch, chans = x.shape[:2]
    if any(pads):
        x = cx.op("pad", x, pads=(0, 0) + tuple(pads[:n]) + (0, 0) + tuple(pads[n:]),
                  mode="constant", value=0.0)
    out = window_out_dims(x.shape[2:], kernel, strides, (0,) * (2 * n), dilations,
                          cx.describe)
    pixels = math.prod(out)
    cols = []
    for tap in itertools.product(*(range(k) for k in kernel)):
        if flip:
            tap = tuple(k - 1 - t for k, t in zip(kernel, tap))
        starts = (0, 0) + tuple(t * d for t, d in zip(tap, dilations))
        sizes = (batch, chans) + tuple(out)
        steps = (1, 1) + tuple(strides)
        piece = x
        if not (sizes == x.shape and not any(starts) and all(s == 1 for s in steps)):
            piece = cx.op("slice", x, starts=starts, steps=steps, sizes=sizes)
        cols.append(cx.reshape(piece, (batch, chans, 1, pixels)))
    return (cols[0] if len(cols) == 1 else cx.op("concat", *cols, axis=2)), tuple(out)


def _grouped_matmul(cx: NodeContext, a, cols, group: int, b):
    """a [G, M/G, K] (or [M, K] for G = 1) times cols [N, C, taps, P] with its channels in
    G groups (K = C/G * taps), plus the bias b (M,) if given: [N, M, P]. (The bias is
    added on the matmul's own shape: its epilogue.)"""
    batch, chans, taps, pixels = cols.shape
    outs = group * a.shape[-2]
    if group == 1:
        y = cx.op("matmul", a, cx.reshape(cols, (batch, chans * taps, pixels)))
    else:
        y = cx.op("matmul", a, cx.reshape(cols, (batch, group, chans // group * taps, pixels)))
    if b is not None:
        y = cx.op("add", y, cx.reshape(b, y.shape[1:-1] + (1,)))
    return cx.reshape(y, (batch, outs, pixels))


def _runtime_conv(cx: NodeContext, x, w, b, group: int, strides, pads, dilations):
    """Conv with a run-time weight W [M, C/G, K...]: im2col, then W as [G, M/G, C/G * taps]
    times the columns."""
    _runtime_checks(x, w, b)
    chans, outs = x.shape[1], w.shape[0]
    if group < 1 or chans != w.shape[1] * group or outs % group:
        raise Fallback(f"channels {chans} vs weight {w.shape}, group {group}")
    if b is not None:
        _check_bias(b, outs)
    if min(pads) < 0:
        raise Fallback(f"negative pads {pads}")
    kernel = w.shape[2:]
    cols, out = _im2col(cx, x, kernel, strides, pads, dilations)
    k = w.shape[1] * math.prod(kernel)
    a = cx.reshape(w, (outs, k) if group == 1 else (group, outs // group, k))
    return cx.reshape(_grouped_matmul(cx, a, cols, group, b), (x.shape[0], outs) + out)


def _runtime_conv_transpose(cx: NodeContext, x, w, b, strides, pads, dilations,
                            output_padding, group: int):
    """ConvTranspose with a run-time weight W [C, M/G, K...] (importers/transposed.py's
    equivalent direct conv, or its depth-to-space when windows do not overlap)."""
    from importers.transposed import NotLowered, spread_input

    _runtime_checks(x, w, b)
    n = x.type.rank - 2
    chans, outs_g = x.shape[1], w.shape[1]
    if group < 1 or w.shape[0] != chans or chans % group:
        raise Fallback(f"weight {w.shape} for {chans} channels in {group} groups")
    outs = outs_g * group
    if b is not None:
        _check_bias(b, outs)
    kernel = w.shape[2:]
    taps = math.prod(kernel)
    cg = chans // group
    if tuple(kernel) == tuple(strides) and not any(pads) and not any(output_padding) \
            and all(d == 1 for d in dilations):
        return _runtime_depth_to_space(cx, x, w, b, group)
    try:
        x, conv_pads = spread_input(cx, x, kernel, strides, pads, dilations, output_padding)
    except NotLowered as e:
        raise Fallback(str(e)) from None
    cols, out = _im2col(cx, x, kernel, (1,) * n, conv_pads, dilations, flip=True)
    # W [G, C/G, M/G, taps] -> [G, M/G, C/G, taps]: in and out channels swapped per group
    a = cx.transpose(cx.reshape(w, (group, cg, outs_g, taps)), (0, 2, 1, 3))
    a = cx.reshape(a, (outs, cg * taps) if group == 1 else (group, outs_g, cg * taps))
    return cx.reshape(_grouped_matmul(cx, a, cols, group, b), (x.shape[0], outs) + out)


def _runtime_depth_to_space(cx: NodeContext, x, w, b, group: int):
    """Non-overlapping windows (kernel = strides): each input pixel times W^T gives its
    output block's (channel, tap) values, moved to the pixels."""
    n = x.type.rank - 2
    batch, chans = x.shape[:2]
    lengths = x.shape[2:]
    kernel = w.shape[2:]
    taps = math.prod(kernel)
    cg, outs_g = chans // group, w.shape[1]
    outs = outs_g * group
    pixels = math.prod(lengths)
    # W [G, C/G, (M/G, taps)] -> [G, (M/G, taps), C/G]
    a = cx.transpose(cx.reshape(w, (group, cg, outs_g * taps)), (0, 2, 1))
    if group == 1:
        a = cx.reshape(a, (outs * taps, chans))
        z = cx.op("matmul", a, cx.reshape(x, (batch, chans, pixels)))
    else:
        z = cx.op("matmul", a, cx.reshape(x, (batch, group, cg, pixels)))
    z = cx.reshape(z, (batch, outs) + tuple(kernel) + tuple(lengths))
    if b is not None:
        z = cx.op("add", z, cx.reshape(b, (outs,) + (1,) * (2 * n)))
    perm = (0, 1) + tuple(p for i in range(n) for p in (2 + n + i, 2 + i))
    z = cx.op("transpose", z, perm=perm)
    return cx.reshape(z, (batch, outs) + tuple(l * t for l, t in zip(lengths, kernel)))


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
    if cx.wants_output(1):
        raise Fallback("MaxPool's Indices output is not expressible in braze's IR")
    if cx.attr("storage_order", 0):
        raise Fallback("MaxPool storage_order=1")
    kernel = list(cx.attr("kernel_shape"))
    attrs = _window_attrs(cx, cx.x.shape[2:], kernel)
    return [cx.op("max_pool", cx.x, kernel=tuple(kernel), **attrs)]


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
