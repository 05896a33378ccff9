"""`scatter`: data with updates written (or combined) at flat positions known only at
run time (a KV cache's current position, a GNN's edge targets, index_put's computed
indices).

    scatter(data, indices, updates) {reduction}

`indices` (i32 or i64) and `updates` (data's dtype) have the same shape; each index is
a flat, row-major position of data, in [0, data.size). The result has data's type:

    out = copy of data
    for k in row-major order over indices:
        out.flat[indices[k]] = updates[k]                      reduction = "none"
        out.flat[indices[k]] = f(out.flat[indices[k]], updates[k])    "add", "mul",
                                                               "max", "min" (f on the IR's
                                                               binary op: max and min
                                                               propagate NaN)

Updates apply in order, so with duplicate positions the last write wins ("none") and a
float sum adds in that order: deterministic, and what onnxruntime's and torch's CPU
kernels do. An index outside [0, data.size) is a model error: the reference raises
IRError, a compiled kernel skips the write and reports BrazeIndexError (the importers
map an index out of its own axis to data.size, so it is reported even where the flat
position would land inside data). Reductions other than "none" take numeric data only.

The importers compute the flat positions with IR arithmetic from the frameworks' index
tensors (importers/scatter.py). It is a library-class op (family CONTRACTION, as
attention and recurrence are): its own kernel (compiler/kernels/scatter.py), which
reads its operands through the element emitter (fuse.plan folds movement and
elementwise producers into it) and is never fused into an elementwise loop; no
epilogue. Constant positions known at import take the faster gathers of
importers/scans.py instead.
"""

from __future__ import annotations

import numpy as np

from compiler import dtypes
from compiler.ir import IRError, TensorType
from compiler.ops import Family, OpDef, register

REDUCTIONS = ("none", "add", "mul", "max", "min")


def _check(node):
    if node.attrs["reduction"] not in REDUCTIONS:
        raise IRError(f"{node.describe()}: reduction {node.attrs['reduction']!r} is not one "
                      f"of {REDUCTIONS}")


def _infer(node):
    data, indices, updates = node.inputs
    where = node.describe()
    if indices.dtype not in ("i32", "i64"):
        raise IRError(f"{where}: indices must be i32 or i64, got {indices.dtype}")
    if updates.dtype != data.dtype:
        raise IRError(f"{where}: updates are {updates.dtype}, data {data.dtype}")
    if tuple(indices.shape) != tuple(updates.shape):
        raise IRError(f"{where}: indices {indices.shape} and updates {updates.shape} "
                      "differ in shape")
    if node.attrs["reduction"] != "none" and data.dtype not in dtypes.NUMERIC:
        raise IRError(f"{where}: reduction {node.attrs['reduction']} of {data.dtype} data")
    return [TensorType(data.dtype, data.shape)]


_AT = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _eval(node, data, indices, updates):
    out = np.array(data, copy=True).reshape(-1)
    idx = np.asarray(indices).reshape(-1).astype(np.int64)
    upd = np.asarray(updates, dtype=out.dtype).reshape(-1)
    if np.any((idx < 0) | (idx >= out.size)):
        raise IRError(f"{node.describe()}: index out of range [0, {out.size})")
    reduction = node.attrs["reduction"]
    if reduction == "none":  # the last write to each position wins
        positions, last = np.unique(idx[::-1], return_index=True)
        out[positions] = upd[::-1][last]
    else:
        with np.errstate(all="ignore"):
            _AT[reduction].at(out, idx, upd)  # unbuffered, in order
    return [out.reshape(np.shape(data))]


register(OpDef("scatter", Family.CONTRACTION, (3, 3), _infer, _eval,
               attrs={"reduction": ("str", "none")}, check_fn=_check))
