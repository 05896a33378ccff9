"""Selection by position: TopK, Hardmax, OneHot, over IR argmax/argmin, compares with
a constant iota (0..n-1 along one axis) and select.

TopK takes k rounds of argmax (argmin for the smallest) along the axis, masking each
position chosen (importers/selection.py, shared with the torch importer); the values
are gathered at the indices once. The order is onnxruntime's: by value, then the
lower index first; NaN ranks above everything (the first of the largest, the last of
the smallest). O(k * n) work and O(k) IR ops, fine for the small k of detection
post-processing, MoE routing and beam search; a larger k stays on the host.
`sorted=0` leaves the order open: it comes sorted too.

Hardmax and OneHot are an iota compared with an index (the argmax, or the
indices input) broadcast across the new or reduced axis.
"""

from __future__ import annotations

import numpy as np

from compiler import dtypes
from compiler.errors import InvalidModelError
from importers.onnx_ops import Fallback, converter
from importers.onnx_ops.context import NodeContext
from importers.scans import take_along_axis_ir
from importers.selection import TOPK_MAX_K, iota, top_indices


def _k(cx: NodeContext) -> int:
    """k: an attribute before schema version 10, then a constant 1-element input."""
    if cx.version < 10:
        return int(cx.attr("k"))
    ks = cx.ints_input(1, "K")
    if len(ks) != 1:  # onnxruntime reports it when the node runs
        raise Fallback(f"TopK's K has {len(ks)} elements, not 1")
    return ks[0]


@converter("TopK", 1)
def convert_topk(cx: NodeContext):
    """k rounds of argmax or argmin (module doc); largest from schema version 11."""
    x = cx.x
    if x.dtype == "f16":
        # braze's codegens compute no f16: the rounds would run op by op on onnxruntime,
        # whose ArgMax and ReduceMax do not treat NaN as numpy (the IR) does
        raise Fallback("TopK of f16 (braze computes no f16)")
    axis = cx.axis(cx.attr("axis", -1), x.type.rank)
    k, n = _k(cx), x.shape[axis]
    if not 0 <= k <= n:  # onnxruntime reports it when the node runs
        raise Fallback(f"TopK with k={k} along an axis of {n}")
    if k > TOPK_MAX_K:
        raise Fallback(f"TopK with k={k}: more than {TOPK_MAX_K} rounds of argmax")
    out_shape = x.shape[:axis] + (k,) + x.shape[axis + 1:]
    if int(np.prod(out_shape)) == 0:
        return [cx.const(np.zeros(out_shape, dtypes.to_numpy(x.dtype))),
                cx.const(np.zeros(out_shape, np.int64))]
    idx = top_indices(cx, x, axis, k, bool(cx.attr("largest", 1)))
    return [take_along_axis_ir(cx, x, idx, axis), idx]


def _hardmax(cx: NodeContext, x, axis: int):
    """1 at the first maximum along `axis`, 0 elsewhere (a NaN counts as the maximum,
    as in numpy and ONNX's reference; onnxruntime's result for NaN differs)."""
    idx = cx.op("argmax", x, axis=axis, keepdims=True)
    hit = cx.op("eq", iota(cx, x.shape[axis], axis, x.type.rank), idx)
    return cx.cast(hit, x.dtype)


@converter("Hardmax", 1)
def convert_hardmax(cx: NodeContext):
    """Up to schema version 11 over x coerced to 2-d at `axis` (default 1): the
    dims before it one row, the dims from it on one column."""
    x = cx.x
    if x.type.size == 0:
        return [x]
    if cx.version >= 13:
        return [_hardmax(cx, x, cx.axis(cx.attr("axis", -1), x.type.rank))]
    axis = cx.axis(cx.attr("axis", 1), x.type.rank)
    rows = int(np.prod(x.shape[:axis], dtype=np.int64))
    flat = cx.reshape(x, (rows, x.type.size // rows))
    return [cx.reshape(_hardmax(cx, flat, 1), x.shape)]


@converter("OneHot", 9)
def convert_onehot(cx: NodeContext):
    """on where the iota along the new axis equals the index, off elsewhere. Indices
    are truncated to integers and [-depth, 0) counts from the end (onnxruntime does
    both, at schema version 9 too); anything else outside [0, depth) gives an
    all-off row. depth must be a constant."""
    indices, _, values = cx.inputs
    depth = cx.const_input(1, "depth")
    if depth.size != 1:
        raise InvalidModelError(f"{cx.describe}: depth has {depth.size} elements, not 1")
    d = int(depth.reshape(-1)[0])
    if d < 1:  # onnxruntime reports it when the node runs
        raise Fallback(f"OneHot with depth {d}")
    if values.type.size != 2:
        raise InvalidModelError(f"{cx.describe}: values has {values.type.size} elements, "
                                f"not 2")
    if values.dtype not in dtypes.SCALARS:
        raise Fallback(f"OneHot values of dtype {values.dtype}")
    rank = indices.type.rank + 1
    axis = cx.axis(cx.attr("axis", -1), rank)
    i = cx.cast(indices, "i64")
    i = cx.op("select", cx.op("lt", i, cx.scalar(0, "i64")),
              cx.op("add", i, cx.scalar(d, "i64")), i)
    shape = list(indices.shape)
    shape.insert(axis, 1)
    hit = cx.op("eq", iota(cx, d, axis, rank), cx.reshape(i, shape))
    flat = cx.reshape(values, (2,))
    off, on = (cx.op("gather", flat, cx.scalar(j, "i64"), axis=0) for j in (0, 1))
    return [cx.op("select", hit, on, off)]
