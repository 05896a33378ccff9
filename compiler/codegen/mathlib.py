"""Vectorizable float32 math in LLVM IR: exp, log, tanh, sigmoid, erf.

Each function takes a float or a vector of floats (the register epilogue of a
contraction applies them to whole accumulator vectors) and returns the same type.

LLVM's llvm.exp/llvm.log intrinsics lower to scalar libm calls, which block the
loop vectorizer; these are straight-line IR (no calls, no branches) that inline
into kernels and vectorize to AVX-512. float64 keeps the libm intrinsics. A module
marked by `for_target` (cpu.Renderer marks its own) scales exp's 2^n with llvm.ldexp
on AVX-512 (vscalefps), and a 16-float vector (a register epilogue's) by vscalefps on n
as a float, with no conversions (2035 -> 1867 instructions in a 1x1 conv + SiLU kernel;
its timing moved within this machine's noise). Elsewhere (AVX2, SSE, NEON, scalars) n
comes from adding and taking away ROUNDER, and its integer value from the sum's bits,
not from fptosi, whose result for a NaN is poison (tanh's expm1 too): in both forms
exp's, sigmoid's and tanh's NaNs flow through to the result, with no compare and select
to put them back, and their clamps (erf's too) are selects that keep a NaN (one
vmaxps/vminps each, where llvm.minnum without nnan adds a NaN fix-up). Sigmoid divides
once (its numerator selected by sign).

Accuracy, measured against numpy in float64 and stated in ulps of float32
(tests/compiler/test_codegen_math.py checks these bounds over wide ranges), in an
element-wise kernel (IEEE denormals; a summing kernel flushes them: fpmode.py):
  exp      <= 2 ulp for finite results, denormal results included (2^n is applied
           as two normal factors, so a denormal result is rounded once);
           +inf above 88.72, 0 below -103.98, NaN -> NaN.
  log      <= 2 ulp for normal x > 0; log(0) = -inf, log(x<0) = NaN, log(inf) = inf.
  tanh     <= 4 ulp (m / (m + 2), m = expm1(2|x|), for every x).
  sigmoid  <= 4 ulp for x > -87 (e/(1+e) for x < 0, 1/(1+exp(-x)) for x >= 0).
  erf      <= 6 ulp (x P(x^2) / Q(x^2), a rational fit, for |x| < 4; 1 beyond; 4M points
           of [0, 4.2]: mean 0.8 ulp, 0.01% above 4).
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
ROUNDER = 12582912.0  # 1.5 * 2^23: v + ROUNDER - ROUNDER is v rounded to an integer
ROUNDER_BITS = 0x4B400000  # its float32 bits: the sum's bits less these are that integer
TANH_CLAMP = 10.0  # tanh(10) = 1 - 4e-9: 1.0f, as for every larger |x|
ERF_ONE = 4.0  # erf(x) rounds to 1.0f beyond this


def _vec_count(t) -> int:
    """Lanes of a float32 vector type, 0 for the scalar float."""
    return t.count if isinstance(t, ir.VectorType) else 0


def _c(b: ir.IRBuilder, t, x: float):
    """The constant x of float type t (float or a vector of floats): a vector's splat is
    made once per function, in its entry block (a literal vector constant is `count`
    numbers of IR text at every use; LLVM folds the splat back to a constant)."""
    return _const(b, t, F32, float(x))


def _ci(b: ir.IRBuilder, t, n: int):
    """The i32 constant n, as a vector of t's lanes when t is a vector."""
    return _const(b, t, I32, int(n))


def _const(b: ir.IRBuilder, t, elem, value):
    lanes = _vec_count(t)
    if not lanes:
        return ir.Constant(elem, value)
    fn = b.function
    cache = getattr(fn, "braze_math_splats", None)
    if cache is None:
        cache = fn.braze_math_splats = {}
    key = (lanes, str(elem), repr(value))
    if key not in cache:
        vt = ir.VectorType(elem, lanes)
        with b.goto_entry_block():
            v = b.insert_element(ir.Constant(vt, ir.Undefined), ir.Constant(elem, value),
                                 ir.Constant(I32, 0))
            cache[key] = b.shuffle_vector(v, ir.Constant(vt, ir.Undefined),
                                          ir.Constant(ir.VectorType(I32, lanes), None))
    return cache[key]


