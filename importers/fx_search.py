"""aten converters that search an order: bucketize and searchsorted (binary search of
sorted boundaries), median and nanmedian (the middle of the stable order, by ranks).

bucketize / searchsorted: torch's own binary search, unrolled. For each value v over a
row b of M boundaries (read through `sorter` when given: b[sorter[mid]]):
  start, end = 0, M
  while start < end:  mid = start + (end - start) // 2
                      if goes_right(b[mid], v): start = mid + 1  else: end = mid
  goes_right = not (b[mid] >= v)   (left, the first position v may take)
               not (b[mid] >  v)   (right=True or side="right": the last)
The loop runs at most bit_length(M) times; braze runs every step for every value,
a finished search (start == end) leaving its bounds alone. Written with torch's
negated compares, a NaN value lands at M, and boundaries that are not sorted (or
hold NaN) give exactly torch's answer too, since the same positions are probed.
Each step is a gather of one boundary per value: O(K log M) work.

nanmedian: the lower median of the values that are not NaN, the
  k = (count - 1) // 2
-th of the stable order (by value, the lower index first among ties, NaN last):
torch's nth_element runs with exactly that comparator, so its index is this one.
A row of NaN only gives NaN; torch's comparator is not a strict order there (every
NaN is "before" every other) and its index comes out of nth_element's probing
(0 up to 3 elements, then 2 of 4 or 5, 6 of 8, ...): braze reports 0 there.
median: the ((n - 1) // 2)-th of the same order, or, where the row holds a NaN, its
first NaN (torch looks for one first), which that order ranks right after the
numbers: k = count. The order is `selection.ranks` (all pairs of a short axis,
importers/selection.py); a longer axis stays on torch.
"""

from __future__ import annotations

import numpy as np
import torch

from compiler import dtypes
from importers.fx_context import Ctx, Fallback, converts, norm_dim
from importers.scans import take_along_axis_ir
from importers.selection import iota, ranks, sort_fits

aten = torch.ops.aten


@converts(aten.bucketize.Tensor)
def _bucketize(cx: Ctx, x, boundaries, *, out_int32=False, right=False):
    """The bucket of each element of x among 1-d sorted boundaries."""
    if boundaries.type.rank != 1:
        raise Fallback("bucketize with boundaries that are not 1-d (torch raises)")
    return _search(cx, boundaries, x, bool(right), None)


@converts(aten.searchsorted.Tensor)
def _searchsorted(cx: Ctx, sequence, x, *, out_int32=False, right=False, side=None,
                  sorter=None):
    """Where each value of x goes in the sorted last dim of `sequence` (1-d: one
    sequence for all of x; else one per row, x's leading dims matching)."""
    if side is not None:
        right = side == "right"
    if sequence.type.rank > 1 and tuple(sequence.shape[:-1]) != tuple(x.shape[:-1]):
        raise Fallback("searchsorted with leading dims that differ (torch raises)")
    return _search(cx, sequence, x, bool(right), sorter)


def _search(cx: Ctx, sequence, x, right: bool, sorter):
    out = cx.out()
    if not (sequence.type.static and x.type.static):
        raise Fallback("a binary search with a dynamic shape")
    m = sequence.shape[-1] if sequence.type.rank else 0
    if out.size == 0 or m == 0:
        return cx.const(np.zeros(out.shape, dtypes.to_numpy(out.dtype)))
    dt = cx.result_type(sequence, x)
    boundary = _reader(cx, cx.cast(sequence, dt), sorter, x)
    v = cx.cast(x, dt)
    start, end = cx.scalar(0, "i64"), cx.scalar(m, "i64")
    one, last = cx.scalar(1, "i64"), cx.scalar(m - 1, "i64")
    for _ in range(m.bit_length()):
        active = cx.op("lt", start, end)
        mid = cx.op("add", start, cx.op("shr", cx.op("sub", end, start), one))
        b = boundary(cx.op("min", mid, last))
        stop = cx.op("gt" if right else "ge", b, v)
        start = cx.op("select", cx.op("and", active, cx.op("not", stop)),
                      cx.op("add", mid, one), start)
        end = cx.op("select", cx.op("and", active, stop), mid, end)
    start = cx.cast(start, out.dtype)
    if tuple(start.shape) != tuple(out.shape):
        start = cx.op("broadcast", start, shape=out.shape)
    return start


