"""Error-function family as IR compositions, evaluated in float64.

erfcx(x) = exp(x^2) erfc(x), for a = |x|:
  exp(a^2) (1 - erf(a))                         a < ERFC_SPLIT (erfc(3) = 2e-5: the
                                                 subtraction loses under 1e-11)
  1 / (sqrt(pi) K),  K = a + (1/2)/(a + 1/(a + (3/2)/(a + ...)))   a >= ERFC_SPLIT
                      (Laplace's continued fraction, ERFC_CF_TERMS deep: 2e-16 at a = 3)
  erfcx(x) = 2 exp(x^2) - erfcx(-x) for x < 0 (inf below -26.6, as torch). With
  `narrow` x^2 is rounded to float32 first, as eager's float kernel does: exp
  multiplies that rounding by x^2 (5e-6 relative at x = -9.3, beyond rtol).
erfc(x)     = 1 - erf(x) below ERFC_SPLIT, exp(-x^2) / (sqrt(pi) K) above.
log_ndtr(x) = log(erfcx(-t) / 2) - t^2 for x < -1, log1p(-erfc(t) / 2) else, t = x/sqrt 2
  (torch's formula, from SciPy).
ndtri(p), the standard normal quantile: with q = min(p, 1 - p) (exact in float64; not
  1/2 - |p - 1/2|, whose p - 1/2 rounds for p < 2^-54), Abramowitz & Stegun 26.2.23's
  starting value for the lower tail,
    x0 = -(t - (c0 + c1 t + c2 t^2) / (1 + d1 t + d2 t^2 + d3 t^3)),  t = sqrt(-2 log q)
  (|error| < 4.5e-4), then NDTRI_STEPS Halley steps on Phi(x) = q, each
    u = (Phi(x) - q) / phi(x),  x <- x - u / (1 + x u / 2),
  Phi(x) = erfc(-x / sqrt 2) / 2 (relative accuracy in the tail); the error cubes each
  step. The upper half is -x by symmetry; -inf at 0, inf at 1, NaN outside [0, 1].
erfinv(y) = -x(q = (1 - |y|) / 2) / sqrt 2 with y's sign; for |y| < ERFINV_SERIES its
  Maclaurin series sqrt(pi)/2 (y + pi y^3 / 12 + 7 pi^2 y^5 / 480) (q rounds at 1/2
  there); +-inf at +-1, NaN beyond.
"""

from __future__ import annotations

import math

from importers.special_expr import Ex, horner, where

ERFC_SPLIT = 3.0  # 1 - erf(x) below, the continued fraction above
ERFC_CF_TERMS = 30  # continued-fraction depth: relative error 2e-16 at x = ERFC_SPLIT
NDTRI_STEPS = 2  # Halley steps from A&S 26.2.23 (4.5e-4): 1e-10, then rounding
ERFINV_SERIES = 1e-3  # erfinv's series is used below this |y| (next term: 1e-22 relative)
_AS_NUM = [0.010328, 0.802853, 2.515517]  # A&S 26.2.23, highest degree first
_AS_DEN = [0.001308, 0.189269, 1.432788, 1.0]


def _cf(a: Ex) -> Ex:
    """1 / (sqrt(pi) K(a)): erfcx(a) for a >= ERFC_SPLIT (0 at inf)."""
    k = a
    for j in range(ERFC_CF_TERMS, 0, -1):
        k = a + (j / 2) / k
    return 1.0 / (math.sqrt(math.pi) * k)


def _erfcx_pos(a: Ex) -> Ex:
    """erfcx(a) for a >= 0."""
    safe = where(a < ERFC_SPLIT, a, 0.0)  # exp(a^2) of the unselected region: finite
    near = (safe * safe).exp() * (1.0 - safe.erf())
    return where(a < ERFC_SPLIT, near, _cf(a))


def erfcx(x: Ex, narrow: bool = False) -> Ex:
    pos = _erfcx_pos(x.abs())
    if narrow:  # eager's float kernel rounds x^2 to float32 before exp(x^2)
        x32 = x.to("f32")
        sq = (x32 * x32).to("f64")
    else:
        sq = x * x
    return where(x < 0.0, 2.0 * sq.exp() - pos, pos)


def erfc(x: Ex, narrow: bool = False) -> Ex:
    far = (-(x * x)).exp() * _cf(x)
    return where(x < ERFC_SPLIT, 1.0 - x.erf(), far)


def log_ndtr(x: Ex, narrow: bool = False) -> Ex:
    t = x * math.sqrt(0.5)
    low = (erfcx(-t) * 0.5).log() - t * t
    high = (erfc(t) * -0.5).log1p()
    return where(x < -1.0, low, high)


def _lower_quantile(q: Ex) -> Ex:
    """x <= 0 with Phi(x) = q, for q in (0, 1/2]."""
    t = (-2.0 * q.log()).sqrt()
    x = -(t - horner(t, _AS_NUM) / horner(t, _AS_DEN))
    for _ in range(NDTRI_STEPS):
        phi_ratio = math.sqrt(2 * math.pi) * (x * x * 0.5).exp()  # 1 / phi(x)
        u = (0.5 * erfc(x * -math.sqrt(0.5)) - q) * phi_ratio
        x = x - u / (1.0 + x * u * 0.5)
    return x


def ndtri(p: Ex, narrow: bool = False) -> Ex:
    lower = p < 0.5
    q = where(lower, p, 1.0 - p)  # both exact in float64
    x = _lower_quantile(where(q > 0.0, q, 0.5))  # q = 0 is p = 0 or 1, set below
    out = where(lower, x, -x)
    out = where(p.eq(0.0), -math.inf, where(p.eq(1.0), math.inf, out))
    return where((p >= 0.0) & (p <= 1.0), out, math.nan)  # NaN in, NaN out


def erfinv(y: Ex, narrow: bool = False) -> Ex:
    a = y.abs()
    q = (1.0 - a) * 0.5
    tail = _lower_quantile(where(q > 0.0, q, 0.5)) * -math.sqrt(0.5)
    y2 = a * a
    series = a * horner(y2, [7 * math.pi ** 2 / 480, math.pi / 12, 1.0]) * (math.sqrt(math.pi) / 2)
    out = where(a < ERFINV_SERIES, series, tail)
    out = where(a.eq(1.0), math.inf, out)
    out = where(a <= 1.0, out, math.nan)  # NaN in, NaN out
    return where(y < 0.0, -out, out)
