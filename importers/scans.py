"""Prefix sums, products and running extremes, and take-along-axis gathers as braze IR,
shared by both importers.

cumsum along an axis of n elements is ceil(log2 n) steps of Hillis and Steele's scan:
  y_0 = x;  y_{k+1}[i] = y_k[i] + y_k[i - 2^k]   (the second term 0 where i < 2^k)
each step a slice, a zero pad and an add, all index arithmetic; exact for integers,
for floats a different (tree-like) summation order than a running sum. exclusive
shifts the result by one (the first element 0), reverse flips the axis before and
after (a slice with step -1). cumprod is the same scan with mul, 1 entering instead
of 0.

cummax (cummin) is the same scan over (value, index) pairs: combining an earlier pair
(v1, i1) with a later one (v2, i2) keeps the later where
  isnan(v2) or (not isnan(v1) and v2 >= v1)        (v2 <= v1 for cummin)
so the result is the last NaN so far if there is one, else the last position where
the running max was reached: torch's running loop, which updates on >= and on NaN.
The rule is associative (a segment is summarized by its last NaN, else its last max),
so log-step partial results combine as the running loop's do. A step's shifted pair
does not exist where i < 2^k: the element's own pair is kept there.

take_along_axis (ONNX GatherElements) reads data at a flat index:
  flat[i...] = idx[i...] * stride[axis] + sum over d != axis of i_d * stride[d]
the second sum a constant array the shape of idx; a negative index counts from the
end, and an index out of range would be reported by the flat gather's bounds check
only when it leaves the whole tensor (onnxruntime reports every one), so the index is
first mapped to n where it is out of [-n, n), which makes the flat index out of range too: the gather raises braze's IndexError.
(torch.gather is not converted: torch raises RuntimeError for a bad index.)

scatter_nd (ONNX ScatterND, and ScatterElements) with constant indices is a gather too: where each update
lands is known at compile time, so the output reads, at each flat position, either the
data or the update written there last (reduction "none": one gather from data and
updates side by side, `scatter_nd_ir`), or the data combined with the updates written
there (add, mul, max, min: one gather of the updates per write to the same position,
in order, the positions no update reaches reading the reduction's identity).
"""

from __future__ import annotations

import numpy as np


def _slice(cx, x, axis: int, start: int, step: int, n: int):
    starts, steps, sizes = [0] * x.type.rank, [1] * x.type.rank, list(x.shape)
    starts[axis], steps[axis], sizes[axis] = start, step, n
    return cx.op("slice", x, starts=tuple(starts), steps=tuple(steps), sizes=tuple(sizes))


def _shift(cx, x, axis: int, by: int, fill: float = 0.0):
    """x moved `by` places up along `axis`, `fill` entering at the start."""
    n = x.shape[axis]
    kept = _slice(cx, x, axis, 0, 1, n - by)
    pads = [0] * (2 * x.type.rank)
    pads[axis] = by
    return cx.op("pad", kept, pads=tuple(pads), mode="constant", value=fill)


def cumsum_ir(cx, x, axis: int, exclusive: bool = False, reverse: bool = False):
    """The prefix sums of x along `axis` (module doc)."""
    return _scan(cx, x, axis, lambda a, b: cx.op("add", a, b), 0.0, exclusive, reverse)


def cumprod_ir(cx, x, axis: int, exclusive: bool = False, reverse: bool = False):
    """The prefix products of x along `axis` (module doc)."""
    return _scan(cx, x, axis, lambda a, b: cx.op("mul", a, b), 1.0, exclusive, reverse)


def logcumsumexp_ir(cx, x, axis: int):
    """log(cumsum(exp(x))) along `axis` without overflow: the same scan combining by
    logaddexp(a, b) = max(a, b) + log1p(exp(-|a - b|)) (max itself where it is
    infinite: both -inf, or +inf), identity -inf; NaN propagates."""
    def logaddexp(a, b):
        m = cx.op("max", a, b)
        r = cx.op("add", m, cx.op("log1p", cx.op("exp", cx.op("neg", cx.op(
            "abs", cx.op("sub", a, b))))))
        return cx.op("select", cx.op("isinf", m), m, r)

    return _scan(cx, x, axis, logaddexp, -np.inf, False, False)


