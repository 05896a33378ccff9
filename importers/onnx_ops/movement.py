"""Data movement: Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Concat, Split,
Slice, Pad, Gather, Compress, Expand, Tile, DepthToSpace, SpaceToDepth, GatherND.

Every shape-like input (Reshape's shape, Slice's starts, Pad's pads, ...) must
be a constant after folding; the IR ops take them as static attributes.
ONNX Slice clamping (negative, out-of-range and INT_MAX bounds, negative steps)
is exactly Python's `slice.indices`, which turns it into the IR's
(start, step, size) form.
"""

from __future__ import annotations

import numpy as np

from compiler.errors import InvalidModelError
from importers.onnx_ops import Fallback, converter
from importers.onnx_ops.context import NodeContext, const_array


def _prod(xs) -> int:
    return int(np.prod(xs, dtype=np.int64)) if len(xs) else 1


@converter("Reshape", 5)
def convert_reshape(cx: NodeContext):
    """0 copies the input dim (unless allowzero), -1 is inferred."""
    x = cx.x
    shape = cx.ints_input(1, "shape")
    allowzero = cx.attr("allowzero", 0)
    out = [x.shape[i] if d == 0 and not allowzero and i < x.type.rank else d
           for i, d in enumerate(shape)]
    if out.count(-1) > 1:
        raise Fallback(f"Reshape to {shape} has more than one -1")
    if -1 in out:
        known = _prod([d for d in out if d != -1])
        if known == 0:
            raise Fallback(f"Reshape of {x.shape} to {shape}: -1 beside a zero dim")
        out[out.index(-1)] = x.type.size // known
    if any(d < 0 for d in out) or _prod(out) != x.type.size:
        raise InvalidModelError(f"{cx.describe}: cannot reshape {x.shape} "
                                f"({x.type.size} elements) to {shape}")
    return [cx.reshape(x, out)]


@converter("Flatten", 1)
def convert_flatten(cx: NodeContext):
    x = cx.x
    axis = cx.attr("axis", 1)
    if not -x.type.rank <= axis <= x.type.rank:
        raise InvalidModelError(f"{cx.describe}: axis {axis} out of range for rank "
                                f"{x.type.rank}")
    axis = axis + x.type.rank if axis < 0 else axis
    return [cx.reshape(x, (_prod(x.shape[:axis]), _prod(x.shape[axis:])))]


def _axes(cx: NodeContext, attr_until: int, what: str = "axes") -> list[int] | None:
    """Axes from the attribute (schema versions before attr_until) or input 1."""
    if cx.version < attr_until:
        axes = cx.attr("axes")
        return None if axes is None else list(axes)
    return cx.ints_input(1, what)


@converter("Squeeze", 1)
def convert_squeeze(cx: NodeContext):
    x = cx.x
    axes = _axes(cx, 13)
    if axes is None:
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    axes = {cx.axis(a, x.type.rank) for a in axes}
    if any(x.shape[a] != 1 for a in axes):
        raise Fallback(f"Squeeze of axes {sorted(axes)} that are not 1 in {x.shape}")
    return [cx.reshape(x, [d for i, d in enumerate(x.shape) if i not in axes])]


@converter("Unsqueeze", 1)
def convert_unsqueeze(cx: NodeContext):
    x = cx.x
    axes = _axes(cx, 13)
    rank = x.type.rank + len(axes)
    axes = sorted(cx.axis(a, rank) for a in axes)
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return [cx.reshape(x, shape)]


@converter("Transpose", 1)
def convert_transpose(cx: NodeContext):
    perm = cx.attr("perm")  # absent: the axes reversed; given, even empty: as given
    if perm is None:
        perm = list(range(cx.x.type.rank))[::-1]
    if sorted(perm) != list(range(cx.x.type.rank)):
        raise InvalidModelError(f"{cx.describe}: perm {list(perm)} is not a permutation of "
                                f"the {cx.x.type.rank} axes")
    return [cx.transpose(cx.x, perm)]


@converter("Concat", 4)
def convert_concat(cx: NodeContext):
    first = cx.inputs[0]
    axis = cx.axis(cx.attr("axis"), first.type.rank)
    return [cx.op("concat", *cx.inputs, axis=axis)]


