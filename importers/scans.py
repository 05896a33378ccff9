"""Prefix sums and take-along-axis gathers as braze IR, shared by both importers.

cumsum along an axis of n elements is ceil(log2 n) steps of Hillis and Steele's scan:
  y_0 = x;  y_{k+1}[i] = y_k[i] + y_k[i - 2^k]   (the second term 0 where i < 2^k)
each step a slice, a zero pad and an add, all index arithmetic; exact for integers,
for floats a different (tree-like) summation order than a running sum. exclusive
shifts the result by one (the first element 0), reverse flips the axis before and
after (a slice with step -1).

take_along_axis (ONNX GatherElements) reads data at a flat index:
  flat[i...] = idx[i...] * stride[axis] + sum over d != axis of i_d * stride[d]
the second sum a constant array the shape of idx; a negative index counts from the
end, and an index out of range would be reported by the flat gather's bounds check
only when it leaves the whole tensor (onnxruntime reports every one), so the index is
first mapped to n where it is out of [-n, n), which makes the flat index out of range too: the gather raises braze's IndexError.
(torch.gather is not converted: torch raises RuntimeError for a bad index.)
"""

from __future__ import annotations

import numpy as np


def _slice(cx, x, axis: int, start: int, step: int, n: int):
    starts, steps, sizes = [0] * x.type.rank, [1] * x.type.rank, list(x.shape)
    starts[axis], steps[axis], sizes[axis] = start, step, n
    return cx.op("slice", x, starts=tuple(starts), steps=tuple(steps), sizes=tuple(sizes))


def _shift(cx, x, axis: int, by: int):
    """x moved `by` places up along `axis`, zeros entering at the start."""
    n = x.shape[axis]
    kept = _slice(cx, x, axis, 0, 1, n - by)
    pads = [0] * (2 * x.type.rank)
    pads[axis] = by
    return cx.op("pad", kept, pads=tuple(pads), mode="constant", value=0.0)


def cumsum_ir(cx, x, axis: int, exclusive: bool = False, reverse: bool = False):
    """The prefix sums of x along `axis` (module doc)."""
    n = x.shape[axis]
    if n is None:
        raise ValueError("a dynamic scan length")
    if n == 0:
        return x
    if reverse:
        x = _slice(cx, x, axis, n - 1, -1, n)
    y, span = x, 1
    while span < n:
        y = cx.op("add", y, _shift(cx, y, axis, span))
        span *= 2
    if exclusive:
        y = _shift(cx, y, axis, 1)
    if reverse:
        y = _slice(cx, y, axis, n - 1, -1, n)
    return y


def take_along_axis_ir(cx, data, idx, axis: int):
    """data read along `axis` at idx (same rank; module doc); indices in [-n, 0) count
    from the end."""
    shape, ishape = data.shape, idx.shape
    n = shape[axis]
    strides = np.cumprod((shape[1:] + (1,))[::-1])[::-1].astype(np.int64)
    grid = np.indices(ishape, dtype=np.int64)
    base = sum(grid[d] * strides[d] for d in range(len(shape)) if d != axis)
    base = np.asarray(base, dtype=np.int64).reshape(ishape)
    i = cx.cast(idx, "i64")
    below = cx.op("lt", i, cx.scalar(0, "i64"))
    i = cx.op("select", below, cx.op("add", i, cx.scalar(n, "i64")), i)
    bad = cx.op("or", cx.op("lt", i, cx.scalar(0, "i64")),
                cx.op("ge", i, cx.scalar(n, "i64")))
    total = int(np.prod(shape))
    flat_i = cx.op("add", cx.op("mul", i, cx.scalar(int(strides[axis]), "i64")),
                   cx.const(base))
    flat_i = cx.op("select", bad, cx.scalar(total, "i64"), flat_i)
    flat = cx.reshape(data, (total,))
    return cx.op("gather", flat, flat_i, axis=0)
