"""Bessel functions as IR compositions: the Cephes approximations, evaluated in float64.

With a = |x| (coefficients in importers/special_tables.py):
  I0(x)  = e^a C_I0s(a/2 - 2)                 a <= 8
         = e^a C_I0l(32/a - 2) / sqrt(a)      a > 8      (C_: a Chebyshev series)
  I1(x)  = sign(x) e^a a C_I1s(a/2 - 2),  sign(x) e^a C_I1l(32/a - 2) / sqrt(a)
  i0e, i1e: the same without e^a.
  K0(x)  = C_K0s(x^2 - 2) - log(x/2) I0(x)   x <= 2;   e^-x C_K0l(8/x - 2) / sqrt(x)
  K1(x)  = log(x/2) I1(x) + C_K1s(x^2 - 2) / x,         e^-x C_K1l(8/x - 2) / sqrt(x)
           (K0(0) = K1(0) = inf, NaN for x < 0; the scaled forms times e^x)
  J0(x)  = (x^2 - r1)(x^2 - r2) RP(x^2)/RQ(x^2)           |x| <= 5
         = sqrt(2/(pi x)) (P cos(x - pi/4) - (5/x) Q sin(x - pi/4))   |x| > 5,
           P = PP(z)/PQ(z), Q = QP(z)/QQ(z), z = 25/x^2 (Hankel's asymptotic form)
  J1(x)  = x (x^2 - r1)(x^2 - r2) RP/RQ;  the same form with phase x - 3pi/4 (odd in x)
  Y0(x)  = YP/YQ(x^2) + (2/pi) log(x) J0(x);  sqrt(2/(pi x)) (P sin + (5/x) Q cos)
  Y1(x)  = x YP/YQ(x^2) + (2/pi)(J1(x) log(x) - 1/x);  as Y0 with phase x - 3pi/4
           (Y0(0) = Y1(0) = -inf, NaN for x < 0)
  j0(x)  = sin(x)/x (its Taylor series to x^12 for |x| < 1/2), 0 at +-inf.

`narrow` (a float32, float16 or bfloat16 result) follows what eager's float kernels do
where float64 would differ by more than rounding: e^a overflows float32 above
EXP_OVERFLOW_F32, so I0 and I1 are inf there (float64 would give a finite value up to
a = 91.9; at a = inf both give NaN, inf / inf); and the phase x - pi/4 is rounded to
float32 before its sin and cos (at x = 1e6 the rounding moves J0 by 5e-5, more than
assert_close's atol).
"""

from __future__ import annotations

import math

from importers import special_tables as T
from importers.special_expr import Ex, chebyshev, horner, where

EXP_OVERFLOW_F32 = 88.72283935546875  # largest x with a finite float32 exp(x)
_R_J0 = (5.78318596294678452118, 30.4712623436620863991)  # squares of J0's first zeros
_R_J1 = (14.6819706421238932572, 49.2184563216946036703)  # squares of J1's first zeros
_SERIES_J0 = [1 / 6227020800, -1 / 39916800, 1 / 362880, -1 / 5040, 1 / 120, -1 / 6, 1.0]


def _i_parts(x: Ex, small, large, times_a: bool):
    """(exp(-a) I_n(a) core, a) for n = 0 (times_a False) or 1: the two series selected."""
    a = x.abs()
    lo = chebyshev(a * 0.5 - 2.0, small)
    if times_a:
        lo = lo * a
    hi = chebyshev(32.0 / a - 2.0, large) / a.sqrt()
    return where(a <= 8.0, lo, hi), a


def _odd(x: Ex, y: Ex) -> Ex:
    return where(x < 0.0, -y, y)


def _unscale(scaled: Ex, a: Ex, narrow: bool) -> Ex:
    out = a.exp() * scaled
    if not narrow:
        return out
    return where((a > EXP_OVERFLOW_F32) & (a < math.inf), math.inf, out)  # NaN at inf


def i0e(x: Ex, narrow: bool = False) -> Ex:
    return _i_parts(x, T.I0_SMALL, T.I0_LARGE, False)[0]


def i0(x: Ex, narrow: bool = False) -> Ex:
    s, a = _i_parts(x, T.I0_SMALL, T.I0_LARGE, False)
    return _unscale(s, a, narrow)


def i1e(x: Ex, narrow: bool = False) -> Ex:
    return _odd(x, _i_parts(x, T.I1_SMALL, T.I1_LARGE, True)[0])


