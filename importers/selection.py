"""Selection by rank as braze IR, shared by both importers: the k largest or smallest
along an axis (ONNX TopK, torch.topk and kthvalue) and a full stable sort (torch.sort,
argsort, msort).

Order: by value, then the lower index first; NaN ranks above everything (the first of
the largest, the last of the smallest), several NaNs by index. That is onnxruntime's
TopK, and torch's stable sort (torch.sort(stable=True); its unstable sort agrees where
there are no ties, and for ties its order is unspecified: on CPU it is this one up to
16 elements). torch.topk and kthvalue on ties give the same values, but which of the
tied positions they report is unspecified (std::partial_sort and nth_element): braze
reports the lowest.

`top_indices`: k rounds of argmax (argmin for the smallest) along the axis, each round
masking the position it chose with the dtype's lowest value (highest for argmin); the
indices are concatenated (the values are gathered at them once). The mask value can
tie with a real element: once all that remain equal it (the round's max, or min, is the
mask value) the round picks the first position not yet taken instead, by an argmax
over a u8 "rest" array (0 taken, 1 a NaN of the smallest, 2 otherwise). That is
O(k * n) work and O(k) IR ops, fine for the small k of detection post-processing, MoE
routing and beam search; a larger k stays on the host.

`sort_indices`: every element's rank (how many come before it in that order), from all
pairs at once: for i, j along the axis, j comes before i if x[j] is smaller (larger,
descending; NaN the largest) or equal with j < i; rank[i] sums that over j. The sorted
indices are then out[r] = the i with rank[i] == r, a compare with an iota and a sum.
O(n^2) work per row but a dozen IR ops for any n, so it is kept to short axes
(SORT_MAX_N) and a bounded pair count (SORT_MAX_PAIRS).

f16 and bf16 are compared as f32 (exact), the values read from x itself; bool as u8.
"""

from __future__ import annotations

import numpy as np

from compiler import dtypes

# The most TopK rounds braze unrolls (each round a few passes over the axis).
TOPK_MAX_K = 64
# The longest axis sorted by ranks, and the most (element, element) pairs compared.
SORT_MAX_N = 256
SORT_MAX_PAIRS = 1 << 22


def iota(cx, n: int, axis: int, rank: int):
    """0..n-1 (i64) laid along `axis` of a rank-`rank` shape of ones."""
    shape = [1] * rank
    shape[axis] = n
    return cx.const(np.arange(n, dtype=np.int64).reshape(shape))


def extreme(dtype: str, low: bool):
    """The lowest (or highest) value of an IR dtype: what a taken position becomes."""
    if dtype in dtypes.FLOATS:
        return -np.inf if low else np.inf
    info = np.iinfo(dtypes.to_numpy(dtype))
    return info.min if low else info.max


def comparable(cx, x):
    """x in a dtype the rounds and compares handle exactly (f16/bf16 as f32, bool as u8)."""
    if x.dtype in ("f16", "bf16"):
        return cx.cast(x, "f32")
    if x.dtype == "bool":
        return cx.cast(x, "u8")
    return x


def top_indices(cx, x, axis: int, k: int, largest: bool, last_only: bool = False):
    """The indices (i64, k along `axis`) of x's k largest or smallest (module doc); with
    `last_only` only the k-th (1 along `axis`)."""
    x = comparable(cx, x)
    arg, reduce = ("argmax", "reduce_max") if largest else ("argmin", "reduce_min")
    bound = cx.scalar(extreme(x.dtype, low=largest), x.dtype)
    positions = iota(cx, x.shape[axis], axis, x.type.rank)
    m, rest, masked = x, cx.scalar(2, "u8"), False
    if not largest and x.dtype in dtypes.FLOATS:  # argmin would take a NaN first
        nan = cx.op("isnan", x)
        m = cx.op("select", nan, bound, x)
        rest = cx.op("select", nan, cx.scalar(1, "u8"), rest)
        masked = True
    picks = []
    for r in range(k):
        i = cx.op(arg, m, axis=axis, keepdims=True)
        if masked:
            spent = cx.op("eq", cx.op(reduce, m, axes=(axis,), keepdims=True), bound)
            i = cx.op("select", spent, cx.op("argmax", rest, axis=axis, keepdims=True), i)
        picks.append(i)
        if r + 1 < k:
            hit = cx.op("eq", positions, i)
            m = cx.op("select", hit, bound, m)
            rest = cx.op("select", hit, cx.scalar(0, "u8"), rest)
            masked = True
    if last_only or k == 1:
        return picks[-1]
    return cx.op("concat", *picks, axis=axis)


