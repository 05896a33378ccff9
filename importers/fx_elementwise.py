"""aten elementwise ops -> IR elementwise ops.

Type promotion: aten ops take mixed dtypes and promote inside the kernel; the IR
wants equal dtypes. Arithmetic converters cast every operand to the output dtype
that the node's fake value states (torch already promoted it); comparisons cast
to `torch.result_type` of their operands. Python scalars become 0-d constants.
Activations are written out from IR primitives (the fuser sees primitives).
"""

from __future__ import annotations

import math

import torch

from compiler import dtypes
from compiler.ops import facets
from importers.fx_context import Ctx, Fallback, converts

aten = torch.ops.aten

# aten unary overload -> IR op; the operand is cast to the output dtype first
# (exp of an int tensor is a float tensor, as torch promotes it).
_UNARY = facets.attach_imports("fx_import", {
    aten.neg.default: "neg", aten.abs.default: "abs", aten.sign.default: "sign",
    aten.exp.default: "exp", aten.expm1.default: "expm1", aten.log.default: "log",
    aten.log1p.default: "log1p", aten.sqrt.default: "sqrt",
    aten.reciprocal.default: "reciprocal", aten.sin.default: "sin", aten.cos.default: "cos",
    aten.tan.default: "tan", aten.asin.default: "asin", aten.acos.default: "acos",
    aten.atan.default: "atan", aten.sinh.default: "sinh", aten.cosh.default: "cosh",
    aten.tanh.default: "tanh", aten.asinh.default: "asinh", aten.acosh.default: "acosh",
    aten.atanh.default: "atanh", aten.sigmoid.default: "sigmoid", aten.erf.default: "erf",
    aten.floor.default: "floor", aten.ceil.default: "ceil", aten.round.default: "round",
    aten.bitwise_not.default: "bitnot",
})

# aten predicate -> IR op (bool result; the operand keeps its dtype)
_PREDICATE = facets.attach_imports("fx_import", {aten.isnan.default: "isnan", aten.isinf.default: "isinf"})

# aten binary overloads -> IR op; operands cast to the output dtype
_ARITH = facets.attach_imports("fx_import", {
    aten.mul.Tensor: "mul", aten.mul.Scalar: "mul",
    aten.div.Tensor: "div", aten.div.Scalar: "div",
    aten.maximum.default: "max", aten.minimum.default: "min",
    aten.remainder.Tensor: "mod", aten.remainder.Scalar: "mod",
    aten.fmod.Tensor: "fmod", aten.fmod.Scalar: "fmod",
    aten.bitwise_and.Tensor: "bitand", aten.bitwise_and.Scalar: "bitand",
    aten.bitwise_or.Tensor: "bitor", aten.bitwise_or.Scalar: "bitor",
    aten.bitwise_xor.Tensor: "bitxor", aten.bitwise_xor.Scalar: "bitxor",
    aten.atan2.default: "atan2", aten.hypot.default: "hypot",
})

# aten comparisons -> IR op; operands cast to their promoted dtype, result bool
_COMPARE = facets.attach_imports("fx_import", {
    aten.eq.Tensor: "eq", aten.eq.Scalar: "eq", aten.ne.Tensor: "ne", aten.ne.Scalar: "ne",
    aten.lt.Tensor: "lt", aten.lt.Scalar: "lt", aten.le.Tensor: "le", aten.le.Scalar: "le",
    aten.gt.Tensor: "gt", aten.gt.Scalar: "gt", aten.ge.Tensor: "ge", aten.ge.Scalar: "ge",
})

_LOGICAL = facets.attach_imports("fx_import", {aten.logical_and.default: "and", aten.logical_or.default: "or",
            aten.logical_xor.default: "xor"})


def _unary(ir_op):
    def convert(cx: Ctx, x):
        dt = cx.out().dtype
        if ir_op == "bitnot" and dt == "bool":
            return cx.op("not", x)  # ~mask: bitwise not of a bool is logical not
        return cx.op(ir_op, cx.cast(x, dt))
    return convert


