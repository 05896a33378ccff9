"""aten converters for running and segmented reductions: cummax, cummin and
segment_reduce.

cummax / cummin: the log-step scan over (value, index) pairs of importers/scans.py
(`cumulative_extreme_ir`): torch's index is the last position that reached the running
extreme (ties: the later one), and once a NaN is seen the value stays NaN and the index
follows the latest NaN. bool is scanned as u8.

segment_reduce(data, reduce, lengths | offsets, axis, initial): S segments of data
along `axis`, segment s covering [start_s, end_s) (from lengths: end = cumsum(lengths),
start = end - lengths; from offsets: start = offsets[:-1], end = offsets[1:]). The
lengths are data, read at run time, not constants: every element is tested against
every segment,
  member[s, i] = start_s <= i < end_s,
  out[s] = initial (op) reduce_i (member[s, i] ? data[i] : identity)
with torch's identities (sum 0, prod 1, max -inf, min +inf; a given `initial` is folded
in as torch's loop starts from it), and
  mean[s] = (initial + sum_s) / length_s,  initial where length_s = 0 (NaN without one).
O(S * N) compares per row, fine for the segment counts models use (MAX_SEGMENT_PAIRS).
Lengths that torch would reject (negative, or not summing to the axis length, when
unsafe=False) are not checked: braze reduces what the ranges cover.
"""

from __future__ import annotations

import numpy as np
import torch

from compiler import dtypes
from importers.fx_context import Ctx, Fallback, converts, norm_dim
from importers.scans import cumsum_ir, cumulative_extreme_ir

aten = torch.ops.aten

# The most (segment, element) pairs segment_reduce compares, over the whole tensor:
# its work and its masked temporary grow with the product.
MAX_SEGMENT_PAIRS = 1 << 24

_REDUCE = {"sum": ("reduce_sum", "add", 0.0), "mean": ("reduce_sum", "add", 0.0),
           "prod": ("reduce_prod", "mul", 1.0), "max": ("reduce_max", "max", -np.inf),
           "min": ("reduce_min", "min", np.inf)}


@converts(aten.cummax.default, aten.cummin.default)
def _cumulative_extreme(cx: Ctx, x, dim):
    """(values, indices) of the running max (min) along dim (module doc)."""
    if not x.type.static:
        raise Fallback("a running max or min of a tensor with a dynamic shape")
    largest = cx.target is aten.cummax.default
    if x.type.rank == 0:
        norm_dim(dim, 0)
        return x, cx.const(np.zeros((), np.int64))
    d = norm_dim(dim, x.type.rank)
    if x.shape[d] == 0:
        return x, cx.const(np.zeros(cx.out(1).shape, np.int64))
    v, i = cumulative_extreme_ir(cx, cx.cast(x, "u8") if x.dtype == "bool" else x, d, largest)
    return cx.cast(v, x.dtype), i


@converts(aten.segment_reduce.default)
def _segment_reduce(cx: Ctx, data, reduce, *, lengths=None, indices=None, offsets=None,
                    axis=0, unsafe=False, initial=None):
    """torch's segment_reduce by membership masks (module doc)."""
    out = cx.out()
    if reduce not in _REDUCE:
        raise Fallback(f"segment_reduce with reduce={reduce!r}")
    if indices is not None or (lengths is None) == (offsets is None):
        raise Fallback("segment_reduce needs exactly one of lengths and offsets (torch "
                       "does not implement indices)")
    if data.dtype not in dtypes.FLOATS or not data.type.static:
        raise Fallback(f"segment_reduce of a {data.dtype} tensor or a dynamic shape")
    a = norm_dim(axis, data.type.rank)
    pairs = out.size * data.shape[a]
    if pairs > MAX_SEGMENT_PAIRS:
        raise Fallback(f"segment_reduce comparing {pairs} (segment, element) pairs "
                       f"(braze compares up to {MAX_SEGMENT_PAIRS})")
    starts, ends = _bounds(cx, lengths, offsets, a)
    return _reduce_segments(cx, data, reduce, starts, ends, a, initial)


def _bounds(cx: Ctx, lengths, offsets, a: int) -> tuple:
    """(start, end) of each segment, i64 of shape (B..., S): lengths or offsets along
    their last dim, which is data's `axis` a."""
    if lengths is not None:
        lengths = cx.cast(lengths, "i64")
        if lengths.type.rank != a + 1:
            raise Fallback(f"segment lengths of rank {lengths.type.rank} for axis {a}")
        ends = cumsum_ir(cx, lengths, a)
        return cx.op("sub", ends, lengths), ends
    offsets = cx.cast(offsets, "i64")
    if offsets.type.rank != a + 1:
        raise Fallback(f"segment offsets of rank {offsets.type.rank} for axis {a}")
    s = offsets.shape[a] - 1
    lead = tuple(offsets.shape[:a])
    zeros = (0,) * (a + 1)
    part = (lambda start: cx.op("slice", offsets, starts=zeros[:a] + (start,),
                                steps=(1,) * (a + 1), sizes=lead + (s,)))
    return part(0), part(1)


def _reduce_segments(cx: Ctx, data, reduce: str, starts, ends, a: int, initial):
    """data reduced over each segment's range along axis a (module doc)."""
    shape, dt = tuple(data.shape), data.dtype
    lead, s = tuple(starts.shape[:a]), starts.shape[a]
    reducer, combine, identity = _REDUCE[reduce]
    y = (_masked_reduce(cx, data, starts, ends, a, reducer, identity) if shape[a] else
         cx.op("broadcast", cx.scalar(identity, dt), shape=lead + (s,) + shape[a + 1:]))
    if initial is not None:
        y = cx.op(combine, cx.scalar(initial, dt), y)
    if reduce != "mean":
        return y
    length = cx.reshape(cx.op("sub", ends, starts), lead + (s,) + (1,) * (len(shape) - a - 1))
    empty = cx.op("le", length, cx.scalar(0, "i64"))
    fill = cx.scalar(float("nan") if initial is None else initial, dt)
    return cx.op("select", empty, fill, cx.op("div", y, cx.cast(length, dt)))


def _masked_reduce(cx: Ctx, data, starts, ends, a: int, reducer: str, identity: float):
    """reduce_i (start_s <= i < end_s ? data[i] : identity) along axis a, for each s
    (a new axis before a); a is not empty (braze refuses a reduce over nothing)."""
    shape = tuple(data.shape)
    n, rest = shape[a], shape[a + 1:]
    lead, s = tuple(starts.shape[:a]), starts.shape[a]
    column = (lambda v: cx.reshape(v, lead + (s, 1)))
    i = cx.const(np.arange(n, dtype=np.int64).reshape((1,) * (a + 1) + (n,)))
    member = cx.op("and", cx.op("ge", i, column(starts)), cx.op("lt", i, column(ends)))
    member = cx.reshape(member, lead + (s, n) + (1,) * len(rest))
    rows = cx.reshape(data, shape[:a] + (1,) + shape[a:])
    masked = cx.op("select", member, rows, cx.scalar(identity, data.dtype))
    return cx.op(reducer, masked, axes=(a + 1,), keepdims=False)