def _reader(cx: Ctx, sequence, sorter, x):
    """mid (i64, broadcasting against x) -> the boundary at `mid` of each value's row
    (through `sorter` when given)."""
    if sequence.type.rank == 1:
        def read(v, mid):
            return cx.op("gather", v, mid, axis=0)
    else:
        rows, m = int(np.prod(sequence.shape[:-1])), sequence.shape[-1]
        base = cx.const((np.arange(rows, dtype=np.int64) * m).reshape(
            tuple(sequence.shape[:-1]) + (1,)))
        total = rows * m

        def read(v, mid):
            return cx.op("gather", cx.reshape(v, (total,)), cx.op("add", base, mid), axis=0)
    if sorter is None:
        return lambda mid: read(sequence, mid)
    sorter = cx.cast(sorter, "i64")
    return lambda mid: read(sequence, read(sorter, mid))


@converts(aten.nanmedian.default, aten.median.default)
def _median_all(cx: Ctx, x):
    """The lower median of all the elements (module doc); NaN if x is empty."""
    out = cx.out()
    if x.type.size == 0:
        if out.dtype not in dtypes.FLOATS:
            raise Fallback(f"the median of an empty {out.dtype} tensor")
        return cx.scalar(float("nan"), out.dtype)
    flat = cx.reshape(x, (x.type.size,))
    return cx.reshape(_median(cx, flat, 0, _skips_nan(cx))[0], ())


@converts(aten.nanmedian.dim, aten.median.dim)
def _median_dim(cx: Ctx, x, dim, keepdim=False):
    """(values, indices) of the lower median along dim (module doc)."""
    if x.type.rank == 0:
        norm_dim(dim, 0)
        return x, cx.const(np.zeros((), np.int64))
    d = norm_dim(dim, x.type.rank)
    if cx.out(0).size == 0:
        return tuple(cx.const(np.zeros(cx.out(i).shape, dtypes.to_numpy(cx.out(i).dtype)))
                     for i in (0, 1))
    if x.shape[d] == 0:
        raise Fallback("a median along an empty dim (torch raises)")
    values, idx = _median(cx, x, d, _skips_nan(cx))
    return cx.reshape(values, cx.out(0).shape), cx.reshape(idx, cx.out(1).shape)


def _skips_nan(cx: Ctx) -> bool:
    return cx.target.overloadpacket is aten.nanmedian


def _median(cx: Ctx, x, d: int, skip_nan: bool) -> tuple:
    """(values, i64 indices), 1 along d: the k-th of the stable order (module doc)."""
    if not x.type.static:
        raise Fallback("a median of a tensor with a dynamic shape")
    if (why := sort_fits(x.shape, d)) is not None:
        raise Fallback(f"the median ranks its axis: {why}")
    n = x.shape[d]
    k = cx.scalar((n - 1) // 2, "i64")
    if x.dtype in dtypes.FLOATS:
        count = cx.op("reduce_sum", cx.cast(cx.op("not", cx.op("isnan", x)), "i64"),
                      axes=(d,), keepdims=True)
        if skip_nan:
            k = cx.op("shr", cx.op("max", cx.op("sub", count, cx.scalar(1, "i64")),
                                   cx.scalar(0, "i64")), cx.scalar(1, "i64"))
        else:  # the first NaN, ranked right after the numbers
            k = cx.op("select", cx.op("lt", count, cx.scalar(n, "i64")), count, k)
    at = cx.op("eq", ranks(cx, x, d, False), k)
    picked = cx.op("select", at, iota(cx, n, d, x.type.rank), cx.scalar(0, "i64"))
    idx = cx.op("reduce_sum", picked, axes=(d,), keepdims=True)
    return take_along_axis_ir(cx, x, idx, d), idx
