"""aten converters for selection by rank: topk, sort (argsort, msort) and kthvalue, over
importers/selection.py (shared with the ONNX importer's TopK).

topk and kthvalue take k rounds of argmax or argmin (k <= TOPK_MAX_K), or, for k above
ROUNDS_FIRST along a short axis (SORT_MAX_N), rank all pairs as sort does. The order is
torch's stable sort: by value, the lower index first among ties, NaN the largest (so
the first of descending, the last of ascending). Where torch leaves the order among
ties unspecified (topk, kthvalue, the unstable sort), the values agree and braze reports
the lowest of the tied positions. The values are read at the indices (one gather).
"""

from __future__ import annotations

import numpy as np
import torch

from compiler import dtypes
from importers.fx_context import Ctx, Fallback, converts, norm_dim
from importers.scans import take_along_axis_ir
from importers.selection import (TOPK_MAX_K, kth_index, sort_fits, sort_indices,
                                 top_indices)

aten = torch.ops.aten

# Up to this k, topk and kthvalue take rounds even where the axis could be ranked: fewer
# passes (MoE routing's top-1 or top-2 of a few experts); beyond it ranking compiles
# much faster (one round is several IR ops) and, on a short axis, runs as fast.
ROUNDS_FIRST = 8


def _static(cx: Ctx, x, what: str):
    if not x.type.static:
        raise Fallback(f"{what} of a tensor with a dynamic shape")


def _empty(cx: Ctx):
    """Constants for both outputs, where they have no elements."""
    out = [cx.out(0), cx.out(1)]
    if any(t.size for t in out):
        return None
    return tuple(cx.const(np.zeros(t.shape, dtypes.to_numpy(t.dtype))) for t in out)


def _scalar(cx: Ctx, x, dim, k_ok: bool):
    """A 0-d x: itself at index 0 (torch's topk takes k 0 or 1 there, kthvalue 1)."""
    norm_dim(dim, 0)
    if not k_ok:
        raise Fallback("k out of range for a 0-d tensor (torch raises)")
    return cx.reshape(x, cx.out(0).shape), cx.const(np.zeros(cx.out(1).shape, np.int64))


def _finish(cx: Ctx, x, idx, axis: int):
    """(values read at idx along axis, idx), in the shapes aten states."""
    values = take_along_axis_ir(cx, x, idx, axis)
    return cx.reshape(values, cx.out(0).shape), cx.reshape(idx, cx.out(1).shape)


@converts(aten.topk.default)
def _topk(cx: Ctx, x, k, dim=-1, largest=True, sorted=True):
    """k rounds of argmax (argmin for the smallest), or the first k by ranks. sorted=False
    comes sorted too (torch's CPU order there is nth_element's, unspecified; for
    k * 64 <= n it sorts as well)."""
    _static(cx, x, "topk")
    if (empty := _empty(cx)) is not None:
        return empty
    if x.type.rank == 0:
        return _scalar(cx, x, dim, k in (0, 1))
    d = norm_dim(dim, x.type.rank)
    if _by_rounds(x, d, k, "topk", "argmax"):
        idx = top_indices(cx, x, d, k, bool(largest))
    else:
        idx = sort_indices(cx, x, d, bool(largest))
        if k < x.shape[d]:
            idx = _first(cx, idx, d, k)
    return _finish(cx, x, idx, d)


def _by_rounds(x, d: int, k: int, what: str, arg: str) -> bool:
    """Whether the k first along dim d are found by k rounds of `arg` (small k, or an
    axis too long to rank), else by ranks; Fallback when neither applies."""
    n = x.shape[d]
    if not 0 < k <= n:
        raise Fallback(f"{what} with k={k} along {n} elements")
    fits = sort_fits(x.shape, d)
    if k <= ROUNDS_FIRST or (k <= TOPK_MAX_K and fits is not None):
        return True
    if fits is None:
        return False
    raise Fallback(f"{what} with k={k}: more than {TOPK_MAX_K} rounds of {arg}, and {fits}")


def _first(cx: Ctx, v, axis: int, k: int):
    starts, steps, sizes = [0] * v.type.rank, [1] * v.type.rank, list(v.shape)
    sizes[axis] = k
    return cx.op("slice", v, starts=tuple(starts), steps=tuple(steps), sizes=tuple(sizes))


@converts(aten.sort.default)
def _sort(cx: Ctx, x, dim=-1, descending=False):
    """A stable sort by ranks (importers/selection.py), on a short axis."""
    return _sort_stable(cx, x, stable=True, dim=dim, descending=descending)


@converts(aten.sort.stable)
def _sort_stable(cx: Ctx, x, *, stable=None, dim=-1, descending=False):
    _static(cx, x, "sort")
    if (empty := _empty(cx)) is not None:
        return empty
    if x.type.rank == 0:
        return _scalar(cx, x, dim, True)
    d = norm_dim(dim, x.type.rank)
    if x.shape[d] == 1:
        return cx.reshape(x, cx.out(0).shape), cx.const(np.zeros(cx.out(1).shape, np.int64))
    if (why := sort_fits(x.shape, d)) is not None:
        raise Fallback(why)
    return _finish(cx, x, sort_indices(cx, x, d, bool(descending)), d)


@converts(aten.kthvalue.default)
def _kthvalue(cx: Ctx, x, k, dim=-1, keepdim=False):
    """The k-th smallest: the last of k rounds of argmin, or the one ranked k-1."""
    _static(cx, x, "kthvalue")
    if (empty := _empty(cx)) is not None:
        return empty
    if x.type.rank == 0:
        return _scalar(cx, x, dim, k == 1)
    d = norm_dim(dim, x.type.rank)
    if _by_rounds(x, d, k, "kthvalue", "argmin"):
        idx = top_indices(cx, x, d, k, largest=False, last_only=True)
    else:
        idx = kth_index(cx, x, d, k)
    return _finish(cx, x, idx, d)
