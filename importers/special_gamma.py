"""Gamma-family functions as IR compositions, evaluated in float64.

lgamma (log|Gamma|): Stirling's series after shifting the argument up to z >= 8,
  lgamma(x) = lgamma(x + 8) - log(x (x+1) ... (x+7))                    0 <= x < 8
  lgamma(z) = (z - 1/2) log z - z + log(2 pi)/2 + sum_k B_2k / (2k (2k-1) z^(2k-1))
  (seven terms: the first left out is below 1e-15 at z = 8), and Euler's reflection
  lgamma(x) = log(pi / |sin(pi r)|) - lgamma(1 - x), r = x - round(x), for x < 0:
  +inf at the poles (x = 0, -1, -2, ...) and at +-inf, as torch.
digamma (psi): psi(x) = psi(x + 10) - sum_{k<10} 1/(x+k) for x < 10, then
  psi(y) = log y - 1/(2y) - sum_k B_2k / (2k y^2k)  (y >= 10); for x < 0 the
  reflection psi(x) = psi(1 - x) - pi / tan(pi r), r = x - trunc(x); -inf at +0, +inf
  at -0 (torch's copysign(inf, -x)), NaN at negative integers.
trigamma (psi'): psi'(x) = sum_{k<6} 1/(x+k)^2 + psi'(x + 6), psi'(y) = 1/y + 1/(2y^2)
  + sum_k B_2k / y^(2k+1); for x < 1/2 the reflection psi'(x) = pi^2 / sin^2(pi x)
  - psi'(1 - x). With `narrow`, pi x is rounded to float32 as eager's float kernel
  computes it: near the poles that rounding moves the result by more than rtol.
Hurwitz zeta(s, q) = sum_{k>=0} (q + k)^-s, by Euler-Maclaurin after N terms:
  sum_{k<=N} (q+k)^-s + w^(1-s)/(s-1) - w^-s/2
  + sum_j B_2j/(2j)! s (s+1)...(s+2j-2) w^(-s-2j+1),   w = q + N
  (N = ZETA_TERMS, twelve Bernoulli terms: Cephes' scheme, as torch's). For q < 0 (only
  finite for integer s) the negative terms are a difference of two positive-q zetas:
  zeta(s, q) = zeta(s, r) + (-1)^s (zeta(s, 1 - r) - zeta(s, 1 - q)), r = q - floor(q),
  so no term count depends on q (1 - r is taken as (floor(q) + 1) - q, exact: for a q
  just below an integer, r rounds to 1 and 1 - r would lose the dominant term). torch's
  edge values are kept: inf at s = 1 and at q = 0, -1, ...; NaN for s < 1 and for q < 0
  with s not an integer; at s = inf, inf for q < 1, 1 at q = 1, NaN beyond (what its
  loop returns there).
polygamma(n, x) = (-1)^(n+1) n! zeta(n+1, x) for n >= 2; n = 0, 1: psi, psi'.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from importers.special_expr import Ex, horner, where

LGAMMA_SHIFT = 8  # Stirling's series is used for z >= 8: its 8th term is < 1e-15 there
DIGAMMA_SHIFT = 10  # psi's asymptotic series is used for y >= 10
TRIGAMMA_SHIFT = 6  # psi' is shifted by 6, as torch's kernel (y >= 6.5)
ZETA_TERMS = 9  # terms summed before Euler-Maclaurin's tail (w = q + 9 >= 9)
ZETA_TAIL = 12  # Bernoulli terms of the tail
PI_F32 = 3.1415927410125732  # float(pi) as float32 holds it


def bernoulli(n: int) -> Fraction:
    """B_n (B_1 = -1/2) by the Akiyama-Tanigawa recurrence."""
    a = [Fraction(0)] * (n + 1)
    for m in range(n + 1):
        a[m] = Fraction(1, m + 1)
        for j in range(m, 0, -1):
            a[j - 1] = j * (a[j - 1] - a[j])
    return a[0] if n != 1 else Fraction(-1, 2)


def _sum(terms: list[Ex]) -> Ex:
    out = terms[0]
    for t in terms[1:]:
        out = out + t
    return out


def _stirling(z: Ex) -> Ex:
    """lgamma(z) for z >= LGAMMA_SHIFT."""
    w = 1.0 / (z * z)
    coeffs = [float(bernoulli(2 * k) / (2 * k * (2 * k - 1))) for k in range(7, 0, -1)]
    return (z - 0.5) * z.log() - z + 0.5 * math.log(2 * math.pi) + horner(w, coeffs) / z


def lgamma(x: Ex, narrow: bool = False) -> Ex:
    neg = x < 0.0
    a = where(neg, 1.0 - x, x)
    small = a < float(LGAMMA_SHIFT)
    z = where(small, a + float(LGAMMA_SHIFT), a)
    prod = a
    for k in range(1, LGAMMA_SHIFT):
        prod = prod * (a + float(k))
    pos = _stirling(z) - where(small, prod.log(), 0.0)
    r = x - x.round()
    refl = math.log(math.pi) - (math.pi * r).sin().abs().log() - pos
    out = where(neg, refl, pos)
    return where(x.isinf(), math.inf, out)


def _digamma_pos(x: Ex) -> Ex:
    """psi(x) for x >= 0 (+inf at inf)."""
    small = x < float(DIGAMMA_SHIFT)
    y = where(small, x + float(DIGAMMA_SHIFT), x)
    shift = _sum([1.0 / (x + float(k)) for k in range(DIGAMMA_SHIFT)])
    z = 1.0 / (y * y)
    coeffs = [float(bernoulli(2 * k) / (2 * k)) for k in range(7, 0, -1)]
    asym = y.log() - 0.5 / y - z * horner(z, coeffs)
    return asym - where(small, shift, 0.0)


def digamma(x: Ex, narrow: bool = False) -> Ex:
    neg = x < 0.0
    pos = _digamma_pos(where(neg, 1.0 - x, x))
    r = x - where(neg, x.ceil(), x.floor())
    out = where(neg, pos - math.pi / (math.pi * r).tan(), pos)
    out = where(x.eq(0.0), -(1.0 / x), out)
    return where(neg & x.eq(x.floor()), math.nan, out)


def _trigamma_pos(x: Ex) -> Ex:
    """psi'(x) for x >= 1/2."""
    shift = _sum([1.0 / ((x + float(k)) * (x + float(k))) for k in range(TRIGAMMA_SHIFT)])
    y = x + float(TRIGAMMA_SHIFT)
    z = 1.0 / (y * y)
    coeffs = [float(bernoulli(2 * k)) for k in range(8, 0, -1)]
    return shift + (1.0 + 0.5 / y + z * horner(z, coeffs)) / y


