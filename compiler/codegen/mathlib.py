"""Vectorizable float32 math in LLVM IR: exp, log, tanh, sigmoid, erf.

LLVM's llvm.exp/llvm.log intrinsics lower to scalar libm calls, which block the
loop vectorizer; these are straight-line IR (no calls, no branches) that inline
into kernels and vectorize to AVX-512. float64 keeps the libm intrinsics.

Accuracy, measured against numpy in float64 and stated in ulps of float32
(tests/compiler/test_codegen_math.py checks these bounds over wide ranges):
  exp      <= 2 ulp for finite results, denormal results included (2^n is applied
           as two normal factors, so a denormal result is rounded once);
           +inf above 88.72, 0 below -103.98, NaN -> NaN.
  log      <= 2 ulp for normal x > 0; log(0) = -inf, log(x<0) = NaN, log(inf) = inf.
  tanh     <= 4 ulp (Taylor series near 0, 1 - 2/(exp(2|x|)+1) beyond).
  sigmoid  <= 4 ulp for x > -87 (e/(1+e) for x < 0, 1/(1+exp(-x)) for x >= 0).
  erf      <= 4 ulp (Taylor series for |x| < 1, 1 - erfc with Abramowitz-Stegun
           7.1.26 scaled by exp(-x^2) beyond; 1 for |x| >= 4).
"""

from __future__ import annotations

import math

from llvmlite import ir

from compiler.codegen.symbols import declare

F32 = ir.FloatType()
I32 = ir.IntType(32)

LN2_HI = 0.693145751953125  # ln 2 split so n * LN2_HI is exact for |n| < 2^11
LN2_LO = 1.428606765330187e-06
LOG2E = 1.4426950408889634
EXP_HI = 88.72283935546875  # largest x with a finite float32 exp(x)
EXP_LO = -103.98  # below this exp(x) rounds to 0 (2^-150 is half the least denormal)
EXP_FLOOR = -110.0  # exp clamps x here: its formula then rounds to 0 with no select
TANH_SMALL = 0.25  # Taylor series below, exp-based formula above (cancellation <= 2 bits)
ERF_SMALL = 1.0  # Taylor series below, erfc-based formula above
ERF_ONE = 4.0  # erf(x) rounds to 1.0f beyond this


def _c(x: float) -> ir.Constant:
    return ir.Constant(F32, x)


def _fast(instr):
    instr.flags.append("contract")
    return instr


def _poly(b: ir.IRBuilder, x, coeffs: list[float]):
    """Horner: coeffs[0] + x * (coeffs[1] + x * (...))."""
    acc = _c(coeffs[-1])
    for c in reversed(coeffs[:-1]):
        acc = _fast(b.fadd(_fast(b.fmul(acc, x)), _c(c)))
    return acc


def _select_nan(b, x, result):
    return b.select(b.fcmp_unordered("uno", x, x), x, result)


def exp_f32(b: ir.IRBuilder, x):
    """exp(x) = 2^n * exp(r), n = round(x / ln2), r = x - n ln2 in [-ln2/2, ln2/2]."""
    # clamp with min/max (one instruction each; a NaN comes back as itself at the end)
    xc = b.call(_intrinsic(b, "llvm.minnum.f32"), [x, _c(EXP_HI)])
    xc = b.call(_intrinsic(b, "llvm.maxnum.f32"), [xc, _c(EXP_FLOOR)])
    n = b.call(_intrinsic(b, "llvm.rint.f32"), [b.fmul(xc, _c(LOG2E))])
    # r = x - n ln2 in two fused steps (Cody-Waite; each product rounded once, in the FMA)
    r = _fast(b.fsub(xc, _fast(b.fmul(n, _c(LN2_HI)))))
    r = _fast(b.fsub(r, _fast(b.fmul(n, _c(LN2_LO)))))
    p = _poly(b, r, [1.0, 1.0, 1 / 2, 1 / 6, 1 / 24, 1 / 120, 1 / 720, 1 / 5040])
    # 2^n as 2^n1 * 2^n2 (n1 = n >> 1): both factors stay normal for n in [-159, 128];
    # below EXP_LO the product rounds to 0 by itself (x is clamped at EXP_FLOOR)
    ni = b.fptosi(n, I32)
    n1 = b.ashr(ni, ir.Constant(I32, 1))
    scaled = b.fmul(b.fmul(p, _pow2(b, n1)), _pow2(b, b.sub(ni, n1)))
    out = b.select(b.fcmp_ordered(">", x, _c(EXP_HI)), _c(math.inf), scaled)
    return _select_nan(b, x, out)


def _pow2(b: ir.IRBuilder, n):
    """2.0f ** n for an i32 n in the normal range [-126, 127]."""
    bits = b.shl(b.add(n, ir.Constant(I32, 127)), ir.Constant(I32, 23))
    return b.bitcast(bits, F32)


