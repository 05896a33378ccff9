"""Scatters at positions known only at run time as the IR's `scatter` op, shared by both
importers (ONNX ScatterND, ScatterElements, Scatter, TensorScatter; torch's index_put,
scatter, scatter_add, scatter_reduce, index_add, index_copy, index_fill, put).

`scatter(data, flat, updates)` (compiler/ops/scatter.py) takes flat row-major positions
of data; here they are computed with IR arithmetic from the frameworks' index tensors,
and the scatter kernel reads that arithmetic inline (it folds elementwise and movement
operands), so no position tensor is written:

  ScatterND        flat = (sum_j i_j * S_j) * inner + t     i_j the j-th entry of an
                   index tuple, S_j the strides of data's first k dims, t the position
                   inside one slice of inner = prod(data.shape[k:]) elements
  ScatterElements  flat = i * stride[axis] + sum over d != axis of n_d * stride[d]
  (torch.scatter)  (the second sum a constant the shape of the indices)
  index_put        flat = sum over indexed dims of i_d * stride[d] + the constant part
                   of the dims that are not indexed, over torch's result-of-indexing
                   shape (broadcast index shape in place of adjacent indexed dims,
                   else first)

Each index is checked against its own axis (`scans.checked_index`: [-n, 0) counts from
the end where the op says so, else a negative index is out of range too); one out of
range makes its flat position data.size, which the kernel reports as BrazeIndexError,
as onnxruntime and torch raise, never writing out of bounds. Indices that are constants
take importers/scans.py's gathers instead (faster: the positions are known at import).

A reduction that leaves out the data's own value (torch's include_self=False) first
writes the reduction's identity at every position an update reaches, then reduces; a
mean divides the sum by the count of writes (at least 1) per position.
"""

from __future__ import annotations

import numpy as np

from compiler import dtypes
from importers.scans import _identity, checked_index

def strides(shape) -> np.ndarray:
    """Row-major element strides of `shape`."""
    return np.cumprod((tuple(shape[1:]) + (1,))[::-1])[::-1].astype(np.int64) \
        if len(shape) else np.zeros(0, np.int64)


