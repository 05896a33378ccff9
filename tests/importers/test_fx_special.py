"""importers/fx_special.py: torch's special functions compile with no host node, and
match eager (assert_close's defaults: float32 rtol 1.3e-6, atol 1e-5; float64 1e-7)
over wide ranges, edge values included (poles, zeros, +-0, +-inf, NaN, overflow)."""

import math

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from compiler.ir import verify
from importers.fx import import_fx

S = torch.special
_EDGES = [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 1e-30, -1e-30, 1e-7, 5.0, -5.0,
          8.0, -8.0, 10.0, 88.0, 89.0, 92.0, 100.0, 1e4, 1e6, 1e20, 3e38, -3e38, -3.5,
          -2.5, -10.25, -100.5, 4.999, 5.001, 1.9999, 2.0001, 7.999, 8.001, -9.3,
          -26.5, 30.0, math.inf, -math.inf, math.nan]


def _wide() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.cat([torch.tensor(_EDGES), torch.linspace(-30, 30, 1201),
                      torch.randn(500, generator=g) * 10,
                      torch.exp(torch.linspace(-80, 80, 401)),
                      -torch.exp(torch.linspace(-80, 40, 201))]).float()


def _unit() -> torch.Tensor:
    """[0, 1] (probabilities) with its edges, tiny values and a few outside."""
    g = torch.Generator().manual_seed(1)
    return torch.cat([torch.tensor([0.0, 1.0, 0.5, 1e-45, 1e-30, 1 - 2 ** -24, 2 ** -24,
                                    -0.1, 1.1, math.nan]),
                      torch.rand(500, generator=g),
                      torch.exp(torch.linspace(-100, 0, 301))]).float()


UNARY = {
    "lgamma": torch.lgamma, "digamma": torch.digamma,
    "polygamma0": lambda x: torch.polygamma(0, x),
    "polygamma1": lambda x: torch.polygamma(1, x),
    "polygamma2": lambda x: torch.polygamma(2, x),
    "polygamma3": lambda x: torch.polygamma(3, x),
    "erfc": torch.erfc, "erfcx": S.erfcx, "log_ndtr": S.log_ndtr,
    "i0": torch.i0, "i0e": S.i0e, "i1": S.i1, "i1e": S.i1e,
    "modified_bessel_i0": S.modified_bessel_i0, "modified_bessel_i1": S.modified_bessel_i1,
    "modified_bessel_k0": S.modified_bessel_k0, "modified_bessel_k1": S.modified_bessel_k1,
    "scaled_modified_bessel_k0": S.scaled_modified_bessel_k0,
    "scaled_modified_bessel_k1": S.scaled_modified_bessel_k1,
    "bessel_j0": S.bessel_j0, "bessel_j1": S.bessel_j1,
    "bessel_y0": S.bessel_y0, "bessel_y1": S.bessel_y1,
    "spherical_bessel_j0": S.spherical_bessel_j0,
}
ON_UNIT = {"ndtri": S.ndtri, "erfinv": lambda y: torch.erfinv(2 * y - 1)}


def _zeta_args(dtype):
    s = torch.tensor([1.0, 0.5, 2.0, 3.0, 4.0, 2.5, 10.0, 50.0, math.inf, 1.5, 7.0, math.nan])
    q = torch.tensor([0.0, -1.0, -2.5, -8.47, -30.5, -1e-13, 0.5, 1.0, 2.0, 10.0, 1e6, 1e-6,
                      math.inf, -math.inf, math.nan, 3.61, -0.3])
    return s[:, None].to(dtype), q[None, :].to(dtype)


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="braze", fullgraph=True,
                         options={"strict": True, "allow_fallback": False})


def _hosts(fn, *args):
    imp = import_fx(make_fx(fn)(*args), list(args))
    verify(imp.graph)
    return [n.attrs["op_type"] for n in imp.graph.nodes if n.op == "host"]


@pytest.mark.parametrize("name", sorted({**UNARY, **ON_UNIT}))
def test_special_function_imports_with_no_host_node(name):
    fn = {**UNARY, **ON_UNIT}[name]
    assert _hosts(fn, torch.rand(5)) == []


def test_zeta_imports_with_no_host_node():
    s, q = _zeta_args(torch.float32)
    assert _hosts(S.zeta, s, q) == []
    assert _hosts(lambda q: S.zeta(3.0, q), q) == []


@pytest.mark.parametrize("name", sorted(UNARY))
def test_special_function_matches_eager_in_float32(name):
    x = _wide()
    torch.testing.assert_close(_compiled(UNARY[name])(x), UNARY[name](x), equal_nan=True)


@pytest.mark.parametrize("name", sorted(ON_UNIT))
def test_quantile_matches_eager_in_float32(name):
    p = _unit()
    torch.testing.assert_close(_compiled(ON_UNIT[name])(p), ON_UNIT[name](p), equal_nan=True)


@pytest.mark.parametrize("name", ["lgamma", "digamma", "polygamma1", "erfcx",
                                  "modified_bessel_k1", "bessel_y0"])
def test_special_function_matches_eager_in_float64(name):
    x = _wide().double()
    torch.testing.assert_close(_compiled(UNARY[name])(x), UNARY[name](x), equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_hurwitz_zeta_matches_eager_for_every_sign_of_q(dtype):
    """Negative q (finite for integer s only) and torch's edge values: s = 1, s < 1,
    q at a non-positive integer, s = inf, NaN."""
    s, q = _zeta_args(dtype)
    torch.testing.assert_close(_compiled(S.zeta)(s, q), S.zeta(s, q), equal_nan=True)


def test_zeta_with_a_python_number_for_s():
    q = _wide()
    fn = lambda q: S.zeta(3.0, q)  # noqa: E731
    torch.testing.assert_close(_compiled(fn)(q), fn(q), equal_nan=True)


def test_integer_input_is_promoted_as_torch_promotes_it():
    x = torch.arange(-5, 20, dtype=torch.int32)
    for fn in (torch.lgamma, torch.digamma, S.i0e, S.bessel_j0):
        got = _compiled(fn)(x)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, fn(x), equal_nan=True)


def test_airy_ai_stays_unconverted():
    """tests/importers/test_fx.py and tests/bridge use airy_ai as their op with no braze
    converter: if it gains one, they need another example."""
    assert _hosts(S.airy_ai, torch.rand(5)) == ["aten.special_airy_ai.default"]
