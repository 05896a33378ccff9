"""Shape and data movement: reshape, transpose, broadcast, slice, concat, pad, gather.

All static: every attribute is a concrete int. `slice` is stated as
(starts, steps, sizes) per dimension: output element i along dim d reads input
element starts[d] + i * steps[d]; that form is what an index emitter wants,
and it has no clamping or negative-index rules left to get wrong.
`gather` follows ONNX Gather: indices may be negative (counted from the end).
"""

from __future__ import annotations

import numpy as np

from compiler.ir import IRError, TensorType
from compiler.ops import REQUIRED, Family, OpDef, register


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


# -- reshape --------------------------------------------------------------

def _reshape_infer(node):
    x = node.inputs[0]
    shape = node.attrs["shape"]
    if any(d < 0 for d in shape) or _prod(shape) != _prod(x.shape):
        raise IRError(f"{node.describe()}: cannot reshape {x.shape} to {shape}")
    return [TensorType(x.dtype, shape)]


register(OpDef("reshape", Family.MOVEMENT, (1, 1), _reshape_infer,
               lambda node, x: [x.reshape(node.attrs["shape"])],
               attrs={"shape": ("ints", REQUIRED)}))


# -- transpose ------------------------------------------------------------

def _transpose_infer(node):
    x = node.inputs[0]
    perm = node.attrs["perm"]
    if sorted(perm) != list(range(x.type.rank)):
        raise IRError(f"{node.describe()}: perm {perm} is not a permutation of rank {x.type.rank}")
    return [TensorType(x.dtype, tuple(x.shape[p] for p in perm))]


register(OpDef("transpose", Family.MOVEMENT, (1, 1), _transpose_infer,
               lambda node, x: [np.ascontiguousarray(np.transpose(x, node.attrs["perm"]))],
               attrs={"perm": ("ints", REQUIRED)}))


# -- broadcast ------------------------------------------------------------

def _broadcast_infer(node):
    x = node.inputs[0]
    shape = node.attrs["shape"]
    off = len(shape) - x.type.rank
    if off < 0 or any(d not in (1, shape[off + i]) for i, d in enumerate(x.shape)):
        raise IRError(f"{node.describe()}: cannot broadcast {x.shape} to {shape}")
    return [TensorType(x.dtype, shape)]


register(OpDef("broadcast", Family.MOVEMENT, (1, 1), _broadcast_infer,
               lambda node, x: [np.ascontiguousarray(np.broadcast_to(x, node.attrs["shape"]))],
               attrs={"shape": ("ints", REQUIRED)}))


# -- slice ----------------------------------------------------------------

def _slice_infer(node):
    x = node.inputs[0]
    starts, steps, sizes = (node.attrs[k] for k in ("starts", "steps", "sizes"))
    if not len(starts) == len(steps) == len(sizes) == x.type.rank:
        raise IRError(f"{node.describe()}: starts/steps/sizes must have rank {x.type.rank}")
    for d, (s, st, n) in enumerate(zip(starts, steps, sizes)):
        if n < 0 or st == 0:
            raise IRError(f"{node.describe()}: bad size {n} or step {st} on dim {d}")
        if n and not (0 <= s < x.shape[d] and 0 <= s + (n - 1) * st < x.shape[d]):
            raise IRError(f"{node.describe()}: slice {s}+{n}x{st} leaves dim {d} of {x.shape}")
    return [TensorType(x.dtype, sizes)]


def _slice_eval(node, x):
    idx = []
    for s, st, n in zip(node.attrs["starts"], node.attrs["steps"], node.attrs["sizes"]):
        idx.append(s + st * np.arange(n))
    return [np.ascontiguousarray(x[np.ix_(*idx)]) if idx else x.copy()]


register(OpDef("slice", Family.MOVEMENT, (1, 1), _slice_infer, _slice_eval,
               attrs={"starts": ("ints", REQUIRED), "steps": ("ints", REQUIRED),
                      "sizes": ("ints", REQUIRED)}))


# -- concat ---------------------------------------------------------------

def _concat_infer(node):
    first = node.inputs[0]
    axis = node.attrs["axis"]
    if not 0 <= axis < first.type.rank:
        raise IRError(f"{node.describe()}: axis {axis} out of range for rank {first.type.rank}")
    total = 0
    for v in node.inputs:
        if v.dtype != first.dtype or v.type.rank != first.type.rank or any(
            a != b for i, (a, b) in enumerate(zip(v.shape, first.shape)) if i != axis
        ):
            raise IRError(f"{node.describe()}: cannot concat {first.type} with {v.type}")
        total += v.shape[axis]
    shape = list(first.shape)
    shape[axis] = total
    return [TensorType(first.dtype, shape)]


register(OpDef("concat", Family.MOVEMENT, (1, None), _concat_infer,
               lambda node, *xs: [np.concatenate(xs, axis=node.attrs["axis"])],
               attrs={"axis": ("int", REQUIRED)}))


# -- pad ------------------------------------------------------------------

PAD_MODES = ("constant", "reflect", "edge", "wrap")


def _pad_infer(node):
    x = node.inputs[0]
    pads, mode = node.attrs["pads"], node.attrs["mode"]
    r = x.type.rank
    if len(pads) != 2 * r or any(p < 0 for p in pads) or mode not in PAD_MODES:
        raise IRError(f"{node.describe()}: bad pads {pads} / mode {mode} for rank {r}")
    if mode == "reflect" and any((pads[i] or pads[i + r]) and x.shape[i] < 2 for i in range(r)):
        raise IRError(f"{node.describe()}: reflect padding needs at least 2 elements")
    if mode in ("reflect", "edge", "wrap") and any(
        (pads[i] or pads[i + r]) and x.shape[i] == 0 for i in range(r)
    ):
        raise IRError(f"{node.describe()}: {mode} padding of an empty dimension")
    return [TensorType(x.dtype, tuple(d + pads[i] + pads[i + r] for i, d in enumerate(x.shape)))]


def _pad_eval(node, x):
    r = x.ndim
    pads = node.attrs["pads"]
    width = [(pads[i], pads[i + r]) for i in range(r)]
    mode = node.attrs["mode"]
    if mode == "constant":
        return [np.pad(x, width, mode="constant",
                       constant_values=np.array(node.attrs["value"]).astype(x.dtype))]
    return [np.pad(x, width, mode=mode)]


register(OpDef("pad", Family.MOVEMENT, (1, 1), _pad_infer, _pad_eval,
               attrs={"pads": ("ints", REQUIRED), "mode": ("str", "constant"),
                      "value": ("float", 0.0)}))


# -- gather ---------------------------------------------------------------

def _gather_infer(node):
    data, idx = node.inputs
    axis = node.attrs["axis"]
    if not 0 <= axis < data.type.rank:
        raise IRError(f"{node.describe()}: axis {axis} out of range for rank {data.type.rank}")
    if idx.dtype not in ("i32", "i64"):
        raise IRError(f"{node.describe()}: indices must be i32 or i64, got {idx.dtype}")
    shape = data.shape[:axis] + idx.shape + data.shape[axis + 1:]
    return [TensorType(data.dtype, shape)]


def _gather_eval(node, data, idx):
    axis = node.attrs["axis"]
    n = data.shape[axis]
    if np.any((idx < -n) | (idx >= n)):
        raise IRError(f"{node.describe()}: index out of range [-{n}, {n})")
    return [np.take(data, np.where(idx < 0, idx + n, idx), axis=axis)]


register(OpDef("gather", Family.MOVEMENT, (2, 2), _gather_infer, _gather_eval,
               attrs={"axis": ("int", REQUIRED)}))

