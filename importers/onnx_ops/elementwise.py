"""Elementwise ONNX ops: unary math, binary arithmetic, comparison, logic, bitwise,
variadic Sum/Mean/Max/Min, Where, Cast/CastLike, BitCast, IsInf, Mod, BitShift, Pow.

ONNX requires equal element types on both sides of nearly every binary op and
broadcasts like numpy (opset >= 7), which is the IR's rule too. Pow is the
exception: its exponent may have another type, so it is cast to the base's (an
integer base's Pow is computed as onnxruntime does: `_integer_pow`).
"""

from __future__ import annotations

import numpy as np

from compiler import dtypes
from compiler.errors import InvalidModelError
from compiler.ops import facets
from importers.onnx_ops import Fallback, converter
from importers.onnx_ops.context import NodeContext, const_array
from importers.onnx_types import dtype_of_elem

# ONNX op -> (IR op, first schema version converted). Versions before these
# carried legacy attributes (broadcast, consumed_inputs) and are left to the host.
UNARY = facets.attach_imports("onnx_import", {
    "Abs": ("abs", 6), "Neg": ("neg", 6), "Sign": ("sign", 9), "Exp": ("exp", 6),
    "Log": ("log", 6), "Sqrt": ("sqrt", 6), "Reciprocal": ("reciprocal", 6),
    "Sin": ("sin", 7), "Cos": ("cos", 7), "Tan": ("tan", 7), "Asin": ("asin", 7),
    "Acos": ("acos", 7), "Atan": ("atan", 7), "Sinh": ("sinh", 9), "Cosh": ("cosh", 9),
    "Asinh": ("asinh", 9), "Acosh": ("acosh", 9), "Atanh": ("atanh", 9),
    "Tanh": ("tanh", 6), "Sigmoid": ("sigmoid", 6), "Erf": ("erf", 9),
    "Floor": ("floor", 6), "Ceil": ("ceil", 6), "Round": ("round", 11),
    "IsNaN": ("isnan", 9), "Not": ("not", 1), "BitwiseNot": ("bitnot", 18),
})

BINARY = facets.attach_imports("onnx_import", {
    "Add": ("add", 7), "Sub": ("sub", 7), "Mul": ("mul", 7), "Div": ("div", 7),
    "Equal": ("eq", 7), "Greater": ("gt", 7), "Less": ("lt", 7),
    "GreaterOrEqual": ("ge", 12), "LessOrEqual": ("le", 12),
    "And": ("and", 7), "Or": ("or", 7), "Xor": ("xor", 7),
    "BitwiseAnd": ("bitand", 18), "BitwiseOr": ("bitor", 18), "BitwiseXor": ("bitxor", 18),
})

# variadic ONNX op -> (pairwise IR op, first schema version converted)
VARIADIC = facets.attach_imports("onnx_import", {
    "Sum": ("add", 6), "Max": ("max", 6), "Min": ("min", 6), "Mean": ("add", 6)})


def _unary(ir_op: str):
    def convert(cx: NodeContext):
        return [cx.op(ir_op, cx.x)]

    convert.__name__ = f"convert_{ir_op}"
    return convert


def _binary(ir_op: str):
    def convert(cx: NodeContext):
        return [cx.op(ir_op, cx.inputs[0], cx.inputs[1])]

    convert.__name__ = f"convert_{ir_op}"
    return convert


def _variadic(op_type: str, ir_op: str):
    def convert(cx: NodeContext):
        acc = cx.inputs[0]
        for v in cx.inputs[1:]:
            acc = cx.op(ir_op, acc, v)
        if op_type == "Mean":
            acc = cx.op("div", acc, cx.scalar(len(cx.inputs), acc.dtype))
        return [acc]

    convert.__name__ = f"convert_{op_type.lower()}"
    return convert


for _op, (_ir, _since) in UNARY.items():
    converter(_op, _since)(_unary(_ir))