def _int_type(t):
    lanes = _vec_count(t)
    return ir.VectorType(I32, lanes) if lanes else I32


def _fast(instr):
    instr.flags.append("contract")
    return instr


def _poly(b: ir.IRBuilder, x, coeffs: list[float]):
    """coeffs[0] + coeffs[1] x + coeffs[2] x^2 + ..., by Estrin's scheme: pairs c0 + c1 x,
    then pairs of those with x^2, then with x^4: a chain of about log2(degree) + 1
    multiply-adds where Horner's is `degree` long. The functions here run on a GEMM
    tile's accumulators just after its K loop, where on AVX2 the 16 registers hold few
    chains at once: SiLU after a 112x112 16 -> 96 1x1 conv, 1 thread, min of 100: AVX2
    1189 -> 982 us, AVX-512 742 -> 718 us (exp's degree-7 series: 7 dependent FMAs ->
    4). The functions' error bounds in tests/compiler/test_codegen_math.py hold
    unchanged."""
    t = x.type
    terms = [_c(b, t, c0) if i + 1 == len(coeffs) else
             _fast(b.fadd(_fast(b.fmul(x, _c(b, t, coeffs[i + 1]))), _c(b, t, c0)))
             for i, c0 in enumerate(coeffs) if i % 2 == 0]
    power = x
    while len(terms) > 1:
        power = b.fmul(power, power)
        terms = [terms[i] if i + 1 == len(terms) else
                 _fast(b.fadd(_fast(b.fmul(power, terms[i + 1])), terms[i]))
                 for i in range(0, len(terms), 2)]
    return terms[0]


def _select_nan(b, x, result):
    return b.select(b.fcmp_unordered("uno", x, x), x, result)


def exp_f32(b: ir.IRBuilder, x):
    """exp(x) = 2^n * exp(r), n = round(x / ln2), r = x - n ln2 in [-ln2/2, ln2/2]."""
    t = x.type
    # min(x, EXP_HI) keeping a NaN x (one vminps: minnum would add a NaN fix-up), which
    # flows through _exp_not_above to the result
    hi = b.fcmp_ordered(">", x, _c(b, t, EXP_HI))
    xc = b.select(hi, _c(b, t, EXP_HI), x)  # _min_keeping_nan, its compare shared
    return b.select(hi, _c(b, t, math.inf), _exp_not_above(b, xc))


def _exp_not_above(b: ir.IRBuilder, x):
    """exp(x) for x <= EXP_HI (the caller clamps), NaN for a NaN x: x is clamped at
    EXP_FLOOR, where the formula rounds to 0 by itself."""
    t = x.type
    floor = _c(b, t, EXP_FLOOR)
    xc = b.select(b.fcmp_ordered("<", x, floor), floor, x)  # max keeping NaN: one vmaxps
    if _scales_floats(b, t):
        n = b.call(_intrinsic(b, "llvm.rint", t), [b.fmul(xc, _c(b, t, LOG2E))])
        ni = None
    else:
        n, ni = _round_log2e(b, xc)
    # r = x - n ln2 in two fused steps (Cody-Waite; each product rounded once, in the FMA)
    r = _fast(b.fsub(xc, _fast(b.fmul(n, _c(b, t, LN2_HI)))))
    r = _fast(b.fsub(r, _fast(b.fmul(n, _c(b, t, LN2_LO)))))
    p = _poly(b, r, [1.0, 1.0, 1 / 2, 1 / 6, 1 / 24, 1 / 120, 1 / 720, 1 / 5040])
    if _scales_floats(b, t):  # p * 2^n from n as it is, a float: no conversions
        return _scalef(b, p, n)
    # 2^n as 2^n1 * 2^n2 (n1 = n >> 1): both factors stay normal for n in [-159, 128];
    # below EXP_LO the product rounds to 0 by itself (x is clamped at EXP_FLOOR). A NaN
    # x made p NaN, and so the product, whatever its n bits hold.
    if _has_scale(b, t):  # p * 2^n in one instruction, a denormal rounded once
        return b.call(_ldexp(b, t), [p, ni])
    n1 = b.ashr(ni, _ci(b, t, 1))
    return b.fmul(b.fmul(p, _pow2(b, n1, t)), _pow2(b, b.sub(ni, n1), t))


