"""Transposed convolution (ONNX ConvTranspose, torch's conv_transpose) as braze IR.

A transposed convolution scatters each input pixel through the kernel: with input
x [N, Cin, L...], weight w [Cin, Cout/g, K...], strides s, dilations d, pads p:

  y[n, o, i*s + k*d - p_begin] += x[n, c, i] * w[c, o', k]   (o' = o within its group)

Two lowerings onto the direct conv braze compiles:

- Non-overlapping windows (K = s, d = 1, no padding, no output padding: U-Net's and
  FCN decoders' 2x2 stride-2 upsampling): each output pixel takes exactly one kernel
  tap, so y is a 1x1 conv producing Cout * prod(s) channels, its channels (o, k...)
  then moved to the pixels (a depth-to-space): no product is wasted.
- Otherwise, the equivalent direct conv: the input with s - 1 zeros between its
  elements, padded by d*(K-1) - p on each side (plus the output padding at the end; the
  conv's own padding, a negative pad a crop), convolved at stride 1 and dilation d with the kernel
  flipped in space and its in/out channels swapped within each group. This multiplies
  the inserted zeros too (prod(s) times the products the output needs).

Weights must be constants (they are rearranged at import); a run-time weight takes
importers/runtime_conv.py instead (an im2col and a matmul; both importers).
"""

from __future__ import annotations

import contextlib

import numpy as np


class NotLowered(Exception):
    """A window op these lowerings (here, runtime_conv.py, pool_indices.py) do not
    express; the message says why, and each importer turns it into its fallback."""


@contextlib.contextmanager
def lowering(fallback):
    """Run lowerings that may raise NotLowered; its reason raised as `fallback(reason)`
    (the calling importer's Fallback)."""
    try:
        yield
    except NotLowered as e:
        raise fallback(str(e)) from None


def conv_transpose_ir(cx, x, w: np.ndarray, b: np.ndarray | None, strides, pads,
                      dilations, output_padding, group: int):
    """y as IR values built with `cx` (a converter context: op, const, reshape);
    `pads` is begin..., end... as ONNX orders them."""
    n = x.type.rank - 2
    if n < 1 or any(d is None for d in x.shape):
        raise NotLowered("a transposed conv needs a static input of rank 3 or more")
    if x.dtype not in ("f32", "f64"):
        raise NotLowered(f"dtype {x.dtype}")
    w = np.asarray(w)
    if w.shape[0] != x.shape[1] or x.shape[1] % group:
        raise NotLowered(f"weight {w.shape} for {x.shape[1]} channels in {group} groups")
    k = w.shape[2:]
    if tuple(k) == tuple(strides) and not any(pads) and not any(output_padding) \
            and all(d == 1 for d in dilations):
        return _depth_to_space(cx, x, w, b, group)
    return _zero_inserted(cx, x, w, b, strides, pads, dilations, output_padding, group)


def _grouped_swap(w: np.ndarray, group: int) -> np.ndarray:
    """[Cin, Cout/g, K...] -> [Cout, Cin/g, K...]: in and out channels swapped per group."""
    cin, cout_g = w.shape[:2]
    k = w.shape[2:]
    wg = w.reshape((group, cin // group, cout_g) + k)
    return np.swapaxes(wg, 1, 2).reshape((group * cout_g, cin // group) + k)


def _depth_to_space(cx, x, w: np.ndarray, b, group: int):
    """Non-overlapping windows: a 1x1 conv to (o, k...) channels, then to the pixels."""
    n = x.type.rank - 2
    s = w.shape[2:]
    taps = int(np.prod(s))
    swapped = _grouped_swap(w, group)  # [Cout, Cin/g, s...]
    cout = swapped.shape[0]
    one = swapped.reshape(cout, swapped.shape[1], taps)  # (o, c, k)
    one = np.moveaxis(one, 2, 1).reshape((cout * taps, swapped.shape[1]) + (1,) * n)
    inputs = [x, cx.const(one.astype(w.dtype))]
    if b is not None:
        inputs.append(cx.const(np.repeat(np.asarray(b), taps).astype(w.dtype)))
    z = cx.op("conv", *inputs, strides=(1,) * n, pads=(0,) * (2 * n),
              dilations=(1,) * n, group=group)
    lengths = x.shape[2:]
    z = cx.reshape(z, (x.shape[0], cout) + tuple(s) + tuple(lengths))
    perm = (0, 1) + tuple(p for i in range(n) for p in (2 + n + i, 2 + i))
    z = cx.op("transpose", z, perm=perm)
    return cx.reshape(z, (x.shape[0], cout) + tuple(l * t for l, t in zip(lengths, s)))


def _zero_inserted(cx, x, w: np.ndarray, b, strides, pads, dilations, output_padding,
                   group: int):
    n = x.type.rank - 2
    x, conv_pads = spread_input(cx, x, w.shape[2:], strides, pads, dilations, output_padding)
    flipped = _grouped_swap(w, group)[(slice(None), slice(None)) + (slice(None, None, -1),) * n]
    inputs = [x, cx.const(np.ascontiguousarray(flipped))]
    if b is not None:
        inputs.append(cx.const(np.asarray(b)))
    return cx.op("conv", *inputs, strides=(1,) * n, pads=conv_pads,
                 dilations=tuple(dilations), group=group)


def spread_input(cx, x, kernel, strides, pads, dilations, output_padding):
    """(x spread with stride - 1 zeros between its elements, cropped where a pad is wider
    than the kernel's reach; the stride-1 conv's own pads over it, begins then ends):
    the transposed conv is that conv with the kernel flipped. The conv's kernel reads
    its pads, nothing is copied for them."""
    n = x.type.rank - 2
    for axis in range(n):
        x = _spread(cx, x, 2 + axis, strides[axis])
    begin, end = [], []
    for i in range(n):
        reach = dilations[i] * (kernel[i] - 1)
        begin.append(reach - pads[i])
        end.append(reach - pads[n + i] + output_padding[i])
    if any(v < 0 for v in begin + end):  # a pad wider than the kernel's reach: a crop
        starts = [0, 0] + [max(-v, 0) for v in begin]
        sizes = list(x.shape[:2]) + [x.shape[2 + i] - max(-begin[i], 0) - max(-end[i], 0)
                                     for i in range(n)]
        if any(sz <= 0 for sz in sizes):
            raise NotLowered("the padding crops away the whole output")
        x = cx.op("slice", x, starts=tuple(starts), steps=(1,) * (n + 2), sizes=tuple(sizes))
    return x, tuple(max(v, 0) for v in begin) + tuple(max(v, 0) for v in end)


def _spread(cx, x, axis: int, s: int):
    """x with s - 1 zeros between consecutive elements along `axis`."""
    if s == 1 or x.shape[axis] == 1:
        return x
    shape = x.shape
    length = shape[axis]
    y = cx.reshape(x, shape[:axis + 1] + (1,) + shape[axis + 1:])
    pads = [0] * (2 * y.type.rank)
    pads[y.type.rank + axis + 1] = s - 1
    y = cx.op("pad", y, pads=tuple(pads), mode="constant", value=0.0)
    y = cx.reshape(y, shape[:axis] + (length * s,) + shape[axis + 1:])
    starts = [0] * len(shape)
    sizes = list(shape)
    sizes[axis] = (length - 1) * s + 1
    return cx.op("slice", y, starts=tuple(starts), steps=(1,) * len(shape), sizes=tuple(sizes))