for _op, (_ir, _since) in BINARY.items():
    converter(_op, _since)(_binary(_ir))
for _op, (_ir, _since) in VARIADIC.items():
    converter(_op, _since)(_variadic(_op, _ir))


@converter("Pow", 7)
def convert_pow(cx: NodeContext):
    """x ** y; ONNX lets y have another numeric type: cast it to x's (an integer x: see
    `_integer_pow`)."""
    base, exponent = cx.inputs
    if base.dtype in dtypes.INTEGERS:
        return [_integer_pow(cx, base, exponent)]
    return [cx.op("pow", base, cx.cast(exponent, base.dtype))]


def _integer_pow(cx: NodeContext, base, exponent):
    """An integer x to any numeric y, as onnxruntime computes it (the spec says nothing
    about overflow, fractions or negative exponents; ONNX's reference, np.power, rejects
    negative integer exponents): `static_cast<T>(std::pow(x, y))`, that is pow in float64
    truncated toward zero, and a result out of T's range (0 to a negative power is inf) or
    NaN ((-8)^(1/3)) gives T's minimum, what x86's cvttsd2si returns. So 2^-1 = 0,
    (-1)^-3 = -1, 0^-1 = INT_MIN, 4^0.5 = 2, int32 2^31 = INT32_MIN, and int64 results
    above 2^53 are float64's rounding.
    Where onnxruntime's loop sees y as one number for a run of x (a y of one element, or one
    broadcast along x's innermost dim: `_ort_squares`) and y is 2 or 3, it multiplies in
    T instead: x*x or x*x*x, wrapping on overflow. Exact wherever the true power fits T
    (int64: below 2^53 in magnitude)."""
    if not _ort_squares(base.shape, exponent.shape):
        return _pow_through_f64(cx, base, exponent)
    y = const_array(exponent)
    if y is not None and not np.any((y == 2) | (y == 3)):
        return _pow_through_f64(cx, base, exponent)
    square = cx.op("mul", base, base)
    out = np.broadcast_shapes(base.shape, exponent.shape)
    if y is not None and (np.all(y == 2) or np.all(y == 3)):  # a constant 2 or 3: no pow
        power = square if np.all(y == 2) else cx.op("mul", square, base)
        return power if power.shape == out else cx.op("broadcast", power, shape=out)
    is2 = cx.op("eq", exponent, cx.scalar(2, exponent.dtype))
    is3 = cx.op("eq", exponent, cx.scalar(3, exponent.dtype))
    return cx.op("select", is2, square, cx.op("select", is3, cx.op("mul", square, base),
                                               _pow_through_f64(cx, base, exponent)))


def _pow_through_f64(cx: NodeContext, base, exponent):
    """T(pow(double(x), double(y))), T's minimum where that is NaN or out of T's range."""
    dt = base.dtype
    r = cx.op("pow", cx.cast(base, "f64"), cx.cast(exponent, "f64"))
    info = np.iinfo(dtypes.to_numpy(dt))
    # both bounds are powers of two (or 0), exact in float64; NaN fails both compares
    inside = cx.op("and", cx.op("ge", r, cx.scalar(float(info.min), "f64")),
                   cx.op("lt", r, cx.scalar(float(info.max) + 1.0, "f64")))
    return cx.op("select", inside, cx.cast(r, dt), cx.scalar(info.min, dt))


def _ort_squares(x_shape: tuple, y_shape: tuple) -> bool:
    """Whether onnxruntime's broadcast loop hands Pow's y to its one-y-per-span function
    (which squares or cubes by multiplying). Its Broadcaster (element_wise_ops.h) sets up
    the innermost dim of the two shapes (if one is a scalar, the other's innermost dim;
    else the innermost common dim with an output above 1, or the outermost common one) and
    an input is "scalar" per span if its size there is 1, x checked first: so y is when x's
    size there is above 1 and y's is 1."""
    if any(d is None for d in tuple(x_shape) + tuple(y_shape)):
        return False  # unknown at import: braze takes the general path
    if not x_shape:
        return False
    if not y_shape:
        return x_shape[-1] > 1
    common = min(len(x_shape), len(y_shape))
    for i in range(1, common + 1):
        a, b = x_shape[-i], y_shape[-i]
        if (0 if min(a, b) == 0 else max(a, b)) <= 1 and i < common:
            continue
        return a > 1 and b <= 1
    return False