def for_target(module: ir.Module, target) -> None:
    """Let this module's math use `target`'s (compiler/target.py) instructions: with
    AVX-512, exp's p * 2^n is llvm.ldexp, one vscalefps (elsewhere LLVM expands ldexp
    to a libm call per lane, so a module not marked keeps the integer-add form:
    2^n as two normal factors built from n's bits)."""
    module.braze_math_scale = "avx512f" in target.isa


def _has_scale(b: ir.IRBuilder, t) -> bool:
    """Whether exp scales by llvm.ldexp here: on a module marked by for_target (a scalar
    ldexp is vscalefss, and the loop vectorizer widens it to vscalefps)."""
    return getattr(b.module, "braze_math_scale", False)


def _scales_floats(b: ir.IRBuilder, t) -> bool:
    """Whether exp scales a 16-float vector by 2^n with n a float (AVX-512's vscalefps,
    through its target intrinsic): a register epilogue's vectors on an AVX-512 module.
    llvm.ldexp takes an integer n, so it cost a float-to-int conversion and vscalefps
    one back; a scalar is left to llvm.ldexp, which the loop vectorizer widens."""
    return _has_scale(b, t) and _vec_count(t) == 16


def _scalef(b: ir.IRBuilder, p, n):
    """p * 2^n lane by lane (n integral floats, NaN and infinities as vscalefps has
    them): one vscalefps."""
    t, mask = p.type, ir.IntType(16)
    fn = declare(b.module, "llvm.x86.avx512.mask.scalef.ps.512", t, [t, t, t, mask, I32])
    return b.call(fn, [p, n, p, ir.Constant(mask, 0xFFFF), ir.Constant(I32, 4)])


def _ldexp(b: ir.IRBuilder, t):
    lanes = _vec_count(t)
    suffix = f"v{lanes}f32.v{lanes}i32" if lanes else "f32.i32"
    return declare(b.module, f"llvm.ldexp.{suffix}", t, [t, _int_type(t)])


def _pow2(b: ir.IRBuilder, n, t):
    """2.0f ** n for an i32 n (of t's lanes) in the normal range [-126, 127]."""
    bits = b.shl(b.add(n, _ci(b, t, 127)), _ci(b, t, 23))
    return b.bitcast(bits, t)


def log_f32(b: ir.IRBuilder, x):
    """log(x) = e ln2 + 2 atanh(s), x = m 2^e, m in [sqrt(1/2), sqrt(2)), s = (m-1)/(m+1)."""
    t = x.type
    bits = b.bitcast(x, _int_type(t))
    e = b.sub(b.ashr(bits, _ci(b, t, 23)), _ci(b, t, 127))
    m = b.bitcast(b.or_(b.and_(bits, _ci(b, t, 0x007FFFFF)), _ci(b, t, 0x3F800000)), t)
    big = b.fcmp_ordered(">", m, _c(b, t, math.sqrt(2.0)))
    m = b.select(big, b.fmul(m, _c(b, t, 0.5)), m)
    e = b.select(big, b.add(e, _ci(b, t, 1)), e)
    s = b.fdiv(b.fsub(m, _c(b, t, 1.0)), b.fadd(m, _c(b, t, 1.0)))
    s2 = b.fmul(s, s)
    series = b.fmul(s, _poly(b, s2, [2.0, 2 / 3, 2 / 5, 2 / 7, 2 / 9, 2 / 11]))
    ef = b.sitofp(e, t)
    out = b.fadd(b.fadd(b.fmul(ef, _c(b, t, LN2_HI)), series), b.fmul(ef, _c(b, t, LN2_LO)))
    out = b.select(b.fcmp_ordered("==", x, _c(b, t, 0.0)), _c(b, t, -math.inf), out)
    out = b.select(b.fcmp_ordered("<", x, _c(b, t, 0.0)), _c(b, t, math.nan), out)
    out = b.select(b.fcmp_ordered("==", x, _c(b, t, math.inf)), _c(b, t, math.inf), out)
    return _select_nan(b, x, out)