def trigamma(x: Ex, narrow: bool = False) -> Ex:
    refl = x < 0.5
    pos = _trigamma_pos(where(refl, 1.0 - x, x))
    if narrow:  # eager's float kernel: sinf(float(pi) * x), both rounded to float32
        x32 = x.to("f32")
        s = (x32 * PI_F32).to("f64").sin()
        pi2 = float(np.float32(PI_F32) * np.float32(PI_F32))  # rounded as eager's
    else:
        s = (math.pi * x).sin()
        pi2 = math.pi ** 2
    return where(refl, pi2 / (s * s) - pos, pos)


def _zeta_pos(s: Ex, q: Ex) -> Ex:
    """zeta(s, q) for s > 1, q > 0 (Euler-Maclaurin, module docstring)."""
    total = _sum([(q + float(k)).pow(-s) for k in range(ZETA_TERMS + 1)])
    w = q + float(ZETA_TERMS)
    b = w.pow(-s)
    total = total + w * b / (s - 1.0) - 0.5 * b
    fac = s * b / w  # s (s+1) ... (s+2j-2) w^(-s-2j+1), j = 1
    for j in range(1, ZETA_TAIL + 1):
        c = bernoulli(2 * j) / math.factorial(2 * j)
        total = total + fac * float(c)
        if j < ZETA_TAIL:
            fac = fac * (s + float(2 * j - 1)) * (s + float(2 * j)) / (w * w)
    return total


def _zeta_any_q(s: Ex, q: Ex) -> Ex:
    """zeta(s, q) for s > 1 and any non-integer q (q < 0 needs an integer s)."""
    n = q.floor()
    r = q - n
    one_minus_r = (n + 1.0) - q  # exact, where 1 - r would round away a tiny q - n + 1
    parity = s - 2.0 * (s * 0.5).floor()  # s mod 2, for an integer s
    sign = 1.0 - 2.0 * parity
    neg = _zeta_pos(s, r) + sign * (_zeta_pos(s, one_minus_r) - _zeta_pos(s, 1.0 - q))
    safe_q = where(q > 0.0, q, 1.0)  # keeps the unselected region finite
    return where(q > 0.0, _zeta_pos(s, safe_q), neg)


def zeta(s: Ex, q: Ex, narrow: bool = False) -> Ex:
    out = _zeta_any_q(s, q)
    q_int = q.eq(q.floor())
    out = where((q <= 0.0) & ~s.eq(s.floor()), math.nan, out)
    out = where((q <= 0.0) & q_int, math.inf, out)
    at_inf = where(q < 1.0, math.inf, where(q.eq(1.0), q.lit(1.0), math.nan))
    out = where(s.eq(math.inf), at_inf, out)
    out = where(s < 1.0, math.nan, out)
    return where(s.eq(1.0), math.inf, out)


def polygamma(n: int, x: Ex, narrow: bool = False) -> Ex:
    if n == 0:
        return digamma(x, narrow)
    if n == 1:
        return trigamma(x, narrow)
    factor = (1.0 if n % 2 else -1.0) * float(math.factorial(n))
    return zeta(x.lit(float(n + 1)), x, narrow) * factor