def i1(x: Ex, narrow: bool = False) -> Ex:
    s, a = _i_parts(x, T.I1_SMALL, T.I1_LARGE, True)
    return _odd(x, _unscale(s, a, narrow))


def _k(x: Ex, n: int, scaled: bool, narrow: bool) -> Ex:
    """K0 or K1 (times e^x if scaled); inf at 0, NaN below."""
    small_c, large_c = (T.K0_SMALL, T.K0_LARGE) if n == 0 else (T.K1_SMALL, T.K1_LARGE)
    series = chebyshev(x * x - 2.0, small_c)
    log_half = (x * 0.5).log()
    if n == 0:
        lo = series - log_half * i0(x)
    else:
        lo = log_half * i1(x) + series / x
    hi = chebyshev(8.0 / x - 2.0, large_c) / x.sqrt()
    if scaled:
        lo = lo * x.exp()
    else:
        hi = hi * (-x).exp()
    out = where(x <= 2.0, lo, hi)
    out = where(x.eq(0.0), math.inf, out)
    return where(x < 0.0, math.nan, out)


def k0(x, narrow=False): return _k(x, 0, False, narrow)
def k1(x, narrow=False): return _k(x, 1, False, narrow)
def k0e(x, narrow=False): return _k(x, 0, True, narrow)
def k1e(x, narrow=False): return _k(x, 1, True, narrow)


def _hankel(x: Ex, n: int, narrow: bool):
    """(sqrt(2/(pi x)) P, sqrt(2/(pi x)) (5/x) Q, phase) of J_n, Y_n for x > 5."""
    pp, pq, qp, qq = ((T.J0_PP, T.J0_PQ, T.J0_QP, T.J0_QQ) if n == 0 else
                      (T.J1_PP, T.J1_PQ, T.J1_QP, T.J1_QQ))
    z = 25.0 / (x * x)
    scale = math.sqrt(2 / math.pi) / x.sqrt()
    p = horner(z, pp) / horner(z, pq) * scale
    q = horner(z, qp) / horner(z, qq) * (5.0 / x) * scale
    shift = math.pi / 4 if n == 0 else 3 * math.pi / 4
    if narrow:  # eager's float kernel rounds the phase to float32
        x32 = x.to("f32")
        phase = (x32 - x32.lit(shift)).to("f64")
    else:
        phase = x - shift
    return p, q, phase


def j0(x: Ex, narrow: bool = False) -> Ex:
    a = x.abs()
    z = a * a
    lo = (z - _R_J0[0]) * (z - _R_J0[1]) * horner(z, T.J0_RP) / horner(z, T.J0_RQ)
    p, q, phase = _hankel(a, 0, narrow)
    return where(a <= 5.0, lo, p * phase.cos() - q * phase.sin())


def j1(x: Ex, narrow: bool = False) -> Ex:
    a = x.abs()
    z = a * a
    lo = horner(z, T.J1_RP) / horner(z, T.J1_RQ) * a * (z - _R_J1[0]) * (z - _R_J1[1])
    p, q, phase = _hankel(a, 1, narrow)
    return _odd(x, where(a <= 5.0, lo, p * phase.cos() - q * phase.sin()))


def _y_edges(x: Ex, y: Ex) -> Ex:
    y = where(x.eq(0.0), -math.inf, y)
    return where(x < 0.0, math.nan, y)


def y0(x: Ex, narrow: bool = False) -> Ex:
    z = x * x
    lo = horner(z, T.Y0_P) / horner(z, T.Y0_Q) + (2 / math.pi) * x.log() * j0(x, narrow)
    p, q, phase = _hankel(x, 0, narrow)
    return _y_edges(x, where(x <= 5.0, lo, p * phase.sin() + q * phase.cos()))


def y1(x: Ex, narrow: bool = False) -> Ex:
    z = x * x
    lo = (x * (horner(z, T.Y1_P) / horner(z, T.Y1_Q))
          + (2 / math.pi) * (j1(x, narrow) * x.log() - 1.0 / x))
    p, q, phase = _hankel(x, 1, narrow)
    return _y_edges(x, where(x <= 5.0, lo, p * phase.sin() + q * phase.cos()))


def spherical_j0(x: Ex, narrow: bool = False) -> Ex:
    out = where(x.abs() < 0.5, horner(x * x, _SERIES_J0), x.sin() / x)
    return where(x.isinf(), 0.0, out)