def _predicate(ir_op):
    def convert(cx: Ctx, x):
        return cx.op(ir_op, x)
    return convert


# On bools (torch's mul, maximum and bitwise ops of masks) the arithmetic IR ops are
# the logical ones.
_ON_BOOL = {"mul": "and", "min": "and", "bitand": "and", "max": "or", "bitor": "or",
            "bitxor": "xor"}


def _binary(ir_op):
    def convert(cx: Ctx, a, b):
        dt = cx.out().dtype
        op = _ON_BOOL.get(ir_op, ir_op) if dt == "bool" else ir_op
        return cx.op(op, cx.tensor(a, dt), cx.tensor(b, dt))
    return convert


def _compare(ir_op):
    def convert(cx: Ctx, a, b):
        dt = cx.result_type(a, b)
        return cx.op(ir_op, cx.tensor(a, dt), cx.tensor(b, dt))
    return convert


def _logical(ir_op):
    def convert(cx: Ctx, a, b):
        return cx.op(ir_op, _truth(cx, a), _truth(cx, b))
    return convert


def _truth(cx: Ctx, x):
    """x != 0 as a bool tensor."""
    if x.dtype == "bool":
        return x
    return cx.op("ne", x, cx.scalar(0, x.dtype))


for _t, _op in _UNARY.items():
    converts(_t)(_unary(_op))
for _t, _op in _PREDICATE.items():
    converts(_t)(_predicate(_op))
for _t, _op in _ARITH.items():
    converts(_t)(_binary(_op))
for _t, _op in _COMPARE.items():
    converts(_t)(_compare(_op))
for _t, _op in _LOGICAL.items():
    converts(_t)(_logical(_op))


@converts(aten.round.decimals)
def _round_decimals(cx: Ctx, x, decimals=0):
    """torch's order of operations: round(x * 10^d) / 10^d, or for d < 0 round(x / 10^-d)
    * 10^-d, halves to even, the power of ten in x's dtype."""
    dt = cx.out().dtype
    if dt not in ("f32", "f64"):
        raise Fallback(f"round to decimals of {dt}")
    if decimals == 0:
        return cx.op("round", x)
    scale = cx.scalar(10.0 ** abs(decimals), dt)
    inner, outer = ("mul", "div") if decimals > 0 else ("div", "mul")
    return cx.op(outer, cx.op("round", cx.op(inner, x, scale)), scale)


@converts(aten.logical_not.default)
def _logical_not(cx: Ctx, x):
    return cx.cast(cx.op("not", _truth(cx, x)), cx.out().dtype)


@converts(aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar)
def _add_sub(cx: Ctx, a, b, alpha=1):
    dt = cx.out().dtype
    b = cx.tensor(b, dt)
    if alpha != 1:
        b = cx.op("mul", b, cx.scalar(alpha, dt))
    op = "add" if cx.target in (aten.add.Tensor, aten.add.Scalar) else "sub"
    return cx.op(op, cx.tensor(a, dt), b)


@converts(aten.fmax.default, aten.fmin.default)
def _fmax_fmin(cx: Ctx, a, b):
    """torch.fmax / fmin: maximum / minimum, except that a NaN operand gives the other
    one (NaN only where both are); on integers, maximum / minimum."""
    dt = cx.out().dtype
    op = "max" if cx.target is aten.fmax.default else "min"
    a, b = cx.tensor(a, dt), cx.tensor(b, dt)
    m = cx.op(op, a, b)
    if dt not in dtypes.FLOATS:
        return m
    m = cx.op("select", cx.op("isnan", a), b, m)
    return cx.op("select", cx.op("isnan", b), a, m)