def _size(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def flat_scatter(cx, data, flat, updates, reduction: str = "none"):
    """The IR scatter of `updates` (cast to data's dtype) into data at the i64 flat
    positions `flat`; both broadcast to one shape where they differ."""
    updates = cx.cast(updates, data.dtype)
    shape = tuple(np.broadcast_shapes(tuple(flat.shape), tuple(updates.shape)))
    if tuple(flat.shape) != shape:
        flat = cx.op("broadcast", flat, shape=shape)
    if tuple(updates.shape) != shape:
        updates = cx.op("broadcast", updates, shape=shape)
    return cx.op("scatter", data, flat, updates, reduction=reduction)


def index_along(cx, idx, n: int, negative: bool):
    """(idx as i64, an i1 where it is out of range) for an axis of n: [-n, 0) counts from
    the end where `negative`, else a negative index is out of range."""
    if not negative:
        i = cx.cast(idx, "i64")
        bad = cx.op("or", cx.op("lt", i, cx.scalar(0, "i64")),
                    cx.op("ge", i, cx.scalar(n, "i64")))
        return i, bad
    return checked_index(cx, idx, n)


def _checked(cx, flat, bad, total: int):
    """flat where bad is false, else `total` (out of range: the kernel reports it)."""
    return cx.op("select", bad, cx.scalar(total, "i64"), flat)


def elements_positions(cx, data_shape, idx, axis: int, negative: bool = True):
    """ScatterElements' (torch.scatter's) flat positions: one per element of idx (same
    rank as data), along `axis` where idx says, elsewhere at the element's own place."""
    st = strides(data_shape)
    grid = np.indices(tuple(idx.shape), dtype=np.int64)
    base = sum((grid[d] * st[d] for d in range(len(data_shape)) if d != axis),
               np.zeros(tuple(idx.shape), np.int64))
    i, bad = index_along(cx, idx, data_shape[axis], negative)
    flat = cx.op("mul", i, cx.scalar(int(st[axis]), "i64"))
    if base.any():
        flat = cx.op("add", flat, cx.const(base))
    return _checked(cx, flat, bad, _size(data_shape))


def nd_positions(cx, data_shape, indices):
    """ScatterND's flat positions, shape indices.shape[:-1] + data_shape[k:] (the
    updates' shape): index tuple k long, negative entries counting from the end."""
    q, k = len(indices.shape), indices.shape[-1]
    batch = tuple(indices.shape[:-1])
    inner_shape = tuple(data_shape[k:])
    inner = _size(inner_shape)
    lead = strides(data_shape[:k])
    slot, bad = None, None
    for j in range(k):
        starts, sizes = [0] * q, list(indices.shape)
        starts[-1], sizes[-1] = j, 1
        comp = cx.op("slice", indices, starts=tuple(starts), steps=(1,) * q,
                     sizes=tuple(sizes))
        i, out = checked_index(cx, cx.reshape(comp, batch), data_shape[j])
        term = cx.op("mul", i, cx.scalar(int(lead[j]) * inner, "i64"))
        slot = term if slot is None else cx.op("add", slot, term)
        bad = out if bad is None else cx.op("or", bad, out)
    if slot is None:  # k == 0: every tuple names all of data
        flat = cx.const(np.broadcast_to(np.arange(inner, dtype=np.int64).reshape(inner_shape),
                                        batch + inner_shape).copy())
        return flat
    keep = batch + (1,) * len(inner_shape)
    flat = cx.reshape(slot, keep)
    if inner > 1:
        flat = cx.op("add", flat, cx.const(np.arange(inner, dtype=np.int64)
                                           .reshape(inner_shape)))
    flat = _checked(cx, flat, cx.reshape(bad, keep), _size(data_shape))
    shape = batch + inner_shape
    return flat if tuple(flat.shape) == shape else cx.op("broadcast", flat, shape=shape)


def index_put_positions(cx, data_shape, given: list, negative: bool = True):
    """torch's x[i0, i1, ...] (index_put, `given` = [(dim, index Value)], integer index
    tensors broadcast together) as flat positions over the shape of the indexing's result:
    the broadcast index shape B in place of the indexed dims where they are adjacent,
    else first, then the other dims in order. Returns (positions, that shape)."""
    rank = len(data_shape)
    dims = [d for d, _ in given]
    b_shape = tuple(np.broadcast_shapes(*[tuple(i.shape) for _, i in given]))
    rest = [d for d in range(rank) if d not in dims]
    adjacent = dims == list(range(dims[0], dims[0] + len(dims)))
    if adjacent:
        before = [d for d in rest if d < dims[0]]
        after = [d for d in rest if d > dims[0]]
        space = tuple(data_shape[d] for d in before) + b_shape + \
            tuple(data_shape[d] for d in after)
        at = len(before)
        place = {d: p for p, d in enumerate(before)}
        place.update({d: at + len(b_shape) + p for p, d in enumerate(after)})
    else:
        space = b_shape + tuple(data_shape[d] for d in rest)
        at = 0
        place = {d: len(b_shape) + p for p, d in enumerate(rest)}
    st = strides(data_shape)
    term, bad = None, None
    for d, idx in given:
        i, out = index_along(cx, idx, data_shape[d], negative)
        t = cx.op("mul", i, cx.scalar(int(st[d]), "i64"))
        term = t if term is None else cx.op("add", term, t)
        bad = out if bad is None else cx.op("or", bad, out)
    keep = (1,) * at + b_shape + (1,) * (len(space) - at - len(b_shape))
    term, bad = (v if tuple(v.shape) == b_shape else cx.op("broadcast", v, shape=b_shape)
                 for v in (term, bad))
    flat = cx.reshape(term, keep)
    base = np.zeros([1] * len(space), np.int64)
    for d, p in place.items():  # the dims not indexed: their part is a constant
        shape = [1] * len(space)
        shape[p] = data_shape[d]
        base = base + (np.arange(data_shape[d], dtype=np.int64) * st[d]).reshape(shape)
    if base.size > 1 or base.any():
        flat = cx.op("add", flat, cx.const(base))
    flat = _checked(cx, flat, cx.reshape(bad, keep), _size(data_shape))
    if tuple(flat.shape) != space:
        flat = cx.op("broadcast", flat, shape=space)
    return flat, space


def dim_positions(cx, data_shape, dim: int, index, negative: bool = False):
    """index_add's, index_copy's and index_fill's positions: data with its `dim` replaced
    by the entries of the 1-d `index` (shape data_shape with dim of len(index))."""
    idx = cx.reshape(index, (index.type.size,))
    return index_put_positions(cx, data_shape, [(dim, idx)], negative)


def reduce_into(cx, data, flat, updates, reduction: str, include_self: bool = True):
    """data reduced with the updates at `flat` (torch's scatter_reduce: reduction add, mul,
    max, min or "mean"; include_self=False: the data's own value left out where an update
    lands)."""
    if reduction == "mean":
        return _mean(cx, data, flat, updates, include_self)
    if not include_self:
        ident = _identity(reduction, data.dtype).reshape(())
        data = flat_scatter(cx, data, flat, cx.const(ident), "none")
    return flat_scatter(cx, data, flat, updates, reduction)


def _mean(cx, data, flat, updates, include_self: bool):
    """The sum of the data (where include_self) and the updates per position over how many
    there were (at least one: a position no update reaches keeps its value)."""
    if data.dtype not in dtypes.FLOATS:
        raise ValueError("a mean of integers (torch floors it)")
    total = reduce_into(cx, data, flat, updates, "add", include_self)
    dt = dtypes.to_numpy(data.dtype)
    start = cx.op("broadcast", cx.const(np.array(1 if include_self else 0, dt)),
                  shape=tuple(data.shape))
    count = flat_scatter(cx, start, flat, cx.const(np.array(1, dt)), "add")
    count = cx.op("max", count, cx.const(np.array(1, dt)))
    return cx.op("div", total, count)
