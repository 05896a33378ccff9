"""aten view, shape and data-movement ops -> IR movement ops.

Values in the IR are logical tensors (no strides), so views, `clone` and
`contiguous` are reshapes or identities; the target shape is always the one the
node's fake value states (that resolves -1 and SymInts for us). aten's slice
clamps its bounds; IR `slice` is exact (start, step, size), so the clamping
happens here.
"""

from __future__ import annotations

import numpy as np
import torch

from compiler.ir import Value
from importers.fx_context import Ctx, Fallback, converts, norm_dim

aten = torch.ops.aten


@converts(aten.view.default, aten._unsafe_view.default, aten.reshape.default,
          aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.unsqueeze.default,
          aten.view_copy.default, aten.flatten.using_ints, aten.expand_copy.default)
def _reshape(cx: Ctx, x, *rest):
    out = cx.out()
    if cx.target is aten.expand_copy.default:
        return cx.op("broadcast", x, shape=out.shape)
    return cx.reshape(x, out.shape)


@converts(aten.permute.default, aten.permute_copy.default)
def _permute(cx: Ctx, x, dims):
    perm = tuple(norm_dim(d, x.type.rank) for d in dims)
    if perm == tuple(range(x.type.rank)):
        return x
    return cx.op("transpose", x, perm=perm)


@converts(aten.t.default)
def _t(cx: Ctx, x):
    return x if x.type.rank < 2 else cx.op("transpose", x, perm=(1, 0))


@converts(aten.transpose.int)
def _transpose(cx: Ctx, x, d0, d1):
    perm = list(range(x.type.rank))
    a, b = norm_dim(d0, x.type.rank), norm_dim(d1, x.type.rank)
    perm[a], perm[b] = perm[b], perm[a]
    return _permute(cx, x, perm)


@converts(aten.expand.default)
def _expand(cx: Ctx, x, sizes, implicit=False):
    out = cx.out().shape
    return x if x.shape == out else cx.op("broadcast", x, shape=out)


@converts(aten.full_like.default)
def _full_like(cx: Ctx, x, fill_value, **kwargs):
    """A scalar broadcast to x's shape (only x's metadata is read; zeros_like decomposes
    to this)."""
    return _filled(cx, fill_value)


def _filled(cx: Ctx, value):
    """The node's output shape and dtype filled with the scalar `value`."""
    out = cx.out()
    v = cx.scalar(value, out.dtype)
    return v if out.shape == () else cx.op("broadcast", v, shape=out.shape)


@converts(aten.new_empty_strided.default)
def _new_empty_strided(cx: Ctx, x, size, stride, **kwargs):
    """An uninitialized tensor of x's kind: zeros (any values are its contents; only x's
    metadata is read)."""
    return _filled(cx, 0)


