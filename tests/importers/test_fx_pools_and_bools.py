"""torch importer: adaptive pooling with uneven windows (a mean or max over a slice per
output, dim by dim; an inf or NaN stays in its windows), round to decimals, and arithmetic on bool masks (mul, maximum, bitwise ops as
logical ones); compiled with nothing on torch, against eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

OPTS = {"allow_fallback": False, "strict": True}


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="braze", dynamic=False, options=OPTS)


@pytest.mark.parametrize("fn,shape", [
    (lambda t: F.adaptive_avg_pool2d(t, (5, 7)), (2, 3, 8, 8)),
    (lambda t: F.adaptive_avg_pool1d(t, 5), (2, 3, 8)),
    (lambda t: F.adaptive_avg_pool3d(t, (5, 7, 4)), (1, 2, 8, 8, 8)),
    (lambda t: F.adaptive_avg_pool2d(t, (3, 4)), (1, 2, 6, 9)),  # one dim even, one not
    (lambda t: F.adaptive_max_pool2d(t, (5, 7)), (2, 3, 8, 9)),
    (lambda t: F.adaptive_max_pool1d(t, 3), (2, 3, 8)),
    (lambda t: F.adaptive_max_pool3d(t, (2, 3, 5)), (1, 2, 5, 7, 8)),
])
def test_adaptive_pools_with_uneven_windows(fn, shape):
    x = torch.randn(shape)
    x.view(-1)[3] = float("nan")  # max pooling carries it, as torch's does
    torch.testing.assert_close(_compiled(fn)(x), fn(x), rtol=1e-6, atol=1e-6,
                               equal_nan=True)


def test_adaptive_max_pool_indices_compile():
    """Its indices output (importers/pool_indices.py, tested there) compiles too."""
    def f(t):
        return F.adaptive_max_pool2d(t, (3, 3), return_indices=True)[1]

    x = torch.randn(1, 2, 7, 7)
    torch.testing.assert_close(_compiled(f)(x), f(x))


@pytest.mark.parametrize("decimals", [0, 1, 3, -1, -2])
def test_round_to_decimals(decimals):
    x = torch.randn(4096) * 100

    def f(t):
        return torch.round(t, decimals=decimals)

    # x * 10^d rounds the same; braze divides by a constant as x * (1 / c) (one ulp)
    torch.testing.assert_close(_compiled(f)(x), f(x), rtol=2e-7, atol=0)


def test_arithmetic_on_bool_masks():
    def f(x, y):
        m, n = x > 0, y > 0
        return (m * n, torch.maximum(m, n), torch.minimum(m, n), m & n, m | n, m ^ n,
                torch.isclose(x, y), torch.isfinite(x))

    x, y = torch.randn(4, 5), torch.randn(4, 5)
    x[0, 0], y[1, 1] = float("inf"), float("nan")
    for got, want in zip(_compiled(f)(x, y), f(x, y)):
        assert torch.equal(got, want)
