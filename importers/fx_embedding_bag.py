"""torch's EmbeddingBag (aten._embedding_bag and _embedding_bag_forward_only, gradients
off): bags of rows of a weight table, summed, averaged or maxed per bag, as IR.

The bags are runs of the 1-d indices that start at `offsets` (ascending, the first 0;
with include_last_offset the last offset ends the last bag). Index j is in bag
  seg[j] = #{b : offsets[b] <= j} - 1,
the prefix sums (importers/scans.py) of a 1 scattered at every bag's start, less one:
O(N log N) work whatever the bag count. The rows are one gather of the table (times
per_sample_weights, mode sum), and the reduction one `scatter` into [B, D] at flat
positions seg[j] * D + d (importers/scatter.py): add for sum and mean (mean then
divides by the bag's count, a scatter of ones the same way; 0 for an empty bag), max
into -inf for max (an empty bag gives 0, as torch). An index equal to padding_idx adds
nothing and is not counted. An index outside the table is a run-time index fault,
raised, as torch raises.

Only the bags' result is converted: the op's other outputs (offset2bag, bag_size,
max_indices) are what its backward reads; a graph that reads them keeps the op on torch.
"""

from __future__ import annotations

import numpy as np
import torch

from compiler import dtypes
from importers.fx_context import Ctx, Fallback, converts
from importers.scans import cumsum_ir
from importers.scatter import flat_scatter

aten = torch.ops.aten

_MODES = {0: "sum", 1: "mean", 2: "max"}


@converts(aten._embedding_bag_forward_only.default, aten._embedding_bag.default)
def _embedding_bag(cx: Ctx, weight, indices, offsets, scale_grad_by_freq=False, mode=0,
                   sparse=False, per_sample_weights=None, include_last_offset=False,
                   padding_idx=-1):
    """The bags' sums, means or maxima (module doc)."""
    if cx.used - {0}:
        raise Fallback("embedding_bag's offset2bag, bag_size or max_indices is read "
                       "(its backward's outputs)")
    how = _MODES.get(int(mode))
    out = cx.out(0)
    if how is None or out.dtype not in dtypes.FLOATS or not out.static:
        raise Fallback(f"embedding_bag mode {mode} giving {out.dtype}")
    if indices.type.rank != 1 or offsets.type.rank != 1 or not indices.type.static \
            or not offsets.type.static:
        raise Fallback("embedding_bag with indices or offsets not 1-d of a static size")
    n, v = indices.shape[0], weight.shape[0]
    bags, d = out.shape
    if n == 0:
        return cx.op("broadcast", cx.scalar(0.0, out.dtype), shape=out.shape)
    idx = cx.cast(indices, "i64")
    starts = cx.cast(offsets, "i64")
    if include_last_offset:
        starts = cx.op("slice", starts, starts=(0,), steps=(1,), sizes=(bags,))
    # a 1 at each bag's start (positions n and past: bags that start at the end), their
    # prefix sums less one: each index's bag
    marks = flat_scatter(cx, cx.op("broadcast", cx.scalar(0, "i64"), shape=(n + 1,)),
                         starts, cx.scalar(1, "i64"), reduction="add")
    seg = cx.op("sub", cumsum_ir(cx, cx.op("slice", marks, starts=(0,), steps=(1,),
                                              sizes=(n,)), 0), cx.scalar(1, "i64"))
    # an index before the first offset (offsets[0] > 0) belongs to no bag: torch drops it
    kept = cx.op("ge", seg, cx.scalar(0, "i64"))
    if padding_idx is not None and int(padding_idx) >= 0:
        kept = cx.op("and", kept, cx.op("ne", idx, cx.scalar(int(padding_idx), "i64")))
    safe = cx.op("select", cx.op("lt", idx, cx.scalar(0, "i64")), cx.scalar(v, "i64"), idx)
    rows = cx.cast(cx.op("gather", weight, safe, axis=0), out.dtype)  # [N, D]
    if per_sample_weights is not None:
        if how != "sum":
            raise Fallback("per_sample_weights with a mode other than sum")
        rows = cx.op("mul", rows, cx.reshape(cx.cast(per_sample_weights, out.dtype), (n, 1)))
    # a dropped index writes to one past the end of a spare row, never read
    target = cx.op("select", kept, seg, cx.scalar(bags, "i64"))
    flat = cx.op("add", cx.op("mul", cx.reshape(target, (n, 1)), cx.scalar(d, "i64")),
                 cx.const(np.arange(d, dtype=np.int64).reshape(1, d)))
    init = 0.0 if how != "max" else -np.inf
    data = cx.op("broadcast", cx.scalar(init, out.dtype), shape=(bags + 1, d))
    total = flat_scatter(cx, data, flat, rows, reduction="add" if how != "max" else "max")
    total = cx.op("slice", total, starts=(0, 0), steps=(1, 1), sizes=(bags, d))
    if how == "sum":
        return (total,) + tuple(_unused(cx, i) for i in range(1, len(cx.vals)))
    counts = flat_scatter(cx, cx.op("broadcast", cx.scalar(0.0, out.dtype), shape=(bags + 1,)),
                          target, cx.scalar(1.0, out.dtype), reduction="add")
    counts = cx.reshape(cx.op("slice", counts, starts=(0,), steps=(1,), sizes=(bags,)),
                        (bags, 1))
    if how == "mean":
        total = cx.op("div", total, cx.op("max", counts, cx.scalar(1.0, out.dtype)))
    if how == "max":
        empty = cx.op("eq", counts, cx.scalar(0.0, out.dtype))
        total = cx.op("select", cx.op("broadcast", empty, shape=(bags, d)),
                      cx.scalar(0.0, out.dtype), total)
    return (total,) + tuple(_unused(cx, i) for i in range(1, len(cx.vals)))


def _unused(cx: Ctx, i: int):
    """A placeholder for an output nothing reads (zeros of its type)."""
    t = cx.out(i)
    return cx.const(np.zeros(t.shape, dtypes.to_numpy(t.dtype)))