def log_f32(b: ir.IRBuilder, x):
    """log(x) = e ln2 + 2 atanh(s), x = m 2^e, m in [sqrt(1/2), sqrt(2)), s = (m-1)/(m+1)."""
    bits = b.bitcast(x, I32)
    e = b.sub(b.ashr(bits, ir.Constant(I32, 23)), ir.Constant(I32, 127))
    m = b.bitcast(b.or_(b.and_(bits, ir.Constant(I32, 0x007FFFFF)), ir.Constant(I32, 0x3F800000)),
                  F32)
    big = b.fcmp_ordered(">", m, _c(math.sqrt(2.0)))
    m = b.select(big, b.fmul(m, _c(0.5)), m)
    e = b.select(big, b.add(e, ir.Constant(I32, 1)), e)
    s = b.fdiv(b.fsub(m, _c(1.0)), b.fadd(m, _c(1.0)))
    s2 = b.fmul(s, s)
    series = b.fmul(s, _poly(b, s2, [2.0, 2 / 3, 2 / 5, 2 / 7, 2 / 9, 2 / 11]))
    ef = b.sitofp(e, F32)
    out = b.fadd(b.fadd(b.fmul(ef, _c(LN2_HI)), series), b.fmul(ef, _c(LN2_LO)))
    out = b.select(b.fcmp_ordered("==", x, _c(0.0)), _c(-math.inf), out)
    out = b.select(b.fcmp_ordered("<", x, _c(0.0)), _c(math.nan), out)
    out = b.select(b.fcmp_ordered("==", x, _c(math.inf)), _c(math.inf), out)
    return _select_nan(b, x, out)


def log_f32_full(b: ir.IRBuilder, x):
    """log with denormal inputs handled: log(x) = log(x * 2^23) - 23 ln2 for x < 2^-126."""
    tiny = b.fcmp_ordered("<", x, _c(2.0 ** -126))
    positive = b.fcmp_ordered(">", x, _c(0.0))
    scaled = b.select(b.and_(tiny, positive), b.fmul(x, _c(2.0 ** 23)), x)
    out = log_f32(b, scaled)
    fix = b.select(b.and_(tiny, positive), _c(23 * math.log(2.0)), _c(0.0))
    return b.fsub(out, fix)


def tanh_f32(b: ir.IRBuilder, x):
    ax = b.call(_intrinsic(b, "llvm.fabs.f32"), [x])
    x2 = b.fmul(x, x)
    small = b.fmul(x, _poly(b, x2, [1.0, -1 / 3, 2 / 15, -17 / 315, 62 / 2835, -1382 / 155925]))
    e = exp_f32(b, b.fmul(ax, _c(2.0)))
    big = b.fsub(_c(1.0), b.fdiv(_c(2.0), b.fadd(e, _c(1.0))))
    big = b.call(_intrinsic(b, "llvm.copysign.f32"), [big, x])
    out = b.select(b.fcmp_ordered("<", ax, _c(TANH_SMALL)), small, big)
    return _select_nan(b, x, out)


def sigmoid_f32(b: ir.IRBuilder, x):
    ax = b.call(_intrinsic(b, "llvm.fabs.f32"), [x])
    e = exp_f32(b, b.fsub(_c(0.0), ax))  # e = exp(-|x|) in (0, 1]
    pos = b.fdiv(_c(1.0), b.fadd(_c(1.0), e))
    neg = b.fdiv(e, b.fadd(_c(1.0), e))
    out = b.select(b.fcmp_ordered("<", x, _c(0.0)), neg, pos)
    return _select_nan(b, x, out)


# Abramowitz & Stegun 7.1.26: erfc(x) ~ t P(t) exp(-x^2), t = 1 / (1 + p x), x >= 0
_AS_P = 0.3275911
_AS_A = [0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429]


def erf_f32(b: ir.IRBuilder, x):
    ax = b.call(_intrinsic(b, "llvm.fabs.f32"), [x])
    x2 = b.fmul(x, x)
    # erf(x) = 2/sqrt(pi) sum (-1)^n x^(2n+1) / (n! (2n+1)), n = 0..10
    coeffs = [(-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(11)]
    small = b.fmul(b.fmul(x, _c(2 / math.sqrt(math.pi))), _poly(b, x2, coeffs))
    t = b.fdiv(_c(1.0), b.fadd(_c(1.0), b.fmul(ax, _c(_AS_P))))
    erfc = b.fmul(b.fmul(t, _poly(b, t, _AS_A)), exp_f32(b, b.fsub(_c(0.0), x2)))
    big = b.call(_intrinsic(b, "llvm.copysign.f32"), [b.fsub(_c(1.0), erfc), x])
    out = b.select(b.fcmp_ordered("<", ax, _c(ERF_SMALL)), small, big)
    out = b.select(b.fcmp_ordered(">=", ax, _c(ERF_ONE)),
                   b.call(_intrinsic(b, "llvm.copysign.f32"), [_c(1.0), x]), out)
    return _select_nan(b, x, out)


def _intrinsic(b: ir.IRBuilder, name: str):
    arity = 2 if name.startswith(("llvm.copysign", "llvm.minnum", "llvm.maxnum")) else 1
    return declare(b.module, name, F32, [F32] * arity)


FAST_F32 = {"exp": exp_f32, "log": log_f32_full, "tanh": tanh_f32, "sigmoid": sigmoid_f32,
            "erf": erf_f32}
