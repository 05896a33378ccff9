"""Elementwise ONNX ops: unary math, binary arithmetic, comparison, logic, bitwise,
variadic Sum/Mean/Max/Min, Where, Cast/CastLike, IsInf, Mod, BitShift, Pow.

ONNX requires equal element types on both sides of nearly every binary op and
broadcasts like numpy (opset >= 7), which is the IR's rule too. Pow is the
exception: its exponent may have another type, so it is cast to the base's.
"""

from __future__ import annotations

from compiler.ops import facets
from importers.onnx_ops import Fallback, converter
from importers.onnx_ops.context import NodeContext
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
    """x ** y; ONNX lets y have another numeric type: cast it to x's."""
    base, exponent = cx.inputs
    return [cx.op("pow", base, cx.cast(exponent, base.dtype))]


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


@converter("CastLike", 15)
def convert_cast_like(cx: NodeContext):
    return [cx.cast(cx.inputs[0], cx.inputs[1].dtype)]


@converter("Identity", 1)
def convert_identity(cx: NodeContext):
    return [cx.x]