@converter("Mod", 10)
def convert_mod(cx: NodeContext):
    """fmod=1: sign of the dividend (C fmod); fmod=0: sign of the divisor (Python).

    Before version 28, fmod=0 was defined for integers only.
    """
    a, b = cx.inputs
    if not cx.attr("fmod", 0) and a.dtype.startswith("f") and cx.version < 28:
        raise Fallback("Mod with fmod=0 is undefined for floating-point inputs")
    return [cx.op("fmod" if cx.attr("fmod", 0) else "mod", a, b)]


@converter("BitShift", 11)
def convert_bitshift(cx: NodeContext):
    """x << y or x >> y. Version 28 adds the signed integers (the importer's validation
    refuses them before, as onnxruntime does): a right shift of one is arithmetic, and an
    amount that is negative or at least the bit width gives -1 (a right shift of a negative
    x) or 0, as braze's shl/shr compute it (for the unsigned ones too, where onnxruntime
    gives 0 and LLVM's own shifts would give poison)."""
    direction = cx.attr("direction")
    ops = {"LEFT": "shl", "RIGHT": "shr"}
    if direction not in ops:
        raise Fallback(f"unknown BitShift direction {direction!r}")
    return [cx.op(ops[direction], cx.inputs[0], cx.inputs[1])]


@converter("IsInf", 10)
def convert_isinf(cx: NodeContext):
    """isinf(x), restricted by detect_positive / detect_negative."""
    x = cx.x
    pos, neg = cx.attr("detect_positive", 1), cx.attr("detect_negative", 1)
    inf = cx.op("isinf", x)
    if pos and neg:
        return [inf]
    if not pos and not neg:
        return [cx.op("and", inf, cx.op("ne", x, x))]  # always false
    sign = cx.op("gt" if pos else "lt", x, cx.scalar(0, x.dtype))
    return [cx.op("and", inf, sign)]


@converter("Where", 9)
def convert_where(cx: NodeContext):
    return [cx.op("select", *cx.inputs)]


@converter("Cast", 6)
def convert_cast(cx: NodeContext):
    to = dtype_of_elem(cx.attr("to"))
    if cx.attr("saturate", 1) != 1 and to not in ("f32", "f64", "f16"):
        raise Fallback("Cast with saturate=0 to a float8 type")
    return [cx.cast(cx.x, to)]


@converter("BitCast", 26)
def convert_bitcast(cx: NodeContext):
    """Each element's bits read as `to` (the same width: the spec's shape inference refuses
    others, so onnxruntime does too)."""
    src, to = cx.x.dtype, dtype_of_elem(cx.attr("to"))
    if src == to:
        return [cx.x]
    if "bool" in (src, to) or not {src, to} <= dtypes.NUMERIC:
        raise Fallback(f"BitCast from {src} to {to}: braze reinterprets plain numbers only")
    if dtypes.itemsize(src) != dtypes.itemsize(to):
        raise InvalidModelError(f"{cx.describe}: BitCast from {src} to {to} changes the "
                                "width (the spec requires equal bit widths)")
    return [cx.op("bitcast", cx.x, to=to)]


@converter("CastLike", 15)
def convert_cast_like(cx: NodeContext):
    return [cx.cast(cx.inputs[0], cx.inputs[1].dtype)]


@converter("Identity", 1)
def convert_identity(cx: NodeContext):
    return [cx.x]