def log_f32_full(b: ir.IRBuilder, x):
    """log with denormal inputs handled: log(x) = log(x * 2^23) - 23 ln2 for x < 2^-126."""
    t = x.type
    tiny = b.fcmp_ordered("<", x, _c(b, t, 2.0 ** -126))
    positive = b.fcmp_ordered(">", x, _c(b, t, 0.0))
    scaled = b.select(b.and_(tiny, positive), b.fmul(x, _c(b, t, 2.0 ** 23)), x)
    out = log_f32(b, scaled)
    fix = b.select(b.and_(tiny, positive), _c(b, t, 23 * math.log(2.0)), _c(b, t, 0.0))
    return b.fsub(out, fix)


def tanh_f32(b: ir.IRBuilder, x):
    """tanh|x| = m / (m + 2), m = expm1(2|x|): no cancellation near 0 (m ~ 2|x|), so one
    formula serves every x (no series beside it); |x| is clamped at TANH_CLAMP, where
    tanh is 1 to float32's precision."""
    t = x.type
    ax = b.call(_intrinsic(b, "llvm.fabs", t), [x])
    m = _expm1_small(b, b.fmul(_min_keeping_nan(b, ax, _c(b, t, TANH_CLAMP)),
                               _c(b, t, 2.0)))
    out = b.fdiv(m, b.fadd(m, _c(b, t, 2.0)))  # a NaN x made m NaN, and so this
    return b.call(_intrinsic(b, "llvm.copysign", t), [out, x])


def _round_log2e(b: ir.IRBuilder, x):
    """(n, its i32 value), n = round(x / ln2) for |x / ln2| < 2^22: by adding and taking
    away ROUNDER (1.5 * 2^23: the sum's last bit is the units, ties to even as rint),
    the integer from the sum's bits. Defined for any x, where fptosi of a NaN would be
    poison: a NaN x gives a NaN n and some integer, and the caller's NaN flows on."""
    t = x.type
    y = _fast(b.fadd(_fast(b.fmul(x, _c(b, t, LOG2E))), _c(b, t, ROUNDER)))
    return (b.fsub(y, _c(b, t, ROUNDER)),
            b.sub(b.bitcast(y, _int_type(t)), _ci(b, t, ROUNDER_BITS)))


def _min_keeping_nan(b: ir.IRBuilder, x, hi):
    """min(x, hi) with a NaN x kept (one vminps; llvm.minnum would return hi for it,
    and without nnan costs a NaN fix-up besides)."""
    return b.select(b.fcmp_ordered(">", x, hi), hi, x)


def _expm1_small(b: ir.IRBuilder, y):
    """exp(y) - 1 for y in [0, 2 TANH_CLAMP]: y = n ln2 + r (Cody-Waite), expm1(r) by its
    series, then 2^n expm1(r) + (2^n - 1) in one FMA (2^n - 1 exact while n <= 24;
    beyond, the 1 is below the result's last bit)."""
    t = y.type
    n, ni = _round_log2e(b, y)
    r = _fast(b.fsub(y, _fast(b.fmul(n, _c(b, t, LN2_HI)))))
    r = _fast(b.fsub(r, _fast(b.fmul(n, _c(b, t, LN2_LO)))))
    q = b.fmul(r, _poly(b, r, [1.0, 1 / 2, 1 / 6, 1 / 24, 1 / 120, 1 / 720, 1 / 5040,
                                1 / 40320]))
    scale = _pow2(b, ni, t)
    return _fast(b.fadd(_fast(b.fmul(scale, q)), b.fsub(scale, _c(b, t, 1.0))))


