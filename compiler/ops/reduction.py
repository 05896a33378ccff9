"""Reductions over a set of axes (sum, prod, max, min) and argmax/argmin.

`axes` are normalized: non-negative, sorted, unique. An empty `axes` tuple is
the identity (importers turn ONNX's "reduce all" into an explicit list).
Means, variances and norms are compositions (importers/passes build them).
"""

from __future__ import annotations

import numpy as np

from compiler import dtypes
from compiler.ir import IRError, Node, TensorType
from compiler.ops import REQUIRED, Family, OpDef, register

REDUCE = {
    "reduce_sum": np.sum,
    "reduce_prod": np.prod,
    "reduce_max": np.max,
    "reduce_min": np.min,
}


def _check_axes(node: Node) -> None:
    rank = node.inputs[0].type.rank
    axes = node.attrs["axes"]
    if list(axes) != sorted(set(axes)) or any(a < 0 or a >= rank for a in axes):
        raise IRError(f"{node.describe()}: axes {axes} must be sorted, unique, in [0, {rank})")


def reduced_shape(shape: tuple, axes, keepdims: bool) -> tuple:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _reduce(name, fn):
    def infer(node):
        x = node.inputs[0]
        if x.dtype not in dtypes.NUMERIC:
            raise IRError(f"{node.describe()} does not take dtype {x.dtype}")
        if name in ("reduce_max", "reduce_min"):
            if any(x.shape[a] == 0 for a in node.attrs["axes"]):
                raise IRError(f"{node.describe()}: {name} over an empty axis")
        return [TensorType(x.dtype, reduced_shape(x.shape, node.attrs["axes"],
                                                  node.attrs["keepdims"]))]

    def evaluate(node, x):
        axes = node.attrs["axes"]
        if not axes:
            return [x.copy()]
        out = fn(x, axis=tuple(axes), keepdims=node.attrs["keepdims"])
        return [np.asarray(out).astype(x.dtype)]

    register(OpDef(name, Family.REDUCTION, (1, 1), infer, evaluate,
                   attrs={"axes": ("ints", REQUIRED), "keepdims": ("bool", True)},
                   check_fn=_check_axes))


for _name, _fn in REDUCE.items():
    _reduce(_name, _fn)


def _arg(name, fn):
    def check(node):
        rank = node.inputs[0].type.rank
        if not 0 <= node.attrs["axis"] < max(rank, 1):
            raise IRError(f"{node.describe()}: axis {node.attrs['axis']} out of range")

    def infer(node):
        x = node.inputs[0]
        if x.dtype not in dtypes.NUMERIC:
            raise IRError(f"{node.describe()} does not take dtype {x.dtype}")
        if x.shape and x.shape[node.attrs["axis"]] == 0:
            raise IRError(f"{node.describe()}: {name} over an empty axis")
        return [TensorType("i64", reduced_shape(x.shape, (node.attrs["axis"],),
                                                node.attrs["keepdims"]))]

    def evaluate(node, x):
        axis, keep = node.attrs["axis"], node.attrs["keepdims"]
        if node.attrs["select_last"]:
            flipped = np.flip(x, axis)
            idx = x.shape[axis] - 1 - fn(flipped, axis=axis)
        else:
            idx = fn(x, axis=axis)
        if keep:
            idx = np.expand_dims(idx, axis)
        return [np.asarray(idx, dtype=np.int64)]

    register(OpDef(name, Family.REDUCTION, (1, 1), infer, evaluate,
                   attrs={"axis": ("int", REQUIRED), "keepdims": ("bool", True),
                          "select_last": ("bool", False)},
                   check_fn=check))


_arg("argmax", np.argmax)
_arg("argmin", np.argmin)
