"""aten special functions (torch.special, lgamma, digamma, polygamma...) -> IR compositions.

Each converter casts its operands to float64, builds the function from IR elementwise
ops (importers/special_gamma.py, special_erf.py, special_bessel.py: the maths is in
their docstrings) and casts the result to the dtype aten gives. float64 inside keeps
every region's error below float32's rounding with plain formulas (no extra-precise
splitting), so the float32 result is eager's to assert_close's tolerances; where
eager's own float kernel rounds differently from float64 by more than that (a phase or
an argument rounded to float32, exp overflowing), the functions' `narrow` mode follows
it, for every result narrower than float64. Integer and bool inputs are promoted as
torch promotes them (the output dtype says to what).
"""

from __future__ import annotations

import torch

from importers import special_bessel as bessel
from importers import special_erf as erf
from importers import special_gamma as gamma
from importers.fx_context import Ctx, Fallback, converts
from importers.special_expr import Builder

aten = torch.ops.aten

_FLOAT_OUT = ("f32", "f64", "f16", "bf16")

# aten overload -> f(x: Ex, narrow: bool) -> Ex
_UNARY = {
    aten.lgamma.default: gamma.lgamma,
    aten.digamma.default: gamma.digamma,
    aten.special_erfcx.default: erf.erfcx,
    aten.erfc.default: erf.erfc,
    aten.erfinv.default: erf.erfinv,
    aten.special_log_ndtr.default: erf.log_ndtr,
    aten.special_ndtri.default: erf.ndtri,
    aten.i0.default: bessel.i0,
    aten.special_i0e.default: bessel.i0e,
    aten.special_i1.default: bessel.i1,
    aten.special_i1e.default: bessel.i1e,
    aten.special_modified_bessel_i0.default: bessel.i0,
    aten.special_modified_bessel_i1.default: bessel.i1,
    aten.special_modified_bessel_k0.default: bessel.k0,
    aten.special_modified_bessel_k1.default: bessel.k1,
    aten.special_scaled_modified_bessel_k0.default: bessel.k0e,
    aten.special_scaled_modified_bessel_k1.default: bessel.k1e,
    aten.special_bessel_j0.default: bessel.j0,
    aten.special_bessel_j1.default: bessel.j1,
    aten.special_bessel_y0.default: bessel.y0,
    aten.special_bessel_y1.default: bessel.y1,
    aten.special_spherical_bessel_j0.default: bessel.spherical_j0,
}


def _out_dtype(cx: Ctx) -> str:
    dt = cx.out().dtype
    if dt not in _FLOAT_OUT:
        raise Fallback(f"{cx.target} gives {dt}, not a float dtype braze computes it in")
    return dt


def _unary(fn):
    def convert(cx: Ctx, x):
        dt = _out_dtype(cx)
        b = Builder(cx)
        y = fn(b.wrap(cx.tensor(x, "f64")), narrow=dt != "f64")
        return cx.cast(y.v, dt)
    return convert


for _t, _fn in _UNARY.items():
    converts(_t)(_unary(_fn))


@converts(aten.polygamma.default)
def _polygamma(cx: Ctx, n, x):
    if not isinstance(n, int) or n < 0:
        raise Fallback(f"polygamma of order {n!r}: braze takes a Python int n >= 0")
    dt = _out_dtype(cx)
    b = Builder(cx)
    y = gamma.polygamma(n, b.wrap(cx.tensor(x, "f64")), narrow=dt != "f64")
    return cx.cast(y.v, dt)


@converts(aten.special_zeta.default, aten.special_zeta.self_scalar,
          aten.special_zeta.other_scalar)
def _zeta(cx: Ctx, s, q):
    dt = _out_dtype(cx)
    b = Builder(cx)
    y = gamma.zeta(b.wrap(cx.tensor(s, "f64")), b.wrap(cx.tensor(q, "f64")),
                   narrow=dt != "f64")
    return cx.cast(y.v, dt)