def sigmoid_f32(b: ir.IRBuilder, x):
    """e / (1 + e) for x < 0, 1 / (1 + e) else, e = exp(-|x|) in (0, 1]: one division
    with its numerator selected (a division costs as much as the rest of the formula),
    and exp's guard for large arguments left out (-|x| <= 0; a NaN x flows through)."""
    t = x.type
    ax = b.call(_intrinsic(b, "llvm.fabs", t), [x])
    e = _exp_not_above(b, b.fsub(_c(b, t, 0.0), ax))
    num = b.select(b.fcmp_ordered("<", x, _c(b, t, 0.0)), e, _c(b, t, 1.0))
    return b.fdiv(num, b.fadd(_c(b, t, 1.0), e))  # a NaN x made e NaN, and so this


# erf(x) ~ x P(x^2) / Q(x^2) on [0, ERF_ONE]: a rational least-squares fit of erf's
# relative error (float64 error 2e-8; <= 6 ulp once evaluated in float32), fitted for
# braze. One division and eleven multiply-adds, no exp and no second branch: about a
# third of a Taylor series plus erfc through exp, in a GEMM epilogue's registers.
_ERF_P = [1.1283791065216064, 0.1934676319360733, 0.05309136584401131,
          0.0038800258189439774, 0.00028449067031033337, 1.9873352812282974e-06]
_ERF_Q = [1.0, 0.5047888159751892, 0.11531787365674973, 0.015200556255877018,
          0.0011847689747810364, 3.742205444723368e-05]


def erf_f32(b: ir.IRBuilder, x):
    t = x.type
    ax = b.call(_intrinsic(b, "llvm.fabs", t), [x])
    xc = _min_keeping_nan(b, ax, _c(b, t, ERF_ONE))
    x2 = b.fmul(xc, xc)
    r = b.fdiv(b.fmul(xc, _poly(b, x2, _ERF_P)), _poly(b, x2, _ERF_Q))
    r = _min_keeping_nan(b, r, _c(b, t, 1.0))
    r = b.select(b.fcmp_ordered(">=", ax, _c(b, t, ERF_ONE)), _c(b, t, 1.0), r)
    return b.call(_intrinsic(b, "llvm.copysign", t), [r, x])  # NaN in, NaN out


def _intrinsic(b: ir.IRBuilder, name: str, t=F32):
    """The LLVM intrinsic `name` (e.g. "llvm.fabs") on float type t (float or vector)."""
    lanes = _vec_count(t)
    full = f"{name}.v{lanes}f32" if lanes else f"{name}.f32"
    arity = 2 if name in ("llvm.copysign", "llvm.minnum", "llvm.maxnum") else 1
    return declare(b.module, full, t, [t] * arity)


FAST_F32 = {"exp": exp_f32, "log": log_f32_full, "tanh": tanh_f32, "sigmoid": sigmoid_f32,
            "erf": erf_f32}


# exp_nonpositive_f32's domain: 2^n of n = round(x log2 e) stays a normal float down here.
EXP_NONPOSITIVE_MIN = -87.0


def exp_nonpositive_f32(b: ir.IRBuilder, x):
    """exp(x) for x in [EXP_NONPOSITIVE_MIN, 0] (a softmax's scores minus their max):
    exp_f32's reduction and polynomial (same accuracy) without its overflow, underflow
    and denormal handling, which that domain never needs: 2^n is one normal factor.
    NaN gives NaN (n is taken from x clamped into the domain, so no NaN is converted to
    an integer); below the domain the result is meaningless (callers select 0 there)."""
    t = x.type
    # max(x, MIN) as a compare and select, NaN -> MIN (one vmaxps; llvm.maxnum's NaN rule
    # costs x86 two more instructions)
    low = _c(b, t, EXP_NONPOSITIVE_MIN)
    xc = b.select(b.fcmp_ordered(">", x, low), x, low)
    n = b.call(_intrinsic(b, "llvm.rint", t), [b.fmul(xc, _c(b, t, LOG2E))])
    r = _fast(b.fsub(x, _fast(b.fmul(n, _c(b, t, LN2_HI)))))
    r = _fast(b.fsub(r, _fast(b.fmul(n, _c(b, t, LN2_LO)))))
    p = _poly(b, r, [1.0, 1.0, 1 / 2, 1 / 6, 1 / 24, 1 / 120, 1 / 720, 1 / 5040])
    return b.fmul(p, _pow2(b, b.fptosi(n, _int_type(t)), t))