def sort_fits(shape, axis: int) -> str | None:
    """Why x of `shape` cannot be sorted along `axis` by ranks (None: it can)."""
    n = shape[axis]
    pairs = int(np.prod(shape, dtype=np.int64)) * n
    if n > SORT_MAX_N:
        return f"a sort along {n} elements (braze sorts up to {SORT_MAX_N})"
    if pairs > SORT_MAX_PAIRS:
        return f"a sort comparing {pairs} pairs (braze compares up to {SORT_MAX_PAIRS})"
    return None


def _before(cx, a, b, descending: bool):
    """a strictly before b in value order (NaN the largest), elementwise, broadcasting."""
    first = cx.op("gt" if descending else "lt", a, b)
    if a.dtype not in dtypes.FLOATS:
        return first
    big, small = (a, b) if descending else (b, a)  # a NaN `big` beats a number `small`
    nan_wins = cx.op("and", cx.op("isnan", big), cx.op("not", cx.op("isnan", small)))
    return cx.op("or", first, nan_wins)


def ranks(cx, x, axis: int, descending: bool):
    """rank[i] (i64, x's shape): how many elements of x's row along `axis` come before
    element i in the stable order (module doc)."""
    x = comparable(cx, x)
    n, shape = x.shape[axis], tuple(x.shape)
    xi = cx.reshape(x, shape[:axis + 1] + (1,) + shape[axis + 1:])  # i along axis
    xj = cx.reshape(x, shape[:axis] + (1,) + shape[axis:])  # j along axis + 1
    pad = (1,) * (len(shape) - axis - 1)
    j_lt_i = cx.const((np.arange(n)[None, :] < np.arange(n)[:, None]).reshape((n, n) + pad))
    tie_first = cx.op("and", j_lt_i, cx.op("not", _before(cx, xi, xj, descending)))
    before = cx.op("or", _before(cx, xj, xi, descending), tie_first)
    return cx.op("reduce_sum", cx.cast(before, "i64"), axes=(axis + 1,), keepdims=False)


def sort_indices(cx, x, axis: int, descending: bool):
    """The indices (i64, x's shape) that sort x along `axis`, stably (module doc)."""
    rank = ranks(cx, x, axis, descending)
    n, shape = x.shape[axis], tuple(x.shape)
    r = cx.reshape(rank, shape[:axis] + (1,) + shape[axis:])  # i along axis + 1
    at = cx.op("eq", r, iota(cx, n, axis, len(shape) + 1))  # r along axis
    i = iota(cx, n, axis + 1, len(shape) + 1)
    picked = cx.op("select", at, i, cx.scalar(0, "i64"))
    return cx.op("reduce_sum", picked, axes=(axis + 1,), keepdims=False)


def kth_index(cx, x, axis: int, k: int):
    """The index (i64, 1 along `axis`) of x's k-th smallest (1-based) along `axis`:
    the (k-1)-th of the stable order."""
    rank = ranks(cx, x, axis, False)
    at = cx.op("eq", rank, cx.scalar(k - 1, "i64"))
    picked = cx.op("select", at, iota(cx, x.shape[axis], axis, x.type.rank),
                   cx.scalar(0, "i64"))
    return cx.op("reduce_sum", picked, axes=(axis,), keepdims=True)
