"""Elementwise ops on LLVM registers: one table, one function per op family.

Semantics match compiler/ops (numpy): integer division truncates toward zero
and is guarded so a kernel never traps (INT_MIN / -1 wraps; x / 0 is what
compiler.ops computes: x, plus 1 if x < 0; x mod 0 = 0); `mod`
takes the divisor's sign; max/min propagate NaN; float -> int casts saturate
(NaN -> 0); shifts by the bit width or more (or by a negative amount) give 0, but
-1 for a right shift of a negative signed x (shr of a signed dtype is arithmetic).
"""

from __future__ import annotations

import math

from llvmlite import ir

from compiler import dtypes
from compiler.codegen.mathlib import FAST_F32
from compiler.codegen.symbols import declare
from compiler.ir import IRError

I1, I8, I16, I32, I64 = (ir.IntType(n) for n in (1, 8, 16, 32, 64))
F16, F32, F64 = ir.HalfType(), ir.FloatType(), ir.DoubleType()

_TYPES = {"bool": I1, "i8": I8, "u8": I8, "i16": I16, "u16": I16, "i32": I32, "u32": I32,
          "i64": I64, "u64": I64, "f16": F16, "f32": F32, "f64": F64}
# dtypes braze's CPU kernels compute with
SUPPORTED_DTYPES = frozenset(_TYPES)
# dtypes kernels only load, store, move and cast (compiler/passes/widen.py computes f16
# as f32)
CAST_ONLY_DTYPES = frozenset({"f16"})
_FLOAT_BITS = {"f16": 16, "f32": 32, "f64": 64}


def llvm_type(dtype: str) -> ir.Type:
    try:
        return _TYPES[dtype]
    except KeyError:
        raise IRError(f"no LLVM type for dtype {dtype}") from None


def storage_type(dtype: str) -> ir.Type:
    """In-memory element type: bool is one byte, as in numpy."""
    return I8 if dtype == "bool" else llvm_type(dtype)


def _is_float(dtype: str) -> bool:
    return dtype in dtypes.FLOATS


def _type_suffix(t: ir.Type) -> str:
    """An overloaded intrinsic's name suffix for float type t (vectors too: v16f32)."""
    if isinstance(t, ir.VectorType):
        return f"v{t.count}{_type_suffix(t.element)}"
    return "f32" if t == F32 else "f64"


def intrinsic(b: ir.IRBuilder, name: str, t: ir.Type, arity: int = 1, ret=None):
    """The declaration of `name` (an llvm.* intrinsic, suffixed for float type t, vectors
    too; or a libm function) taking `arity` operands of type t, as the target calls it."""
    full = f"{name}.{_type_suffix(t)}" if name.startswith("llvm.") else name
    return declare(b.module, _math_symbol(b.module, full), ret or t, [t] * arity)


def _libm(b, name: str, t, x):
    """A scalar libm call (sinf / sin ...): exact but not vectorized."""
    return b.call(intrinsic(b, name + ("f" if t == F32 else ""), t), [x])


def _frem(b, x, y):
    """C's fmod: the frem instruction, or libdevice's exact fmod on NVPTX (whose own frem
    expansion, x - trunc(x / y) * y, is not exact)."""
    if not _is_nvptx(b.module):
        return b.frem(x, y)
    return b.call(intrinsic(b, "fmodf" if x.type == F32 else "fmod", x.type, 2), [x, y])


# -- targets without a C math library -------------------------------------------
# NVPTX has no libm and cannot lower llvm.exp/log/pow: those calls go to CUDA's libdevice
# (__nv_sinf, __nv_exp, ...), which compiler/codegen/nvptx.py links into the module. The
# module's triple says which target a kernel is for (the CUDA renderer sets it).
_NVPTX_LIBCALLS = {"llvm.exp": "exp", "llvm.log": "log", "llvm.pow": "pow"}


def _is_nvptx(module: ir.Module) -> bool:
    return module.triple.startswith("nvptx")