def slice_axis(cx: NodeContext, v, axis: int, start: int, step: int, size: int):
    """`v` sliced along one axis (start, step, size in the IR's form)."""
    starts = [0] * v.type.rank
    steps = [1] * v.type.rank
    sizes = list(v.shape)
    starts[axis], steps[axis], sizes[axis] = (start if size else 0), step, size
    if sizes == list(v.shape) and step == 1:
        return v
    return cx.op("slice", v, starts=tuple(starts), steps=tuple(steps), sizes=tuple(sizes))


def _split_sizes(cx: NodeContext, dim: int) -> list[int]:
    n_out = len(cx.node.output)
    split = cx.attr("split") if cx.version < 13 else cx.ints_input(1, "split")
    if split is not None:
        split = list(split)
        if sum(split) != dim or len(split) != n_out:
            raise Fallback(f"split {split} does not cover dim {dim} with {n_out} outputs")
        return split
    parts = cx.attr("num_outputs", n_out)
    chunk = -(-dim // parts)
    sizes = [max(0, min(chunk, dim - i * chunk)) for i in range(parts)]
    if cx.version < 18 and dim % parts:
        raise Fallback(f"dim {dim} does not split evenly into {parts} outputs")
    return sizes


@converter("Split", 2)
def convert_split(cx: NodeContext):
    x = cx.x
    axis = cx.axis(cx.attr("axis", 0), x.type.rank)
    outs, start = [], 0
    for size in _split_sizes(cx, x.shape[axis]):
        outs.append(slice_axis(cx, x, axis, start, 1, size) if size != x.shape[axis] else x)
        start += size
    return outs


def _slice_params(cx: NodeContext):
    if cx.version < 10:
        starts, ends = list(cx.attr("starts")), list(cx.attr("ends"))
        return starts, ends, cx.attr("axes"), None
    return (cx.ints_input(1, "starts"), cx.ints_input(2, "ends"),
            cx.ints_input(3, "axes"), cx.ints_input(4, "steps"))


@converter("Slice", 1)
def convert_slice(cx: NodeContext):
    x = cx.x
    starts, ends, axes, steps = _slice_params(cx)
    axes = list(range(len(starts))) if axes is None else list(axes)
    steps = [1] * len(starts) if steps is None else steps
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise Fallback("Slice starts/ends/axes/steps differ in length")
    begin, stride, size = [0] * x.type.rank, [1] * x.type.rank, list(x.shape)
    for s, e, a, st in zip(starts, ends, axes, steps):
        if st == 0:
            raise Fallback("Slice step 0")
        a = cx.axis(a, x.type.rank)
        r = range(*slice(s, e, st).indices(x.shape[a]))
        begin[a], stride[a], size[a] = (r.start if len(r) else 0), r.step, len(r)
    if size == list(x.shape) and stride == [1] * x.type.rank:
        return [x]
    return [cx.op("slice", x, starts=tuple(begin), steps=tuple(stride), sizes=tuple(size))]


def _pad_params(cx: NodeContext):
    """(pads begin..end for every axis, mode, constant value)."""
    rank = cx.x.type.rank
    mode = cx.attr("mode", "constant")
    if cx.version < 11:
        return list(cx.attr("pads")), mode, cx.attr("value", 0.0)
    pads = cx.ints_input(1, "pads")
    value = cx.const_input(2, "constant_value")
    axes = cx.ints_input(3, "axes")
    if axes is not None:
        full = [0] * (2 * rank)
        for i, a in enumerate(axes):
            a = cx.axis(a, rank)
            full[a], full[a + rank] = pads[i], pads[i + len(axes)]
        pads = full
    return pads, mode, 0.0 if value is None or value.size == 0 else value.reshape(-1)[0].item()


@converter("Pad", 2)
def convert_pad(cx: NodeContext):
    """Negative pads crop (a slice first); the rest is one IR pad."""
    x = cx.x
    rank = x.type.rank
    pads, mode, value = _pad_params(cx)
    if len(pads) != 2 * rank:
        raise InvalidModelError(f"{cx.describe}: {len(pads)} pads for rank {rank}")
    for a in range(rank):
        if x.shape[a] + pads[a] + pads[a + rank] < 0:
            raise InvalidModelError(f"{cx.describe}: pads {pads} leave axis {a} of size "
                                    f"{x.shape[a]} a negative size")
    for a in range(rank):
        lo, hi = min(pads[a], 0), min(pads[a + rank], 0)
        if lo or hi:
            x = slice_axis(cx, x, a, -lo, 1, x.shape[a] + lo + hi)
    positive = tuple(max(p, 0) for p in pads)
    if not any(positive):
        return [x]
    if x.dtype == "bool" or (x.dtype[0] in "iu" and float(value) != int(value)):
        raise Fallback(f"Pad value {value} for dtype {x.dtype}")
    return [cx.op("pad", x, pads=positive, mode=mode, value=float(value))]


@converter("CenterCropPad", 18)
def convert_center_crop_pad(cx: NodeContext):
    """Each listed axis cropped to its centre (a slice; an odd excess leaves the extra
    element at the end) or zero-padded around it (an odd pad adds the extra element at
    the end)."""
    x = cx.x
    rank = x.type.rank
    shape = cx.ints_input(1, "shape")
    axes = [cx.axis(a, rank) for a in cx.attr("axes", list(range(rank)))]
    if shape is None:
        raise Fallback("CenterCropPad with a run-time shape")
    if len(shape) != len(axes) or len(set(axes)) != len(axes):
        raise InvalidModelError(f"{cx.describe}: {len(shape)} sizes for axes {axes}")
    if not x.type.static:
        raise Fallback(f"CenterCropPad over {x.type}")
    pads = [0] * (2 * rank)
    for a, size in zip(axes, shape):
        if size < 0:
            raise InvalidModelError(f"{cx.describe}: negative size {size}")
        if x.shape[a] > size:
            x = slice_axis(cx, x, a, (x.shape[a] - size) // 2, 1, size)
        else:
            pads[a] = (size - x.shape[a]) // 2
            pads[a + rank] = size - x.shape[a] - pads[a]
    return [cx.op("pad", x, pads=tuple(pads), mode="constant", value=0.0) if any(pads) else x]


@converter("Gather", 1)
def convert_gather(cx: NodeContext):
    data, idx = cx.inputs
    return [cx.op("gather", data, idx, axis=cx.axis(cx.attr("axis", 0), data.type.rank))]


@converter("Compress", 9)
def convert_compress(cx: NodeContext):
    """The entries of x (flattened when no axis is given) where the condition is true: a
    constant condition is a gather of its true positions (np.nonzero); a shorter
    condition leaves the rest out, as the spec says."""
    x, cond = cx.inputs
    mask = const_array(cond)
    if mask is None:
        raise Fallback("its condition is computed at run time: the output's shape would "
                       "depend on the data", wants=cond)
    axis = cx.attr("axis")
    if axis is None:
        x, axis = cx.reshape(x, (x.type.size,)), 0
    else:
        axis = cx.axis(axis, x.type.rank)
    picked = np.nonzero(mask.reshape(-1))[0]
    if picked.size and picked[-1] >= x.shape[axis]:
        raise InvalidModelError(f"{cx.describe}: condition selects index {picked[-1]} of an "
                                f"axis of {x.shape[axis]}")
    return [cx.op("gather", x, cx.const(picked.astype(np.int64)), axis=axis)]


@converter("Expand", 8)
def convert_expand(cx: NodeContext):
    """Bidirectional broadcast of x against the (constant) shape."""
    x = cx.x
    shape = cx.ints_input(1, "shape")
    try:
        out = np.broadcast_shapes(x.shape, tuple(shape))
    except ValueError:
        raise Fallback(f"Expand of {x.shape} to {shape}: shapes do not broadcast") from None
    return [x if out == x.shape else cx.op("broadcast", x, shape=out)]


@converter("Tile", 6)
def convert_tile(cx: NodeContext):
    """x (d0, d1..) -> reshape (1, d0, 1, d1..) -> broadcast (r0, d0, r1, d1..) -> merge."""
    x = cx.x
    reps = cx.ints_input(1, "repeats")
    if len(reps) != x.type.rank or any(r < 0 for r in reps):
        raise Fallback(f"Tile repeats {reps} for rank {x.type.rank}")
    if all(r == 1 for r in reps):
        return [x]
    split = [d for dim in x.shape for d in (1, dim)]
    wide = [d for r, dim in zip(reps, x.shape) for d in (r, dim)]
    y = cx.op("broadcast", cx.reshape(x, split), shape=tuple(wide))
    return [cx.reshape(y, [r * d for r, d in zip(reps, x.shape)])]


@converter("DepthToSpace", 1)
def convert_depth_to_space(cx: NodeContext):
    x = cx.x
    if x.type.rank != 4:
        raise Fallback("DepthToSpace needs a rank-4 input")
    b = cx.attr("blocksize")
    n, c, h, w = x.shape
    if cx.attr("mode", "DCR") == "DCR":
        y = cx.transpose(cx.reshape(x, (n, b, b, c // (b * b), h, w)), (0, 3, 4, 1, 5, 2))
    else:
        y = cx.transpose(cx.reshape(x, (n, c // (b * b), b, b, h, w)), (0, 1, 4, 2, 5, 3))
    return [cx.reshape(y, (n, c // (b * b), h * b, w * b))]


@converter("SpaceToDepth", 1)
def convert_space_to_depth(cx: NodeContext):
    x = cx.x
    if x.type.rank != 4:
        raise Fallback("SpaceToDepth needs a rank-4 input")
    b = cx.attr("blocksize")
    n, c, h, w = x.shape
    perm = (0, 1, 3, 5, 2, 4) if cx.attr("mode", "DCR") == "CRD" else (0, 3, 5, 1, 2, 4)
    y = cx.transpose(cx.reshape(x, (n, c, h // b, b, w // b, b)), perm)
    return [cx.reshape(y, (n, c * b * b, h // b, w // b))]


@converter("GatherElements", 11)
def convert_gather_elements(cx: NodeContext):
    """take_along_axis as one flat gather (importers/scans.py)."""
    from importers.scans import take_along_axis_ir

    data, idx = cx.inputs
    if not data.type.static or not idx.type.static:
        raise Fallback("GatherElements needs static shapes")
    if data.type.rank != idx.type.rank or data.type.rank == 0:
        raise InvalidModelError(f"{cx.describe}: indices of rank {idx.type.rank} for data "
                                f"of rank {data.type.rank}")
    axis = cx.axis(cx.attr("axis", 0), data.type.rank)
    if any(i > d for a, (i, d) in enumerate(zip(idx.shape, data.shape)) if a != axis):
        raise InvalidModelError(f"{cx.describe}: indices {idx.shape} exceed data {data.shape}")
    return [take_along_axis_ir(cx, data, idx, axis)]


@converter("GatherND", 11)
def convert_gather_nd(cx: NodeContext):
    """Each index tuple (indices' last dim, k long; batch_dims b from schema version 12)
    picks a slice data[batch..., i0, .., ik-1, ...]: one gather of the rows of data
    viewed as (rows, the elements of one slice), at the flat row
      batch * prod(data.shape[b:b+k]) + sum_j i_j * prod(data.shape[b+j+1:b+k])
    computed at run time. An index in [-n, 0) counts from the end; one outside [-n, n)
    makes its row `rows` (out of range, and the sum too), so the gather raises braze's
    IndexError where onnxruntime reports the index, never reading out of bounds. Constant
    indices out of range stay on onnxruntime, which reports them when the node runs."""
    data, indices = cx.inputs
    if not data.type.static or not indices.type.static:
        raise Fallback("GatherND needs static shapes")
    b = int(cx.attr("batch_dims", 0))
    r, q = data.type.rank, indices.type.rank
    k = indices.shape[-1] if q else 0
    if q < 1 or not 0 <= b < min(r, q) or not 1 <= k <= r - b \
            or indices.shape[:b] != data.shape[:b]:
        raise InvalidModelError(f"{cx.describe}: indices {indices.shape} with batch_dims "
                                f"{b} for data {data.shape}")
    if indices.dtype not in ("i32", "i64"):
        raise InvalidModelError(f"{cx.describe}: indices of dtype {indices.dtype}")
    out_shape = indices.shape[:-1] + data.shape[b + k:]
    if _prod(out_shape) == 0:
        from compiler import dtypes

        return [cx.const(np.zeros(out_shape, dtypes.to_numpy(data.dtype)))]
    dims = data.shape[b:b + k]
    known = const_array(indices)
    if known is not None and (np.any(known < -np.array(dims)) or np.any(known >= dims)):
        raise Fallback("GatherND index out of range")  # onnxruntime reports it when run
    per_batch = _prod(dims)
    rows = _prod(data.shape[:b]) * per_batch
    from importers.scans import checked_index

    i, bad = checked_index(cx, indices, dims)  # dims along indices' last dim
    i = cx.op("select", bad, cx.scalar(rows, "i64"), i)
    strides = np.cumprod((dims[1:] + (1,))[::-1])[::-1].astype(np.int64)
    flat = cx.reduce("sum", cx.op("mul", i, cx.const(strides)), [q - 1], keepdims=False)
    if b:
        batch = np.arange(_prod(data.shape[:b]), dtype=np.int64) * per_batch
        flat = cx.op("add", flat, cx.const(batch.reshape(data.shape[:b] + (1,) * (q - 1 - b))))
    table = cx.reshape(data, (rows, _prod(data.shape[b + k:])))
    return [cx.reshape(cx.op("gather", table, flat, axis=0), out_shape)]


@converter("ScatterND", 11)
def convert_scatter_nd(cx: NodeContext):
    """Constant indices: a gather of data and updates (importers/scans.py); reduction
    (16: add, mul; 18: max, min) gathers each write to a position in turn. Indices known
    only at run time (a KV cache's position), or constants those gathers cannot take (an
    index out of range, many writes to one place): the IR's scatter at flat positions
    computed from them (importers/scatter.py)."""
    from importers.scans import scatter_nd_ir, scatter_positions
    from importers.scatter import flat_scatter, nd_positions

    data, indices, updates = cx.inputs
    if not data.type.static or not updates.type.static or not indices.type.static:
        raise Fallback("ScatterND needs static shapes")
    ishape = tuple(indices.shape)
    k = ishape[-1] if ishape else 0
    if not ishape or k > data.type.rank:
        raise InvalidModelError(f"{cx.describe}: indices of shape {ishape} for data "
                                f"of rank {data.type.rank}")
    want = ishape[:-1] + tuple(data.shape[k:])
    if tuple(updates.shape) != want:
        raise InvalidModelError(f"{cx.describe}: updates of shape {updates.shape}, "
                                f"expected {want}")
    reduction = _scatter_reduction(cx)
    idx = const_array(indices)
    if idx is not None:
        try:
            positions = scatter_positions(data.shape, idx)
            return [scatter_nd_ir(cx, data, updates, positions, reduction)]
        except ValueError:  # out of range (reported at run time) or many repeats
            pass
    return [flat_scatter(cx, data, nd_positions(cx, data.shape, indices), updates, reduction)]


def _scatter_reduction(cx: NodeContext) -> str:
    reduction = cx.attr("reduction", "none")
    if reduction not in ("none", "add", "mul", "max", "min"):
        raise InvalidModelError(f"{cx.describe}: unknown reduction {reduction!r}")
    return reduction


@converter("ScatterElements", 11)
def convert_scatter_elements(cx: NodeContext):
    """Constant indices: ScatterND's gathers at the positions the indices name along
    `axis` (importers/scans.py); others: the IR's scatter (importers/scatter.py)."""
    return [_scatter_elements(cx, _scatter_reduction(cx))]


@converter("Scatter", 9, 10)
def convert_scatter(cx: NodeContext):
    """The old name of ScatterElements (no reduction)."""
    return [_scatter_elements(cx, "none")]


def _scatter_elements(cx: NodeContext, reduction: str):
    from importers.scans import scatter_elements_positions, scatter_nd_ir
    from importers.scatter import elements_positions, flat_scatter

    data, indices, updates = cx.inputs
    if not data.type.static or not updates.type.static or not indices.type.static:
        raise Fallback(f"{cx.node.op_type} needs static shapes")
    rank = data.type.rank
    ishape = tuple(indices.shape)
    if len(ishape) != rank or tuple(updates.shape) != ishape or rank == 0:
        raise InvalidModelError(f"{cx.describe}: indices {ishape} and updates "
                                f"{updates.shape} for data {data.shape}")
    axis = cx.axis(cx.attr("axis", 0), rank)
    if any(i > d for a, (i, d) in enumerate(zip(ishape, data.shape)) if a != axis):
        raise InvalidModelError(f"{cx.describe}: indices {ishape} exceed data {data.shape}")
    idx = const_array(indices)
    if idx is not None:
        try:
            positions = scatter_elements_positions(data.shape, idx, axis)
            return scatter_nd_ir(cx, data, updates, positions, reduction)
        except ValueError:  # out of range (reported at run time) or many repeats
            pass
    return flat_scatter(cx, data, elements_positions(cx, data.shape, indices, axis),
                        updates, reduction)


@converter("TensorScatter", 24)
def convert_tensor_scatter(cx: NodeContext):
    """A KV cache's update: the update written along `axis` from each batch row's write
    index on (modulo the cache's length in "circular" mode); no write indices: from 0,
    positions known now (importers/scans.py's gather)."""
    from importers.scans import scatter_nd_ir
    from importers.scatter import flat_scatter, strides

    cache, update = cx.inputs[:2]
    write = cx.input(2)
    if not cache.type.static or not update.type.static:
        raise Fallback("TensorScatter needs static shapes")
    rank = cache.type.rank
    axis = cx.axis(cx.attr("axis", -2), rank)
    mode = cx.attr("mode", "linear")
    if rank < 2 or axis == 0 or mode not in ("linear", "circular") or any(
            u != c for d, (u, c) in enumerate(zip(update.shape, cache.shape)) if d != axis) \
            or update.type.rank != rank or update.shape[axis] > cache.shape[axis]:
        raise InvalidModelError(f"{cx.describe}: update {update.shape} for cache "
                                f"{cache.shape} along axis {axis} ({mode})")
    n, seq = cache.shape[axis], update.shape[axis]
    st = strides(cache.shape)
    grid = np.indices(tuple(update.shape), dtype=np.int64)
    base = sum((grid[d] * st[d] for d in range(rank) if d != axis),
               np.zeros(tuple(update.shape), np.int64))
    along = [1] * rank
    along[axis] = seq
    step = np.arange(seq, dtype=np.int64).reshape(along)
    if write is None or const_array(write) is not None:
        w = np.zeros(cache.shape[0], np.int64) if write is None else \
            const_array(write).astype(np.int64).reshape(-1)
        pos = w.reshape((-1,) + (1,) * (rank - 1)) + step
        if mode == "circular":
            pos = pos % n
        if ((pos >= 0) & (pos < n)).all():
            return [scatter_nd_ir(cx, cache, update, base + pos * st[axis])]
    w = cx.const(np.zeros(cache.shape[0], np.int64)) if write is None else \
        cx.cast(write, "i64")
    pos = cx.op("add", cx.reshape(w, (cache.shape[0],) + (1,) * (rank - 1)), cx.const(step))
    if mode == "circular":
        pos = cx.op("mod", pos, cx.scalar(n, "i64"))
    bad = cx.op("or", cx.op("lt", pos, cx.scalar(0, "i64")),
                cx.op("ge", pos, cx.scalar(n, "i64")))
    flat = cx.op("add", cx.op("mul", pos, cx.scalar(int(st[axis]), "i64")), cx.const(base))
    flat = cx.op("select", bad, cx.scalar(cache.type.size, "i64"), flat)
    return [flat_scatter(cx, cache, flat, update)]


@converter("CumSum", 11)
def convert_cumsum(cx: NodeContext):
    """Prefix sums by Hillis and Steele's log-step scan (importers/scans.py)."""
    from importers.scans import cumsum_ir

    return [_scan(cx, cumsum_ir)]


@converter("CumProd", 26)
def convert_cumprod(cx: NodeContext):
    """Prefix products, by the same scan as CumSum's."""
    from importers.scans import cumprod_ir

    return [_scan(cx, cumprod_ir)]


def _scan(cx: NodeContext, scan):
    """CumSum's and CumProd's inputs and attributes, checked, then `scan` of them."""
    x = cx.x
    axis = cx.ints_input(1, "axis")
    if axis is None or len(axis) != 1:
        raise InvalidModelError(f"{cx.describe}: axis must be one integer")
    if not x.type.static or x.dtype == "bool":
        raise Fallback(f"{cx.node.op_type} over {x.type}")
    if not -x.type.rank <= axis[0] < x.type.rank:  # onnxruntime loads it, fails at run time
        raise Fallback(f"axis {axis[0]} out of range for rank {x.type.rank}")
    return scan(cx, x, cx.axis(axis[0], x.type.rank), exclusive=bool(cx.attr("exclusive", 0)),
                reverse=bool(cx.attr("reverse", 0)))