@converts(aten.ldexp.Tensor)
def _ldexp(cx: Ctx, x, e):
    """x * 2^e, as torch computes it (a multiply by pow(2, e) in the result's dtype)."""
    dt = cx.out().dtype
    if dt not in dtypes.FLOATS:
        raise Fallback(f"ldexp giving {dt}")
    return cx.op("mul", cx.tensor(x, dt), cx.op("pow", cx.scalar(2.0, dt), cx.tensor(e, dt)))


@converts(aten.rsub.Scalar, aten.rsub.Tensor)
def _rsub(cx: Ctx, a, b, alpha=1):
    dt = cx.out().dtype
    a = cx.tensor(a, dt)
    if alpha != 1:
        a = cx.op("mul", a, cx.scalar(alpha, dt))
    return cx.op("sub", cx.tensor(b, dt), a)


@converts(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(cx: Ctx, a, b, rounding_mode=None):
    dt = cx.out().dtype
    a, b = cx.tensor(a, dt), cx.tensor(b, dt)
    if rounding_mode is None:
        return cx.op("div", a, b)
    if dt in dtypes.FLOATS:
        q = cx.op("div", a, b)
        return _trunc(cx, q) if rounding_mode == "trunc" else cx.op("floor", q)
    if dt not in dtypes.SIGNED:
        raise Fallback(f"rounding division of {dt}")
    q = cx.op("div", a, b)  # integer div truncates toward zero
    if rounding_mode == "trunc":
        return q
    # floor: step down where the remainder is non-zero and its sign differs from b's
    r = cx.op("sub", a, cx.op("mul", q, b))
    zero = cx.scalar(0, dt)
    differ = cx.op("ne", cx.op("lt", r, zero), cx.op("lt", b, zero))
    step = cx.op("and", cx.op("ne", r, zero), differ)
    return cx.op("sub", q, cx.cast(step, dt))


def _trunc(cx: Ctx, x):
    return cx.op("select", cx.op("lt", x, cx.scalar(0, x.dtype)), cx.op("ceil", x),
                 cx.op("floor", x))


@converts(aten.trunc.default)
def _trunc_op(cx: Ctx, x):
    return _trunc(cx, cx.cast(x, cx.out().dtype)) if cx.out().dtype in dtypes.FLOATS else x


@converts(aten.frac.default)
def _frac(cx: Ctx, x):
    return cx.op("sub", x, _trunc(cx, x))


@converts(aten.rsqrt.default)
def _rsqrt(cx: Ctx, x):
    return cx.op("reciprocal", cx.op("sqrt", cx.cast(x, cx.out().dtype)))


@converts(aten.log2.default, aten.log10.default)
def _log_base(cx: Ctx, x):
    dt = cx.out().dtype
    base = 2.0 if cx.target is aten.log2.default else 10.0
    return cx.op("div", cx.op("log", cx.cast(x, dt)), cx.scalar(math.log(base), dt))


@converts(aten.exp2.default)
def _exp2(cx: Ctx, x):
    dt = cx.out().dtype
    return cx.op("pow", cx.scalar(2.0, dt), cx.cast(x, dt))


@converts(aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.pow.Scalar)
def _pow(cx: Ctx, a, b):
    dt = cx.out().dtype
    if dt not in dtypes.FLOATS:
        raise Fallback(f"integer pow ({dt}) has error-on-negative semantics in torch")
    x = cx.tensor(a, dt)
    if b == 2:
        return cx.op("mul", x, x)
    if b == 0.5:
        return cx.op("sqrt", x)
    return cx.op("pow", x, cx.tensor(b, dt))


@converts(aten.relu.default)
def _relu(cx: Ctx, x):
    return cx.op("max", x, cx.scalar(0, x.dtype))


@converts(aten.clamp.default, aten.clamp.Tensor)
def _clamp(cx: Ctx, x, lo=None, hi=None):
    dt = cx.out().dtype
    y = cx.cast(x, dt)
    if lo is not None:
        y = cx.op("max", y, cx.tensor(lo, dt))
    if hi is not None:
        y = cx.op("min", y, cx.tensor(hi, dt))
    return y


@converts(aten.clamp_min.default, aten.clamp_min.Tensor)
def _clamp_min(cx: Ctx, x, lo):
    return _clamp(cx, x, lo, None)


@converts(aten.clamp_max.default, aten.clamp_max.Tensor)
def _clamp_max(cx: Ctx, x, hi):
    return _clamp(cx, x, None, hi)


@converts(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(cx: Ctx, cond, a, b):
    dt = cx.out().dtype
    return cx.op("select", _truth(cx, cond), cx.tensor(a, dt), cx.tensor(b, dt))


@converts(aten.gelu.default)
def _gelu(cx: Ctx, x, approximate="none"):
    dt = x.dtype
    half = cx.op("mul", x, cx.scalar(0.5, dt))
    if approximate == "tanh":
        cube = cx.op("mul", cx.op("mul", x, x), x)
        inner = cx.op("add", x, cx.op("mul", cube, cx.scalar(0.044715, dt)))
        t = cx.op("tanh", cx.op("mul", inner, cx.scalar(math.sqrt(2 / math.pi), dt)))
    else:
        t = cx.op("erf", cx.op("mul", x, cx.scalar(1 / math.sqrt(2), dt)))
    return cx.op("mul", half, cx.op("add", t, cx.scalar(1.0, dt)))


@converts(aten.silu.default)
def _silu(cx: Ctx, x):
    return cx.op("mul", x, cx.op("sigmoid", x))


@converts(aten.hardtanh.default)
def _hardtanh(cx: Ctx, x, lo=-1.0, hi=1.0):
    return _clamp(cx, x, lo, hi)


@converts(aten.leaky_relu.default)
def _leaky_relu(cx: Ctx, x, slope=0.01):
    zero = cx.scalar(0, x.dtype)
    return cx.op("select", cx.op("gt", x, zero), x, cx.op("mul", x, cx.scalar(slope, x.dtype)))


@converts(aten.elu.default)
def _elu(cx: Ctx, x, alpha=1.0, scale=1.0, input_scale=1.0):
    dt = x.dtype
    neg = cx.op("mul", cx.op("expm1", cx.op("mul", x, cx.scalar(input_scale, dt))),
                cx.scalar(alpha * scale, dt))
    pos = cx.op("mul", x, cx.scalar(scale, dt))
    return cx.op("select", cx.op("gt", x, cx.scalar(0, dt)), pos, neg)


@converts(aten.hardsigmoid.default)
def _hardsigmoid(cx: Ctx, x):
    dt = x.dtype
    y = cx.op("div", cx.op("add", x, cx.scalar(3.0, dt)), cx.scalar(6.0, dt))
    return _clamp(cx, y, 0.0, 1.0)


@converts(aten.hardswish.default)
def _hardswish(cx: Ctx, x):
    return cx.op("mul", x, _hardsigmoid(cx, x))


@converts(aten.softplus.default)
def _softplus(cx: Ctx, x, beta=1.0, threshold=20.0):
    dt = x.dtype
    bx = cx.op("mul", x, cx.scalar(beta, dt))
    soft = cx.op("div", cx.op("log1p", cx.op("exp", bx)), cx.scalar(beta, dt))
    return cx.op("select", cx.op("gt", bx, cx.scalar(threshold, dt)), x, soft)


@converts(aten.mish.default)
def _mish(cx: Ctx, x):
    return cx.op("mul", x, cx.op("tanh", _softplus(cx, x)))


@converts(aten._to_copy.default)
def _to_copy(cx: Ctx, x, dtype=None, layout=None, device=None, pin_memory=None,
             non_blocking=False, memory_format=None):
    if device is not None and torch.device(device).type != "cpu":
        raise Fallback(f"copies to device {device}")
    return cx.cast(x, cx.out().dtype)


@converts(aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default,
          aten.detach.default, aten.contiguous.default)
def _identity(cx: Ctx, x, *rest, **kwargs):
    return x