def _math_symbol(module: ir.Module, name: str) -> str:
    """`name` (a libm function or an llvm.* intrinsic) as the module's target calls it."""
    if not _is_nvptx(module):
        return name
    base, _, suffix = name.rpartition(".")
    if base in _NVPTX_LIBCALLS:
        return "__nv_" + _NVPTX_LIBCALLS[base] + ("f" if suffix == "f32" else "")
    return name if name.startswith("llvm.") else "__nv_" + name


def needs_libm(op: str, dtype: str) -> bool:
    """Whether `op` on `dtype` calls a C math function (not an instruction, an LLVM
    intrinsic that every target lowers, or braze's own mathlib): on NVPTX, a libdevice call."""
    if dtype not in ("f32", "f64"):
        return False
    if dtype == "f32" and op in FAST_F32:
        return False
    return op in _LIBM or op in _LIBM2 or op in ("exp", "log", "sigmoid", "pow", "fmod",
                                                  "mod")


# -- unary ----------------------------------------------------------------------

_LIBM = {"sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh",
         "atanh", "expm1", "log1p", "tanh", "erf"}
# binary ops that are a libm call (atan2f / atan2 ...): exact, not vectorized
_LIBM2 = {"atan2", "hypot"}
_INTRINSIC = {"sqrt": "llvm.sqrt", "floor": "llvm.floor", "ceil": "llvm.ceil",
              "round": "llvm.roundeven", "abs": "llvm.fabs"}


def _unary_float(b, op: str, dtype: str, x):
    t = x.type
    if dtype == "f32" and op in FAST_F32:
        return FAST_F32[op](b, x)
    if op in _INTRINSIC:
        return b.call(intrinsic(b, _INTRINSIC[op], t), [x])
    if op == "exp":
        return b.call(intrinsic(b, "llvm.exp", t), [x])
    if op == "log":
        return b.call(intrinsic(b, "llvm.log", t), [x])
    if op == "sigmoid":
        one = ir.Constant(t, 1.0)
        e = b.call(intrinsic(b, "llvm.exp", t), [b.fneg(x)])
        return b.fdiv(one, b.fadd(one, e))
    if op in _LIBM:
        return _libm(b, op, t, x)
    if op == "neg":
        return b.fneg(x)
    if op == "reciprocal":
        return b.fdiv(ir.Constant(t, 1.0), x)
    if op == "sign":
        zero = ir.Constant(t, 0.0)
        pos = b.select(b.fcmp_ordered(">", x, zero), ir.Constant(t, 1.0), x)
        return b.select(b.fcmp_ordered("<", x, zero), ir.Constant(t, -1.0), pos)
    if op == "isnan":
        return b.fcmp_unordered("uno", x, x)
    if op == "isinf":
        ax = b.call(intrinsic(b, "llvm.fabs", t), [x])
        return b.fcmp_ordered("==", ax, ir.Constant(t, math.inf))
    raise IRError(f"no float emitter for {op}")


def _unary_int(b, op: str, dtype: str, x):
    t = x.type
    signed = dtype in dtypes.SIGNED
    if op == "neg":
        return b.neg(x)
    if op == "abs":
        return b.select(b.icmp_signed("<", x, ir.Constant(t, 0)), b.neg(x), x) if signed else x
    if op == "sign":
        zero, one = ir.Constant(t, 0), ir.Constant(t, 1)
        pos = b.select(b.icmp_unsigned("!=", x, zero), one, zero)
        return b.select(b.icmp_signed("<", x, zero), ir.Constant(t, -1), pos) if signed else pos
    if op in ("bitnot", "not"):
        return b.xor(x, ir.Constant(t, -1 if t != I1 else 1))
    raise IRError(f"no integer emitter for {op}")


# -- binary ---------------------------------------------------------------------

_FBIN = {"add": "fadd", "sub": "fsub", "mul": "fmul", "div": "fdiv"}
_IBIN = {"add": "add", "sub": "sub", "mul": "mul", "and": "and_", "or": "or_", "xor": "xor",
         "bitand": "and_", "bitor": "or_", "bitxor": "xor"}