def _scan(cx, x, axis: int, combine, identity: float, exclusive: bool, reverse: bool):
    """Hillis and Steele's scan of x along `axis` with `combine` (two IR values -> one),
    whose identity enters where a step reads before the start."""
    n = x.shape[axis]
    if n is None:
        raise ValueError("a dynamic scan length")
    if n == 0:
        return x
    if reverse:
        x = _slice(cx, x, axis, n - 1, -1, n)
    y, span = x, 1
    while span < n:
        y = combine(y, _shift(cx, y, axis, span, identity))
        span *= 2
    if exclusive:
        y = _shift(cx, y, axis, 1, identity)
    if reverse:
        y = _slice(cx, y, axis, n - 1, -1, n)
    return y


def cumulative_extreme_ir(cx, x, axis: int, largest: bool) -> tuple:
    """(values, i64 indices): the running max (min) of x along `axis` and the last
    position that reached it, NaN winning (module doc). x's dtype: float, int or u8."""
    from compiler import dtypes

    n, rank = x.shape[axis], x.type.rank
    shape = [1] * rank
    shape[axis] = n
    iota = np.arange(n, dtype=np.int64).reshape(shape)
    v, i, span = x, cx.op("broadcast", cx.const(iota), shape=tuple(x.shape)), 1
    while span < n:
        pv, pi = _shift(cx, v, axis, span), _shift(cx, i, axis, span)
        later = cx.op("ge" if largest else "le", v, pv)
        if x.dtype in dtypes.FLOATS:
            later = cx.op("or", cx.op("isnan", v),
                          cx.op("and", later, cx.op("not", cx.op("isnan", pv))))
        keep = cx.op("and", cx.const(iota >= span), cx.op("not", later))
        v, i = cx.op("select", keep, pv, v), cx.op("select", keep, pi, i)
        span *= 2
    return v, i


def checked_index(cx, idx, n) -> tuple:
    """(idx as i64 with [-n, 0) counted from the end, an i1 that is true where it is out of
    [0, n)): a flat index built from several such is made out of range where any is
    (a flat index alone could land inside the tensor). `n` is one size, or one per
    entry of idx's last dim (GatherND's index tuples)."""
    i = cx.cast(idx, "i64")
    size = cx.scalar(n, "i64") if np.ndim(n) == 0 else cx.const(np.asarray(n, np.int64))
    below = cx.op("lt", i, cx.scalar(0, "i64"))
    i = cx.op("select", below, cx.op("add", i, size), i)
    bad = cx.op("or", cx.op("lt", i, cx.scalar(0, "i64")), cx.op("ge", i, size))
    return i, bad


def take_along_axis_ir(cx, data, idx, axis: int):
    """data read along `axis` at idx (same rank; module doc); indices in [-n, 0) count
    from the end."""
    shape, ishape = data.shape, idx.shape
    strides = np.cumprod((shape[1:] + (1,))[::-1])[::-1].astype(np.int64)
    grid = np.indices(ishape, dtype=np.int64)
    base = sum((grid[d] * strides[d] for d in range(len(shape)) if d != axis),
               np.zeros(ishape, np.int64))
    i, bad = checked_index(cx, idx, shape[axis])
    total = int(np.prod(shape))
    flat_i = cx.op("add", cx.op("mul", i, cx.scalar(int(strides[axis]), "i64")),
                   cx.const(base))
    flat_i = cx.op("select", bad, cx.scalar(total, "i64"), flat_i)
    flat = cx.reshape(data, (total,))
    return cx.op("gather", flat, flat_i, axis=0)


# Writes to one position a reducing ScatterND may make (one gather each, in order).
SCATTER_MAX_REPEATS = 8
_REDUCE = {"add": "add", "mul": "mul", "max": "max", "min": "min"}