def slice_bounds(size: int, start, end, step: int) -> tuple[int, int]:
    """aten.slice's clamping: (start, length) of the selected range."""
    start = 0 if start is None else start
    end = size if end is None else end
    if start < 0:
        start += size
    if end < 0:
        end += size
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    return start, -(-(end - start) // step)


def slice_dim(cx: Ctx, x, dim: int, start: int, step: int, n: int):
    """IR slice of n elements along `dim` from `start` by `step`."""
    if n == x.shape[dim] and start == 0 and step == 1:
        return x
    starts = [0] * x.type.rank
    steps = [1] * x.type.rank
    sizes = list(x.shape)
    starts[dim], steps[dim], sizes[dim] = (start if n else 0), step, n
    return cx.op("slice", x, starts=starts, steps=steps, sizes=sizes)


@converts(aten.slice.Tensor, aten.slice_copy.Tensor)
def _slice(cx: Ctx, x, dim=0, start=None, end=None, step=1):
    if step < 1:
        raise Fallback(f"slice step {step}")
    d = norm_dim(dim, x.type.rank)
    s, n = slice_bounds(x.shape[d], start, end, step)
    return slice_dim(cx, x, d, s, step, n)


@converts(aten.narrow.default, aten.narrow_copy.default)
def _narrow(cx: Ctx, x, dim, start, length):
    d = norm_dim(dim, x.type.rank)
    start = start + x.shape[d] if start < 0 else start
    return slice_dim(cx, x, d, start, 1, length)


@converts(aten.select.int, aten.select_copy.int)
def _select(cx: Ctx, x, dim, index):
    d = norm_dim(dim, x.type.rank)
    i = index + x.shape[d] if index < 0 else index
    if not 0 <= i < x.shape[d]:
        raise Fallback(f"index {index} out of range for dim {dim} of size {x.shape[d]}")
    # a gather of one constant index, as ONNX's Gather writes it: kernels read it with
    # plain strides (a unit slice then a reshape dropping the dim cost braze's attention
    # kernel 2.5x in index arithmetic on Swin's q, k and v)
    return cx.op("gather", x, cx.const(np.int64(i)), axis=d)


@converts(aten.unbind.int)
def _unbind(cx: Ctx, x, dim=0):
    return _split(cx, x, 1, dim)


@converts(aten.split_with_sizes.default, aten.split.Tensor, aten.split_with_sizes_copy.default)
def _split(cx: Ctx, x, sizes, dim=0):
    d = norm_dim(dim, x.type.rank)
    if isinstance(sizes, int):
        size = max(sizes, 1)
        sizes = [min(size, x.shape[d] - s) for s in range(0, x.shape[d], size)] or [0]
    parts, at = [], 0
    for i, n in enumerate(sizes):
        part = slice_dim(cx, x, d, at, 1, n)
        parts.append(cx.reshape(part, cx.out(i).shape))
        at += n
    return tuple(parts)


@converts(aten.cat.default)
def _cat(cx: Ctx, tensors, dim=0):
    out = cx.out()
    # torch.cat skips 1-d empty tensors (legacy behaviour); so does the IR's concat here
    parts = [cx.cast(t, out.dtype) for t in tensors if not (t.shape == (0,) and out.rank != 1)]
    if not parts:
        return cx.const(torch.zeros(out.shape).numpy(), out.dtype)
    return parts[0] if len(parts) == 1 else cx.op("concat", *parts,
                                                   axis=norm_dim(dim, out.rank))


@converts(aten.stack.default)
def _stack(cx: Ctx, tensors, dim=0):
    out = cx.out()
    d = norm_dim(dim, out.rank)
    parts = [cx.reshape(cx.cast(t, out.dtype), t.shape[:d] + (1,) + t.shape[d:])
             for t in tensors]
    return parts[0] if len(parts) == 1 else cx.op("concat", *parts, axis=d)


@converts(aten.flip.default)
def _flip(cx: Ctx, x, dims):
    r = x.type.rank
    flipped = {norm_dim(d, r) for d in dims}
    if not flipped or any(x.shape[d] == 0 for d in flipped):
        return x
    starts = [x.shape[d] - 1 if d in flipped else 0 for d in range(r)]
    steps = [-1 if d in flipped else 1 for d in range(r)]
    return cx.op("slice", x, starts=starts, steps=steps, sizes=x.shape)


@converts(aten.roll.default)
def _roll(cx: Ctx, x, shifts, dims=()):
    if not dims:
        flat = cx.reshape(x, (x.type.size,))
        return cx.reshape(_roll_dim(cx, flat, 0, shifts[0]), x.shape)
    for s, d in zip(shifts, dims):
        x = _roll_dim(cx, x, norm_dim(d, x.type.rank), s)
    return x


def _roll_dim(cx: Ctx, x, d: int, shift: int):
    n = x.shape[d]
    if n == 0 or shift % n == 0:
        return x
    k = shift % n
    tail = slice_dim(cx, x, d, n - k, 1, k)
    head = slice_dim(cx, x, d, 0, 1, n - k)
    return cx.op("concat", tail, head, axis=d)


@converts(aten.repeat.default)
def _repeat(cx: Ctx, x, repeats):
    out = cx.out().shape
    lead = len(repeats) - x.type.rank
    shape = (1,) * lead + x.shape
    # interleave a size-1 axis before every dim, broadcast it to the repeat count
    y = cx.reshape(x, tuple(d for s in shape for d in (1, s)))
    y = cx.op("broadcast", y, shape=tuple(d for r, s in zip(repeats, shape) for d in (r, s)))
    return cx.reshape(y, out)


@converts(aten.constant_pad_nd.default)
def _pad(cx: Ctx, x, pad, value=0):
    r = x.type.rank
    begins, ends = [0] * r, [0] * r
    for i in range(len(pad) // 2):
        begins[r - 1 - i], ends[r - 1 - i] = pad[2 * i], pad[2 * i + 1]
    # negative pads crop: a slice first, then the non-negative padding
    if any(p < 0 for p in begins + ends):
        for d in range(r):
            lo, hi = max(-begins[d], 0), max(-ends[d], 0)
            if lo or hi:
                x = slice_dim(cx, x, d, lo, 1, max(x.shape[d] - lo - hi, 0))
        begins, ends = [max(p, 0) for p in begins], [max(p, 0) for p in ends]
    if not any(begins + ends):
        return x
    if isinstance(value, float) and not value.is_integer() and x.dtype not in ("f16", "f32",
                                                                                "f64"):
        raise Fallback(f"pad value {value} for dtype {x.dtype}")
    return cx.op("pad", x, pads=begins + ends, mode="constant", value=float(value))


@converts(aten.as_strided.default, aten.as_strided_copy.default)
def _as_strided(cx: Ctx, x, size, stride, storage_offset=None):
    """out[i] = storage[offset + sum_k i_k * stride_k] over x's storage. The IR holds x in
    logical row-major order, which is its storage order when x is contiguous: then this is
    a reshape (when it reads every element in order) or a gather at indices known now."""
    fake = cx.arg_vals[0] if cx.arg_vals else None
    if not isinstance(fake, torch.Tensor) or not fake.is_contiguous():
        raise Fallback("as_strided of a tensor that is not contiguous (its storage order is "
                       "not the IR's)")
    offset = (fake.storage_offset() if storage_offset is None else int(storage_offset)) \
        - fake.storage_offset()
    size, stride = [int(d) for d in size], [int(s) for s in stride]
    index = np.full(size, offset, np.int64)
    for k, (n, s) in enumerate(zip(size, stride)):
        index += (np.arange(n, dtype=np.int64) * s).reshape([-1 if j == k else 1
                                                             for j in range(len(size))])
    numel = int(np.prod(x.shape, dtype=np.int64))
    if index.size and (index.min() < 0 or index.max() >= numel):
        raise Fallback("as_strided reads outside its input's elements")
    flat = cx.reshape(x, (numel,))
    if index.size == numel and np.array_equal(index.reshape(-1), np.arange(numel)):
        return cx.reshape(x, size)
    return cx.op("gather", flat, cx.const(index), axis=0)


@converts(aten.index_select.default)
def _index_select(cx: Ctx, x, dim, index):
    d = norm_dim(dim, x.type.rank)
    index = _no_negative(cx, index, x.shape[d] if x.type.rank else 1)
    return cx.reshape(cx.op("gather", x, index, axis=d), cx.out().shape)


@converts(aten.embedding.default)
def _embedding(cx: Ctx, weight, indices, padding_idx=-1, scale_grad=False, sparse=False):
    return cx.op("gather", weight, _no_negative(cx, indices, weight.shape[0]), axis=0)


def _no_negative(cx: Ctx, index, n: int):
    """torch's embedding and index_select take no negative index (IR gather counts them
    from the end): map one to n, which the gather's bounds check reports."""
    return cx.op("select", cx.op("lt", index, cx.scalar(0, index.dtype)),
                 cx.scalar(n, index.dtype), index)


@converts(aten.index.Tensor)
def _index(cx: Ctx, x, indices):
    """x[i] as a gather along i's dim; x[i, j, ...] (several index tensors, broadcast
    together) as one gather over those dims merged, at the flat index i * n_j + j: where
    the indexed dims are adjacent the result's broadcast dims stand in their place, else
    first (torch's rule; the dims are moved to the front). Each index is checked against
    its own dim (a flat index alone could land inside the tensor): one out of range
    makes the flat index out of range, which the gather reports (IndexError, as torch)."""
    given = [(d, i) for d, i in enumerate(indices) if i is not None]
    if any(i.dtype not in ("i32", "i64") for _, i in given):
        raise Fallback("a bool index (a mask gives a data-dependent shape)")
    if len(given) == 1:
        d, idx = given[0]
        return cx.op("gather", x, idx, axis=d)
    if not x.type.static:
        raise Fallback("advanced indexing with several index tensors of a dynamic tensor")
    dims = [d for d, _ in given]
    if dims != list(range(dims[0], dims[0] + len(dims))):  # apart: they go first
        rest = [d for d in range(x.type.rank) if d not in dims]
        x = cx.op("transpose", x, perm=tuple(dims + rest))
        dims = list(range(len(dims)))
    sizes = [x.shape[d] for d in dims]
    merged = int(np.prod(sizes, dtype=np.int64))
    from importers.scans import checked_index

    flat, bad = None, None
    for (_, idx), n, stride in zip(given, sizes,
                                   np.cumprod([1] + sizes[::-1])[-2::-1].tolist()):
        i, out = checked_index(cx, idx, n)
        term = cx.op("mul", i, cx.scalar(int(stride), "i64"))
        flat = term if flat is None else cx.op("add", flat, term)
        bad = out if bad is None else cx.op("or", bad, out)
    flat = cx.op("select", bad, cx.scalar(merged, "i64"), flat)
    shape = x.shape[:dims[0]] + (merged,) + x.shape[dims[-1] + 1:]
    return cx.reshape(cx.op("gather", cx.reshape(x, shape), flat, axis=dims[0]),
                      cx.out().shape)


@converts(aten.slice_scatter.default)
def _slice_scatter(cx: Ctx, x, src, dim=0, start=None, end=None, step=1):
    """x with src written over x[start:end:step] along dim: a gather from x and src side
    by side (importers/scans.py), the positions known now."""
    from importers.scans import scatter_nd_ir

    if step < 1:
        raise Fallback(f"slice_scatter step {step}")
    d = norm_dim(dim, x.type.rank)
    lo, n = slice_bounds(x.shape[d], start, end, step)
    along = lo + step * np.arange(n, dtype=np.int64)
    return _scatter_along(cx, x, src, d, along.reshape(
        [-1 if k == d else 1 for k in range(x.type.rank)]), scatter_nd_ir)


@converts(aten.select_scatter.default)
def _select_scatter(cx: Ctx, x, src, dim, index):
    """x with src written over x.select(dim, index) (as slice_scatter)."""
    from importers.scans import scatter_nd_ir

    d = norm_dim(dim, x.type.rank)
    n = x.shape[d]
    if not -n <= index < n:
        raise Fallback(f"select_scatter index {index} out of range for size {n}")
    src = cx.reshape(src, tuple(1 if k == d else x.shape[k] for k in range(x.type.rank)))
    return _scatter_along(cx, x, src, d, np.array(index % n, dtype=np.int64).reshape(
        [1] * x.type.rank), scatter_nd_ir)


def _scatter_along(cx: Ctx, x, src, d: int, along: np.ndarray, scatter_nd_ir):
    """x with src (x's shape but along `d`) written where `along` (positions along d,
    broadcast over the other dims) says: ONNX ScatterElements' positions."""
    from importers.scans import scatter_elements_positions

    if not x.type.static or not src.type.static:
        raise Fallback("a scatter into a dynamic tensor")
    positions = scatter_elements_positions(x.shape, np.broadcast_to(along, src.shape), d)
    return scatter_nd_ir(cx, x, cx.cast(src, x.dtype), positions)


@converts(aten.index_put.default)
def _index_put(cx: Ctx, x, indices, values, accumulate=False):
    """torch's functional x[idx] = values (x[idx] += values with `accumulate`): a bool
    mask over x's leading dims with one value (x[x < 0] = 0) is a select; constant
    integer indices (one tensor per leading dim, None for none) are positions known now,
    a gather from x and the values side by side (importers/scans.py); indices computed at
    run time (index_add, index_copy, max_unpool and a KV cache's position decompose to
    this) are the IR's scatter at flat positions computed from them
    (importers/scatter.py; negative indices count from the end, as torch's do). A mask
    with one value per True (a data-dependent count) stays on torch."""
    from importers.scans import scatter_nd_ir, scatter_positions
    from importers.scatter import flat_scatter, index_put_positions

    given = list(indices)
    if not x.type.static or not values.type.static:
        raise Fallback("index_put into a dynamic tensor")
    if len(given) == 1 and given[0] is not None and given[0].dtype == "bool":
        mask = given[0]
        if int(np.prod(values.shape, dtype=np.int64)) != 1:
            raise Fallback("index_put of a mask with one value per True element")
        mask = cx.reshape(mask, tuple(mask.shape) + (1,) * (x.type.rank - mask.type.rank))
        v = cx.reshape(cx.cast(values, x.dtype), ())
        if accumulate:
            return cx.op("add", x, cx.op("select", mask, v, cx.scalar(0, x.dtype)))
        return cx.op("select", mask, cx.op("broadcast", v, shape=x.shape), x)
    pairs = [(d, i) for d, i in enumerate(given) if i is not None]
    if not pairs or any(i.dtype not in ("i32", "i64") or not i.type.static for _, i in pairs):
        raise Fallback("index_put with a bool index beside others, or no index")
    reduction = "add" if accumulate else "none"
    if x.dtype == "bool" and accumulate:
        raise Fallback("index_put accumulating into bools")
    if all(i.is_const for _, i in pairs) and all(i is not None for i in given):
        arrays = np.broadcast_arrays(*[np.asarray(i.const_value, dtype=np.int64)
                                       for i in given])
        try:  # ScatterND's positions: one index tuple per leading dims' slice
            positions = scatter_positions(x.shape, np.stack(arrays, axis=-1))
            upd = cx.op("broadcast", cx.cast(values, x.dtype), shape=positions.shape) \
                if tuple(values.shape) != positions.shape else cx.cast(values, x.dtype)
            if accumulate or len(np.unique(positions)) == positions.size:
                return scatter_nd_ir(cx, x, upd, positions, reduction)
        except ValueError:  # out of range (reported at run time) or many repeats
            pass
    flat, _ = index_put_positions(cx, x.shape, pairs)
    return flat_scatter(cx, x, flat, values, reduction)


def _along(cx: Ctx, x, dim, index):
    """(x as at least 1-d, the dim) for torch's scatter family (a 0-d tensor is one
    element along dim 0)."""
    if not x.type.static or not index.type.static:
        raise Fallback("a scatter into a dynamic tensor")
    if index.dtype not in ("i32", "i64"):
        raise Fallback(f"scatter indices of dtype {index.dtype}")
    d = norm_dim(dim, x.type.rank)
    return (cx.reshape(x, (1,)) if x.type.rank == 0 else x), d


def _scatter_src(cx: Ctx, x, d: int, index, src):
    """(index, updates) for torch.scatter's family: index names positions along d, src
    read at index's own positions (torch takes only that corner of a larger src)."""
    rank = x.type.rank
    index = cx.reshape(index, (1,) * rank) if index.type.rank == 0 else index
    if index.type.rank != rank or any(
            i > n for a, (i, n) in enumerate(zip(index.shape, x.shape)) if a != d):
        raise Fallback(f"scatter indices {index.shape} for {x.shape} along {d}")
    if isinstance(src, Value):
        src = cx.reshape(src, (1,) * rank) if src.type.rank == 0 else src
        if src.type.rank != rank or any(s < i for s, i in zip(src.shape, index.shape)):
            raise Fallback(f"scatter source {src.shape} smaller than its indices {index.shape}")
        if tuple(src.shape) != tuple(index.shape):
            src = cx.op("slice", src, starts=(0,) * rank, steps=(1,) * rank,
                        sizes=tuple(index.shape))
        upd = cx.cast(src, x.dtype)
    else:
        upd = cx.op("broadcast", cx.tensor(src, x.dtype), shape=tuple(index.shape))
    return index, upd


def _known_positions(cx: Ctx, x, d: int, index, along, upd, red: str, include_self: bool):
    """The scatter by scans.py's gathers where `index` is a constant (its entries laid out
    as `along`, broadcast to the updates' shape), every entry in range (torch takes no
    negative one) and the reduction one they do; else None."""
    from importers.scans import scatter_elements_positions, scatter_nd_ir

    if not index.is_const or red == "mean" or not include_self:
        return None
    idx = np.asarray(index.const_value, dtype=np.int64).reshape(along)
    if (idx < 0).any():
        return None
    idx = np.broadcast_to(idx, tuple(upd.shape))
    try:
        positions = scatter_elements_positions(x.shape, idx, d)
        return scatter_nd_ir(cx, x, upd, positions, red)
    except ValueError:  # out of range (reported at run time) or many repeats
        return None


_SCATTER_REDUCE = {"add": "add", "multiply": "mul", "sum": "add", "prod": "mul",
                   "amax": "max", "amin": "min", "mean": "mean"}


def _scatter_into(cx: Ctx, x, dim, index, src, reduce=None, include_self=True):
    """torch.scatter's family: the IR's scatter at positions along dim (no negative
    index: torch raises), or scans.py's gathers where the index is a constant."""
    from importers.scatter import elements_positions, flat_scatter, reduce_into

    shape = tuple(x.shape)
    x1, d = _along(cx, x, dim, index)
    if index.type.size == 0:
        return x
    index1, upd = _scatter_src(cx, x1, d, index, src)
    red = "none" if reduce is None else _SCATTER_REDUCE.get(reduce)
    if red is None:
        raise Fallback(f"scatter reduce={reduce!r}")
    if red != "none" and x.dtype == "bool":
        raise Fallback(f"scatter reducing bools ({reduce})")
    along = tuple(index.shape) if index.type.rank else (1,) * x1.type.rank
    known = _known_positions(cx, x1, d, index, along, upd, red, include_self)
    if known is not None:
        return cx.reshape(known, shape)
    flat = elements_positions(cx, x1.shape, index1, d, negative=False)
    try:
        out = flat_scatter(cx, x1, flat, upd, red) if red == "none" else \
            reduce_into(cx, x1, flat, upd, red, include_self)
    except ValueError as e:
        raise Fallback(f"scatter_reduce: {e}") from None
    return cx.reshape(out, shape)


@converts(aten.scatter.src, aten.scatter.value)
def _scatter(cx: Ctx, x, dim, index, src):
    """torch.scatter: src (or a number) written along dim where index says, in order (the
    last write to a place wins: torch leaves repeats' order open, its CPU kernel is in
    order too); the IR's scatter (importers/scatter.py)."""
    return _scatter_into(cx, x, dim, index, src)


@converts(aten.scatter.reduce, aten.scatter.value_reduce)
def _scatter_reduce_old(cx: Ctx, x, dim, index, src, reduce):
    return _scatter_into(cx, x, dim, index, src, reduce)


@converts(aten.scatter_add.default)
def _scatter_add(cx: Ctx, x, dim, index, src):
    """GNN message passing's sum over edges: the IR's scatter with add, in index order."""
    return _scatter_into(cx, x, dim, index, src, "sum")


@converts(aten.scatter_reduce.two)
def _scatter_reduce(cx: Ctx, x, dim, index, src, reduce, include_self=True):
    """scatter_reduce: sum, prod, amax, amin (include_self=False: the identity written
    first where an update lands), mean of floats (importers/scatter.py)."""
    return _scatter_into(cx, x, dim, index, src, reduce, include_self)


def _index_dim(cx: Ctx, x, dim, index, source, reduction: str, alpha=1,
               include_self: bool = True):
    """index_add, index_copy, index_fill and index_reduce: `source` written (or reduced)
    over x's slices along dim that index names (no negative index: torch raises)."""
    from importers.scatter import dim_positions, flat_scatter, reduce_into

    if not x.type.static or not index.type.static or index.dtype not in ("i32", "i64"):
        raise Fallback(f"{cx.target} of a dynamic tensor or non-integer index")
    if x.dtype == "bool" and reduction != "none":
        raise Fallback("index_add of bools")
    shape = tuple(x.shape)
    x1 = cx.reshape(x, (1,)) if x.type.rank == 0 else x
    d = norm_dim(dim, x.type.rank)
    if index.type.size == 0:
        return x
    space = x1.shape[:d] + (index.type.size,) + x1.shape[d + 1:]
    if isinstance(source, Value):
        upd = cx.cast(source, x.dtype)
        upd = cx.reshape(upd, space) if upd.type.size == int(np.prod(space)) and \
            upd.type.rank != len(space) else upd
    else:
        upd = cx.tensor(source, x.dtype)
    if alpha != 1:
        upd = cx.op("mul", upd, cx.tensor(alpha, x.dtype))
    if tuple(upd.shape) != space:
        upd = cx.op("broadcast", upd, shape=space)
    along = [1] * len(space)
    along[d] = index.type.size
    known = _known_positions(cx, x1, d, index, tuple(along), upd, reduction, include_self)
    if known is not None:
        return cx.reshape(known, shape)
    flat, _ = dim_positions(cx, x1.shape, d, index)
    if reduction == "none":
        return cx.reshape(flat_scatter(cx, x1, flat, upd, reduction), shape)
    try:
        return cx.reshape(reduce_into(cx, x1, flat, upd, reduction, include_self), shape)
    except ValueError as e:
        raise Fallback(f"{cx.target}: {e}") from None


@converts(aten.index_add.default)
def _index_add(cx: Ctx, x, dim, index, source, alpha=1):
    return _index_dim(cx, x, dim, index, source, "add", alpha)


@converts(aten.index_reduce.default)
def _index_reduce(cx: Ctx, x, dim, index, source, reduce, include_self=True):
    red = {"prod": "mul", "amax": "max", "amin": "min", "mean": "mean"}.get(reduce)
    if red is None:
        raise Fallback(f"index_reduce {reduce!r}")
    return _index_dim(cx, x, dim, index, source, red, include_self=include_self)


@converts(aten.index_copy.default)
def _index_copy(cx: Ctx, x, dim, index, source):
    return _index_dim(cx, x, dim, index, source, "none")


@converts(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def _index_fill(cx: Ctx, x, dim, index, value):
    if isinstance(value, Value):
        value = cx.reshape(value, ())
    return _index_dim(cx, x, dim, index, value, "none")


@converts(aten.put.default)
def _put(cx: Ctx, x, index, source, accumulate=False):
    """Tensor.put: source written (or added) at flat positions of x (negative ones count
    from the end)."""
    from importers.scans import checked_index
    from importers.scatter import flat_scatter

    if not x.type.static or not index.type.static or index.dtype not in ("i32", "i64"):
        raise Fallback("put into a dynamic tensor or at non-integer indices")
    if x.dtype == "bool" and accumulate:
        raise Fallback("put accumulating into bools")
    if index.type.size == 0:
        return x
    total = x.type.size
    i, bad = checked_index(cx, index, total)
    flat = cx.op("select", bad, cx.scalar(total, "i64"), i)
    upd = cx.reshape(cx.cast(source, x.dtype), tuple(index.shape))
    return flat_scatter(cx, x, flat, upd, "add" if accumulate else "none")


@converts(aten.copy.default)
def _copy(cx: Ctx, x, src, non_blocking=False):
    """The functional copy_: src in x's dtype, broadcast to x's shape."""
    out = cx.out()
    y = cx.cast(src, out.dtype)
    return y if tuple(y.shape) == tuple(out.shape) else cx.op("broadcast", y, shape=out.shape)


@converts(aten.cumsum.default)
def _cumsum(cx: Ctx, x, dim, dtype=None):
    """Prefix sums by a log-step scan (importers/scans.py), in the result's dtype."""
    from importers.scans import cumsum_ir

    return _scan(cx, cumsum_ir, x, dim)


@converts(aten.logcumsumexp.default)
def _logcumsumexp(cx: Ctx, x, dim):
    """log(cumsum(exp(x))) by the same scan combining with logaddexp (scans.py), floats
    only."""
    from importers.scans import logcumsumexp_ir

    if cx.out().dtype not in ("f32", "f64"):
        raise Fallback(f"logcumsumexp of {cx.out().dtype}")
    return _scan(cx, logcumsumexp_ir, x, dim)


@converts(aten.cumprod.default)
def _cumprod(cx: Ctx, x, dim, dtype=None):
    """Prefix products by the same scan, in the result's dtype."""
    from importers.scans import cumprod_ir

    return _scan(cx, cumprod_ir, x, dim)


def _scan(cx: Ctx, scan, x, dim):
    out = cx.out()
    if not x.type.static or out.dtype == "bool":
        raise Fallback("a scan of a dynamic or bool tensor")
    if x.type.rank == 0:
        return cx.cast(x, out.dtype)
    return scan(cx, cx.cast(x, out.dtype), norm_dim(dim, x.type.rank))


@converts(aten.diagonal.default, aten.diagonal_copy.default)
def _diagonal(cx: Ctx, x, offset=0, dim1=0, dim2=1):
    """Tensor.diagonal (torch.diag of a matrix): dims dim1 and dim2 moved last and
    flattened, the diagonal one gather of constant indices along them (index arithmetic),
    the other dims in order before it."""
    rank = x.type.rank
    d1, d2 = norm_dim(dim1, rank), norm_dim(dim2, rank)
    if d1 == d2:
        raise Fallback("diagonal of one dim with itself")
    n1, n2 = x.shape[d1], x.shape[d2]
    row0, col0 = max(-offset, 0), max(offset, 0)
    length = max(0, min(n1 - row0, n2 - col0))
    if length == 0:
        raise Fallback("an empty diagonal")
    rest = [d for d in range(rank) if d not in (d1, d2)]
    moved = x if rest + [d1, d2] == list(range(rank)) else cx.op(
        "transpose", x, perm=tuple(rest + [d1, d2]))
    lead = tuple(x.shape[d] for d in rest)
    flat = cx.reshape(moved, lead + (n1 * n2,))
    index = (np.arange(length, dtype=np.int64) + row0) * n2 + col0 + np.arange(length)
    return cx.op("gather", flat, cx.const(index), axis=len(lead))


@converts(aten.unfold.default)
def _unfold(cx: Ctx, x, dim, size, step):
    """Tensor.unfold(dim, size, step) (framing a signal, sliding windows): one gather of
    constant indices i * step + j along dim, its window axis then moved last."""
    rank = x.type.rank
    if rank == 0:  # torch allows size 1 only: the scalar as one window
        if size != 1:
            raise Fallback(f"unfold of a scalar by {size}")
        return cx.reshape(x, (1,))
    d = norm_dim(dim, rank)
    n_in = x.shape[d]
    if size < 1 or step < 1 or size > n_in:
        raise Fallback(f"unfold of {n_in} elements by {size} every {step}")
    windows = (n_in - size) // step + 1
    index = (np.arange(windows, dtype=np.int64)[:, None] * step
             + np.arange(size, dtype=np.int64)[None, :])
    y = cx.op("gather", x, cx.const(index), axis=d)  # x[:d], windows, size, x[d+1:]
    perm = list(range(d + 1)) + list(range(d + 2, rank + 1)) + [d + 1]
    return y if perm == list(range(rank + 1)) else cx.op("transpose", y, perm=tuple(perm))


@converts(aten.gather.default)
def _gather_along(cx: Ctx, x, dim, index, sparse_grad=False):
    """torch.gather (take_along_dim, cross-entropy's pick of each row's class): one flat
    gather (importers/scans.py); a negative or too large index is out of range, reported
    by the gather's bounds check as torch reports it."""
    from importers.scans import take_along_axis_ir

    rank = x.type.rank
    if rank == 0 or index.type.rank != rank:
        raise Fallback(f"gather of rank {rank} by indices of rank {index.type.rank}")
    d = norm_dim(dim, rank)
    if any(i > n for a, (i, n) in enumerate(zip(index.shape, x.shape)) if a != d):
        raise Fallback(f"indices {index.shape} larger than input {x.shape} off dim {d}")
    if index.type.size == 0:
        raise Fallback("empty indices")
    return take_along_axis_ir(cx, x, _no_negative(cx, index, x.shape[d]), d)