_CMP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def binary_float(b, op: str, x, y):
    t = x.type
    if op in _FBIN:
        return getattr(b, _FBIN[op])(x, y)
    if op in ("max", "min"):
        name = "llvm.maximum" if op == "max" else "llvm.minimum"
        return b.call(intrinsic(b, name, t, 2), [x, y])
    if op == "pow":
        return b.call(intrinsic(b, "llvm.pow", t, 2), [x, y])
    if op in _LIBM2:
        return b.call(intrinsic(b, op + ("f" if t == F32 else ""), t, 2), [x, y])
    if op == "fmod":
        return _frem(b, x, y)
    if op == "mod":  # Python: result has the divisor's sign
        r = _frem(b, x, y)
        zero = ir.Constant(t, 0.0)
        fix = b.and_(b.fcmp_ordered("!=", r, zero),
                     b.xor(b.fcmp_ordered("<", r, zero), b.fcmp_ordered("<", y, zero)))
        return b.select(fix, b.fadd(r, y), r)
    if op in _CMP:
        if op == "ne":
            return b.fcmp_unordered("!=", x, y)
        return b.fcmp_ordered(_CMP[op], x, y)
    raise IRError(f"no float emitter for {op}")


def binary_int(b, op: str, dtype: str, x, y):
    t = x.type
    signed = dtype in dtypes.SIGNED or dtype == "bool"
    if op in _IBIN:
        return getattr(b, _IBIN[op])(x, y)
    if op in _CMP:
        cmp = b.icmp_signed if dtype in dtypes.SIGNED else b.icmp_unsigned
        return cmp(_CMP[op], x, y)
    if op in ("max", "min"):
        cmp = b.icmp_signed if dtype in dtypes.SIGNED else b.icmp_unsigned
        return b.select(cmp(">" if op == "max" else "<", x, y), x, y)
    if op in ("div", "mod", "fmod"):
        return _int_divide(b, op, x, y, signed)
    if op in ("shl", "shr"):
        # LLVM's shifts by the bit width or more are poison: compiler.ops (ONNX BitShift)
        # gives the sign fill there. A negative (signed) amount compares unsigned as one.
        width = ir.Constant(t, t.width)
        too_far = b.icmp_unsigned(">=", y, width)
        if op == "shr" and dtype in dtypes.SIGNED:  # arithmetic: clamp to width - 1
            return b.ashr(x, b.select(too_far, ir.Constant(t, t.width - 1), y))
        shifted = b.shl(x, y) if op == "shl" else b.lshr(x, y)
        return b.select(too_far, ir.Constant(t, 0), shifted)
    raise IRError(f"no integer emitter for {op}")


def _int_divide(b, op, x, y, signed):
    t = x.type
    zero, one = ir.Constant(t, 0), ir.Constant(t, 1)
    y_zero = b.icmp_unsigned("==", y, zero)
    # x / 0 and INT_MIN / -1 would trap: divide by 1 there and patch the result
    safe = b.select(y_zero, one, y)
    if signed:
        minus1 = b.icmp_signed("==", safe, ir.Constant(t, -1))
        safe = b.select(minus1, one, safe)
    if op == "div":
        q = b.sdiv(x, safe) if signed else b.udiv(x, safe)
        if not signed:
            return q  # x / 0 = x, as compiler.ops computes it
        q = b.select(minus1, b.neg(x), q)
        # x / 0 = x + (x < 0): compiler.ops' floor-then-truncate on a divisor of 1
        by_zero = b.add(x, b.zext(b.icmp_signed("<", x, zero), t))
        return b.select(y_zero, by_zero, q)
    r = b.srem(x, safe) if signed else b.urem(x, safe)
    if signed:
        r = b.select(minus1, zero, r)
        if op == "mod":
            fix = b.and_(b.icmp_signed("!=", r, zero),
                         b.xor(b.icmp_signed("<", r, zero), b.icmp_signed("<", y, zero)))
            r = b.select(fix, b.add(r, y), r)
    return b.select(y_zero, zero, r)