def scatter_positions(data_shape, indices: np.ndarray) -> np.ndarray:
    """The flat positions of data each update element writes, in update order (shape
    updates.shape); ValueError for an index out of [-n, n)."""
    k = indices.shape[-1]
    lead = tuple(data_shape[:k])
    idx = indices.reshape(-1, k).astype(np.int64)
    dims = np.asarray(lead, dtype=np.int64)
    if np.any(idx < -dims) or np.any(idx >= dims):
        raise ValueError("an index out of range")
    idx = np.where(idx < 0, idx + dims, idx)
    inner = int(np.prod(data_shape[k:], dtype=np.int64))
    slots = np.ravel_multi_index(tuple(idx.T), lead) if k else np.zeros(len(idx), np.int64)
    pos = slots[:, None] * inner + np.arange(inner, dtype=np.int64)[None, :]
    return pos.reshape(indices.shape[:-1] + tuple(data_shape[k:]))


def scatter_elements_positions(data_shape, indices: np.ndarray, axis: int) -> np.ndarray:
    """ONNX ScatterElements' writes as flat positions of data (shape indices.shape): each
    update goes to its own place but along `axis`, where the index says; ValueError for
    an index out of [-n, n)."""
    n = data_shape[axis]
    idx = indices.astype(np.int64)
    if np.any(idx < -n) or np.any(idx >= n):
        raise ValueError("an index out of range")
    grid = list(np.indices(indices.shape, dtype=np.int64))
    grid[axis] = np.where(idx < 0, idx + n, idx)
    return np.ravel_multi_index(tuple(grid), data_shape).astype(np.int64)


def scatter_nd_ir(cx, data, updates, positions: np.ndarray, reduction: str = "none"):
    """data with `updates` written at flat `positions` (scatter_positions), reduced by
    `reduction` (module doc)."""
    total = int(np.prod(data.shape, dtype=np.int64))
    flat = cx.reshape(data, (total,))
    writes = positions.reshape(-1)
    n_upd = writes.size
    flat_upd = cx.reshape(updates, (n_upd,))
    if reduction == "none":
        source = np.arange(total, dtype=np.int64)
        source[writes] = total + np.arange(n_upd, dtype=np.int64)  # the last write wins
        both = cx.op("concat", flat, flat_upd, axis=0)
        return cx.reshape(cx.op("gather", both, cx.const(source), axis=0), data.shape)
    # the k-th write to each position, for k = 0, 1, ...; n_upd: none (the identity)
    order = np.argsort(writes, kind="stable")
    counts = np.bincount(writes, minlength=total)
    if counts.max(initial=0) > SCATTER_MAX_REPEATS:
        raise ValueError(f"more than {SCATTER_MAX_REPEATS} writes to one position")
    start = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.empty(n_upd, dtype=np.int64)
    rank[order] = np.arange(n_upd) - start[writes[order]]
    identity = _identity(reduction, updates.dtype)
    padded = cx.op("concat", flat_upd, cx.const(identity), axis=0)
    out = flat
    for k in range(int(counts.max(initial=0))):
        source = np.full(total, n_upd, dtype=np.int64)
        hit = rank == k
        source[writes[hit]] = np.nonzero(hit)[0]
        out = cx.op(_REDUCE[reduction], out, cx.op("gather", padded, cx.const(source), axis=0))
    return cx.reshape(out, data.shape)


def _identity(reduction: str, dtype: str) -> np.ndarray:
    """A one-element array of `dtype` (braze's name): the reduction's identity."""
    from compiler import dtypes

    dt = np.dtype(dtypes.to_numpy(dtype))
    if reduction in ("add", "mul"):
        return np.array([0 if reduction == "add" else 1], dtype=dt)
    if dt.kind == "f":
        return np.array([-np.inf if reduction == "max" else np.inf], dtype=dt)
    if dt.kind == "b":
        return np.array([reduction == "min"], dtype=dt)
    info = np.iinfo(dt)
    return np.array([info.min if reduction == "max" else info.max], dtype=dt)
