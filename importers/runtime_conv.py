"""Conv and transposed conv whose weight is a run-time value, shared by both importers
(ONNX Conv / ConvTranspose with a weight computed from graph inputs; torch's
F.conv*d / conv_transpose*d with a weight that is not a frozen parameter).

braze's conv kernels pack a constant weight at compile time. A weight computed from graph
inputs (dynamic filters, conformance suites) is instead an im2col as index arithmetic --
pad, then one strided slice of the padded input per kernel tap (its offset the tap times
the dilation, its steps the strides), concatenated on a tap axis -- and a matmul of two
run-time operands (compiler/kernels/batched.py in float32, B packed per call):

  y[n, g, m, p] = sum over (c, tap) of W[g, m, (c, tap)] * cols[n, g, (c, tap), p]

the groups a batch dim of the matmul, p the output pixels; the result is N, C, spatial
as it comes (no transpose), the bias added on the matmul's shape (its epilogue). The
im2col is movement ops only, so the matmul's packing loop reads the input through them
(no im2col buffer). The transposed conv is the stride-1 conv of the zero-spread, padded
input with the kernel flipped (the taps read in reverse order) and its channels swapped
within each group (importers/transposed.py's arithmetic), or, for non-overlapping
windows, one matmul and a depth-to-space.

`cx` is either importer's converter context (op, reshape); `pads` are begin..., end...
as ONNX orders them. What these forms do not express raises transposed.NotLowered with
the reason, which each importer turns into its host fallback.
"""

from __future__ import annotations

import itertools
import math

from compiler.ir import graph_inputs_of
from compiler.ops.contraction import window_out_dims
from importers.transposed import NotLowered, spread_input

# Kernels with more taps than this are refused (a concat of as many slices).
RUNTIME_CONV_MAX_TAPS = 512


def from_inputs(v) -> bool:
    """Whether `v` is computed from a graph input (a weight only made of constants, folded
    by the compiler's passes if not at import, keeps the packed kernels)."""
    return bool(graph_inputs_of(v))


def check_bias(b, channels: int) -> None:
    if b.shape != (channels,):
        raise NotLowered(f"bias {b.shape} for {channels} output channels")


def add_bias(cx, y, b):
    """y (N, C, spatial...) + b (C,) along the channel axis."""
    return cx.op("add", y, cx.reshape(b, (b.shape[0],) + (1,) * (y.type.rank - 2)))


def _checks(x, w, b) -> None:
    """NotLowered for what the im2col + matmul form does not express."""
    for v in (x, w) + ((b,) if b is not None else ()):
        if not v.type.static:
            raise NotLowered(f"a run-time conv weight with symbolic dims ({v.type})")
    # (f16: the matmul and slices are computed as f32 by compiler/passes/widen.py)
    if x.dtype not in ("f16", "f32", "f64") or w.dtype != x.dtype or (b is not None
                                                                and b.dtype != x.dtype):
        raise NotLowered(f"a run-time conv weight over {x.dtype} x {w.dtype}: one float "
                         f"type (16, 32 or 64 bits) throughout")
    if x.type.rank < 3 or w.type.rank != x.type.rank:
        raise NotLowered(f"input {x.shape} and weight {w.shape} ranks")
    if 0 in x.shape or 0 in w.shape:
        raise NotLowered("an empty conv (input or weight with a zero dim)")
    taps = math.prod(w.shape[2:])
    if taps > RUNTIME_CONV_MAX_TAPS:
        raise NotLowered(f"a run-time conv weight of {taps} taps (> RUNTIME_CONV_MAX_TAPS)")


def _im2col(cx, x, kernel, strides, pads, dilations, where: str, flip: bool = False):
    """(cols [N, C, taps, P], the output dims): tap t's slice of the padded input at
    offsets t * dilation (taps in reverse order if `flip`), P the output pixels."""
    n = len(kernel)
    batch, chans = x.shape[:2]
    if any(pads):
        x = cx.op("pad", x, pads=(0, 0) + tuple(pads[:n]) + (0, 0) + tuple(pads[n:]),
                  mode="constant", value=0.0)
    out = window_out_dims(x.shape[2:], kernel, strides, (0,) * (2 * n), dilations, where)
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


def _grouped_matmul(cx, a, cols, group: int, b):
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


def runtime_conv(cx, x, w, b, group: int, strides, pads, dilations, where: str):
    """Conv with a run-time weight W [M, C/G, K...]: im2col, then W as [G, M/G, C/G * taps]
    times the columns."""
    _checks(x, w, b)
    chans, outs = x.shape[1], w.shape[0]
    if group < 1 or chans != w.shape[1] * group or outs % group:
        raise NotLowered(f"channels {chans} vs weight {w.shape}, group {group}")
    if b is not None:
        check_bias(b, outs)
    if min(pads) < 0:
        raise NotLowered(f"negative pads {pads}")
    kernel = w.shape[2:]
    cols, out = _im2col(cx, x, kernel, strides, pads, dilations, where)
    k = w.shape[1] * math.prod(kernel)
    a = cx.reshape(w, (outs, k) if group == 1 else (group, outs // group, k))
    return cx.reshape(_grouped_matmul(cx, a, cols, group, b), (x.shape[0], outs) + out)


def runtime_conv_transpose(cx, x, w, b, strides, pads, dilations, output_padding,
                           group: int, where: str):
    """Transposed conv with a run-time weight W [C, M/G, K...] (importers/transposed.py's
    equivalent direct conv, or its depth-to-space when windows do not overlap)."""
    _checks(x, w, b)
    n = x.type.rank - 2
    chans, outs_g = x.shape[1], w.shape[1]
    if group < 1 or w.shape[0] != chans or chans % group:
        raise NotLowered(f"weight {w.shape} for {chans} channels in {group} groups")
    outs = outs_g * group
    if b is not None:
        check_bias(b, outs)
    kernel = w.shape[2:]
    taps = math.prod(kernel)
    cg = chans // group
    if tuple(kernel) == tuple(strides) and not any(pads) and not any(output_padding) \
            and all(d == 1 for d in dilations):
        return _depth_to_space(cx, x, w, b, group)
    x, conv_pads = spread_input(cx, x, kernel, strides, pads, dilations, output_padding)
    cols, out = _im2col(cx, x, kernel, (1,) * n, conv_pads, dilations, where, flip=True)
    # W [G, C/G, M/G, taps] -> [G, M/G, C/G, taps]: in and out channels swapped per group
    a = cx.op("transpose", cx.reshape(w, (group, cg, outs_g, taps)), perm=(0, 2, 1, 3))
    a = cx.reshape(a, (outs, cg * taps) if group == 1 else (group, outs_g, cg * taps))
    return cx.reshape(_grouped_matmul(cx, a, cols, group, b), (x.shape[0], outs) + out)


def _depth_to_space(cx, x, w, b, group: int):
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
    a = cx.op("transpose", cx.reshape(w, (group, cg, outs_g * taps)), perm=(0, 2, 1))
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