# -- cast -----------------------------------------------------------------------

def cast(b, x, src: str, dst: str):
    st, dt = llvm_type(src), llvm_type(dst)
    if src == dst:
        return x
    # f16 goes through f32 (exact both ways for f16's values; LLVM would call compiler-rt
    # helpers for double <-> half and 64-bit integers <-> half, which the JIT lacks)
    if src == "f16":
        return cast(b, b.fpext(x, _like(x, F32)), "f32", dst)
    if dst == "f16":
        wide = _to_f32_odd(b, x) if src == "f64" else cast(b, x, src, "f32")
        return b.fptrunc(wide, _like(x, F16))
    if dst == "bool":
        if _is_float(src):
            return b.fcmp_unordered("!=", x, ir.Constant(st, 0.0))
        return b.icmp_unsigned("!=", x, ir.Constant(st, 0))
    if _is_float(src) and _is_float(dst):
        widen = _FLOAT_BITS[dst] > _FLOAT_BITS[src]
        return b.fpext(x, dt) if widen else b.fptrunc(x, dt)
    if _is_float(dst):
        if src in dtypes.SIGNED:
            return b.sitofp(x, dt)
        return b.uitofp(x, dt)
    if _is_float(src):  # saturating: NaN -> 0, out of range -> the nearest bound
        name = "llvm.fptosi.sat" if dst in dtypes.SIGNED else "llvm.fptoui.sat"
        full = f"{name}.i{dt.width}.f{_FLOAT_BITS[src]}"
        return b.call(declare(b.module, full, dt, [st]), [x])
    if dt.width == st.width:
        return x
    if dt.width < st.width:
        return b.trunc(x, dt)
    return b.sext(x, dt) if src in dtypes.SIGNED else b.zext(x, dt)


def _like(x, element: ir.Type) -> ir.Type:
    """`element`, or a vector of it as long as x's."""
    return ir.VectorType(element, x.type.count) if isinstance(x.type, ir.VectorType) else element


def _to_f32_odd(b, x):
    """f64 -> f32 rounded to odd: truncated toward zero, the last bit set when inexact.
    Rounding that to f16 gives f64 -> f16 correctly rounded (f32 keeps 13 more bits than
    f16, so no double rounding); NaN and infinities pass through, overflow stays finite
    and then rounds to infinity."""
    i32 = _like(x, I32)
    near = b.fptrunc(x, _like(x, F32))
    exact = b.fcmp_unordered("==", b.fpext(near, x.type), x)  # NaN: keep as is
    bits = b.bitcast(near, i32)
    fabs = intrinsic(b, "llvm.fabs", x.type)
    away = b.fcmp_ordered(">", b.call(fabs, [b.fpext(near, x.type)]), b.call(fabs, [x]))
    one = ir.Constant(i32, 1)  # (a vector type splats it)
    toward_zero = b.select(away, b.sub(bits, one), bits)
    odd = b.bitcast(b.or_(toward_zero, one), near.type)
    return b.select(exact, near, odd)


# -- dispatch --------------------------------------------------------------------

def emit(b: ir.IRBuilder, node, args: list):
    """The node's element from its operands' elements (same-dtype operands, as the IR says)."""
    op = node.op
    src = node.inputs[0].dtype
    if op == "cast":
        return cast(b, args[0], src, node.attrs["to"])
    if op == "bitcast":  # same width (the IR checks): LLVM's bitcast, a no-op on ints
        return b.bitcast(args[0], llvm_type(node.attrs["to"]))
    if len(args) == 1:
        return _unary_float(b, op, src, args[0]) if _is_float(src) else \
            _unary_int(b, op, src, args[0])
    if len(args) == 2:
        return binary_float(b, op, *args) if _is_float(src) else \
            binary_int(b, op, src, *args)
    raise IRError(f"no emitter for {node.describe()}")


# Elementwise ops the CPU emitter handles, and the dtypes each refuses.
INT_REFUSED = {"pow": "integer pow is not compiled by braze"}
