"""What the torch importer's op tests share: compile with nothing on torch, a fixed seed,
and comparing results (values, dtypes, shapes; NaN equal to NaN) with eager's."""

from __future__ import annotations

import pytest
import torch

OPTS = {"allow_fallback": False, "strict": True}


@pytest.fixture(autouse=True)
def seeded():
    """The same random inputs on every run (autouse where a test module imports it)."""
    torch.manual_seed(0)


def compiled(fn, options=OPTS):
    """`fn` through torch.compile(backend="braze"), by default with allow_fallback=False,
    strict."""
    torch._dynamo.reset()
    return torch.compile(fn, backend="braze", dynamic=False, options=options)


def close(got, want, **tol):
    """One result or a tuple of them against eager's: same count, dtypes and shapes, values
    within `tol` (torch.testing.assert_close's defaults if none; rtol=0, atol=0: equal)."""
    got = got if isinstance(got, (tuple, list)) else (got,)
    want = want if isinstance(want, (tuple, list)) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g, w)
        torch.testing.assert_close(g, w, equal_nan=True, **tol)
