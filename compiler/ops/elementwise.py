"""Elementwise ops: unary, binary (numpy broadcasting), select, cast, bitcast.

Binary ops require both operands to have the same dtype (importers insert
casts); shapes broadcast as numpy does, so no explicit `broadcast` is needed
in front of an elementwise op. Integer `div` truncates toward zero (C, ONNX);
`mod` takes the sign of the divisor (Python), `fmod` that of the dividend (C).
`shl`/`shr` follow ONNX BitShift: `shr` of a signed dtype is arithmetic, and an amount
that is negative or at least the bit width gives -1 (`shr` of a negative x) or 0.
`bitcast` reads each element's bits as another number type of the same width (ONNX
BitCast: float32 1.0 is int32 0x3f800000).
"""

from __future__ import annotations

import math

import numpy as np

from compiler import dtypes
from compiler.ir import IRError, Node, TensorType
from compiler.ops import REQUIRED, Family, OpDef, register


def broadcast_shapes(*shapes: tuple, where: str = "") -> tuple:
    """numpy's broadcasting rule; IRError naming `where` if the shapes clash."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        dims = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise IRError(f"{where}: shapes {' and '.join(map(str, shapes))} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def _erf(x):
    return np.frompyfunc(math.erf, 1, 1)(x).astype(x.dtype)


def _int_div(a, b):
    if a.dtype.kind in "iu":
        with np.errstate(divide="ignore"):
            q = np.floor_divide(a, np.where(b == 0, 1, b))
            adjust = (q < 0) & (q * b != a) if a.dtype.kind == "i" else False
            return (q + adjust).astype(a.dtype)
    return np.divide(a, b)


def _round(x):
    return np.round(x)


def _shift(a, b, left: bool):
    """ONNX BitShift (version 28) on any integer dtype: a right shift of a signed dtype is
    arithmetic, a left shift drops the bits pushed past the top (the sign bit too); an
    amount that is negative or at least the bit width gives the sign fill alone: -1 for a
    right shift of a negative x, else 0. (LLVM's shl/lshr/ashr are poison there.)"""
    a, b = np.asarray(a), np.asarray(b)
    width = a.dtype.itemsize * 8
    wide = (b < 0) | (b >= width) if b.dtype.kind == "i" else b >= width
    amount = np.where(wide, 0, b)
    if left:  # shift the bit pattern as unsigned: a signed shift past the sign bit wraps
        bits = np.dtype(f"u{a.dtype.itemsize}")
        shifted = np.left_shift(a.astype(bits), amount.astype(bits)).astype(a.dtype)
        fill = np.zeros((), a.dtype)
    else:  # numpy's right shift of a signed dtype is arithmetic
        shifted = np.right_shift(a, amount.astype(a.dtype))
        fill = np.where(a < 0, -1, 0).astype(a.dtype) if a.dtype.kind == "i" else \
            np.zeros((), a.dtype)
    return np.where(wide, fill, shifted)


# name -> (allowed input dtypes, numpy function, result dtype or None = same)
UNARY: dict[str, tuple[frozenset, object, str | None]] = {
    "neg": (dtypes.NUMERIC, np.negative, None),
    "abs": (dtypes.NUMERIC, np.abs, None),
    "sign": (dtypes.NUMERIC, np.sign, None),
    "exp": (dtypes.FLOATS, np.exp, None),
    "expm1": (dtypes.FLOATS, np.expm1, None),
    "log": (dtypes.FLOATS, np.log, None),
    "log1p": (dtypes.FLOATS, np.log1p, None),
    "sqrt": (dtypes.FLOATS, np.sqrt, None),
    "reciprocal": (dtypes.FLOATS, np.reciprocal, None),
    "sin": (dtypes.FLOATS, np.sin, None),
    "cos": (dtypes.FLOATS, np.cos, None),
    "tan": (dtypes.FLOATS, np.tan, None),
    "asin": (dtypes.FLOATS, np.arcsin, None),
    "acos": (dtypes.FLOATS, np.arccos, None),
    "atan": (dtypes.FLOATS, np.arctan, None),
    "sinh": (dtypes.FLOATS, np.sinh, None),
    "cosh": (dtypes.FLOATS, np.cosh, None),
    "tanh": (dtypes.FLOATS, np.tanh, None),
    "asinh": (dtypes.FLOATS, np.arcsinh, None),
    "acosh": (dtypes.FLOATS, np.arccosh, None),
    "atanh": (dtypes.FLOATS, np.arctanh, None),
    "sigmoid": (dtypes.FLOATS, lambda x: (1 / (1 + np.exp(-x))).astype(x.dtype), None),
    "erf": (dtypes.FLOATS, _erf, None),
    "floor": (dtypes.FLOATS, np.floor, None),
    "ceil": (dtypes.FLOATS, np.ceil, None),
    "round": (dtypes.FLOATS, _round, None),
    "isnan": (dtypes.FLOATS, np.isnan, "bool"),
    "isinf": (dtypes.FLOATS, np.isinf, "bool"),
    "not": (frozenset({"bool"}), np.logical_not, None),
    "bitnot": (dtypes.INTEGERS, np.invert, None),
}

_ARITH = dtypes.NUMERIC
_ORDERED = dtypes.NUMERIC
BINARY: dict[str, tuple[frozenset, object, str | None]] = {
    "add": (_ARITH, np.add, None),
    "sub": (_ARITH, np.subtract, None),
    "mul": (_ARITH, np.multiply, None),
    "div": (_ARITH, _int_div, None),
    "pow": (_ARITH, np.power, None),
    "max": (_ORDERED, np.maximum, None),
    "min": (_ORDERED, np.minimum, None),
    "mod": (_ARITH, np.mod, None),
    "fmod": (_ARITH, np.fmod, None),
    "atan2": (dtypes.FLOATS, np.arctan2, None),  # atan2(y, x): the angle of (x, y)
    "hypot": (dtypes.FLOATS, np.hypot, None),  # sqrt(x^2 + y^2) without overflow
    "and": (frozenset({"bool"}), np.logical_and, None),
    "or": (frozenset({"bool"}), np.logical_or, None),
    "xor": (frozenset({"bool"}), np.logical_xor, None),
    "bitand": (dtypes.INTEGERS | {"bool"}, np.bitwise_and, None),
    "bitor": (dtypes.INTEGERS | {"bool"}, np.bitwise_or, None),
    "bitxor": (dtypes.INTEGERS | {"bool"}, np.bitwise_xor, None),
    "shl": (dtypes.INTEGERS, lambda a, b: _shift(a, b, left=True), None),
    "shr": (dtypes.INTEGERS, lambda a, b: _shift(a, b, left=False), None),
    "eq": (dtypes.SCALARS, np.equal, "bool"),
    "ne": (dtypes.SCALARS, np.not_equal, "bool"),
    "lt": (_ORDERED, np.less, "bool"),
    "le": (_ORDERED, np.less_equal, "bool"),
    "gt": (_ORDERED, np.greater, "bool"),
    "ge": (_ORDERED, np.greater_equal, "bool"),
}


def _check_dtype(node: Node, allowed: frozenset, dtype: str) -> None:
    if dtype not in allowed:
        raise IRError(f"{node.describe()} does not take dtype {dtype}")


def _unary(name: str, allowed, fn, result):
    def infer(node):
        x = node.inputs[0]
        _check_dtype(node, allowed, x.dtype)
        return [TensorType(result or x.dtype, x.shape)]

    def evaluate(node, x):
        with np.errstate(all="ignore"):
            return [np.asarray(fn(x)).astype(dtypes.to_numpy(result or node.inputs[0].dtype))]

    register(OpDef(name, Family.ELEMENTWISE, (1, 1), infer, evaluate))


def _binary(name: str, allowed, fn, result):
    def infer(node):
        a, b = node.inputs
        if a.dtype != b.dtype:
            raise IRError(f"{node.describe()} mixes dtypes {a.dtype} and {b.dtype}")
        _check_dtype(node, allowed, a.dtype)
        return [TensorType(result or a.dtype, broadcast_shapes(a.shape, b.shape,
                                                               where=node.describe()))]

    def evaluate(node, a, b):
        with np.errstate(all="ignore"):
            out = np.asarray(fn(a, b))
        out_dtype = dtypes.to_numpy(result or node.inputs[0].dtype)
        return [np.broadcast_to(out, np.broadcast_shapes(a.shape, b.shape)).astype(out_dtype)]

    register(OpDef(name, Family.ELEMENTWISE, (2, 2), infer, evaluate))


for _name, (_allowed, _fn, _res) in UNARY.items():
    _unary(_name, _allowed, _fn, _res)
for _name, (_allowed, _fn, _res) in BINARY.items():
    _binary(_name, _allowed, _fn, _res)


def _select_infer(node):
    c, a, b = node.inputs
    if c.dtype != "bool":
        raise IRError(f"{node.describe()}: condition must be bool, got {c.dtype}")
    if a.dtype != b.dtype:
        raise IRError(f"{node.describe()} mixes dtypes {a.dtype} and {b.dtype}")
    return [TensorType(a.dtype, broadcast_shapes(c.shape, a.shape, b.shape,
                                                 where=node.describe()))]


register(OpDef("select", Family.ELEMENTWISE, (3, 3), _select_infer,
               lambda node, c, a, b: [np.where(c, a, b).astype(a.dtype)]))


def _cast_infer(node):
    x = node.inputs[0]
    to = node.attrs["to"]
    dtypes.check(to)
    if x.dtype not in dtypes.SCALARS or to not in dtypes.SCALARS:
        raise IRError(f"{node.describe()}: cannot cast {x.dtype} to {to}")
    return [TensorType(to, x.shape)]


def _cast_eval(node, x):
    to = dtypes.to_numpy(node.attrs["to"])
    with np.errstate(all="ignore"):
        if x.dtype.kind == "f" and to.kind in "iu":
            # float -> int truncates toward zero; out-of-range is undefined (as in C)
            return [np.asarray(np.trunc(np.nan_to_num(x))).astype(to)]
        return [np.asarray(x).astype(to)]


register(OpDef("cast", Family.ELEMENTWISE, (1, 1), _cast_infer, _cast_eval,
               attrs={"to": ("dtype", REQUIRED)}))


def _bitcast_infer(node):
    """Same shape, the bits of each element read as `to` (ONNX BitCast): both dtypes
    plain numbers of one width; bool is refused (a byte other than 0 or 1 is no bool)."""
    x = node.inputs[0]
    to = node.attrs["to"]
    dtypes.check(to)
    if not ({x.dtype, to} <= dtypes.NUMERIC) or dtypes.itemsize(x.dtype) != dtypes.itemsize(to):
        raise IRError(f"{node.describe()}: cannot reinterpret {x.dtype} as {to} (numbers "
                      "of one width only)")
    return [TensorType(to, x.shape)]


register(OpDef("bitcast", Family.ELEMENTWISE, (1, 1), _bitcast_infer,
               lambda node, x: [np.asarray(x).copy(order="C").view(
                   dtypes.to_numpy(node.attrs["to"]))],
               attrs={"to": ("dtype", REQUIRED)}))
