"""torch importer: bucketize, searchsorted, median and nanmedian
(importers/fx_search.py) with nothing on torch, against eager: the binary search's
answer exactly (ties with a boundary, NaN values, unsorted boundaries and NaN among
them, a sorter, rows of sequences), the median's value and index exactly (ties, NaN,
rows of NaN only, keepdim, the whole-tensor overloads, empty tensors)."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from compiler.ir import verify
from importers.fx import import_fx
from importers.selection import SORT_MAX_N

from tests.importers import fx_compare
from tests.importers.fx_compare import close, compiled as _compiled

seeded = fx_compare.seeded  # autouse: a fixed seed for every test here

NAN, INF = float("nan"), float("inf")
aten = torch.ops.aten


def _same(got, want):
    """Equal values (NaN where NaN), dtypes and shapes, for one result or a tuple."""
    close(got, want, rtol=0, atol=0)


def _hosts(fn, *args):
    gm = make_fx(fn)(*args)
    imp = import_fx(gm, list(args))
    verify(imp.graph)
    return [n for n in imp.graph.nodes if n.op == "host"], imp


@pytest.mark.parametrize("fn", [
    lambda x, b: aten.bucketize.Tensor(x, b, right=True),
    lambda x, b: aten.searchsorted.Tensor(b, x, side="right"),
    lambda x, b: aten.nanmedian.dim(x, 1),
    lambda x, b: aten.median.dim(x, 0, True),
    lambda x, b: aten.nanmedian.default(x),
    lambda x, b: aten.median.default(x),
])
def test_imports_with_no_host_node(fn):
    hosts, imp = _hosts(fn, torch.randn(4, 6), torch.arange(5.0))
    assert not hosts, imp.refusals


# -- bucketize and searchsorted -----------------------------------------------

BOUNDS = torch.tensor([-1.0, 0.0, 0.0, 2.5, 7.0])


@pytest.mark.parametrize("right", [False, True])
@pytest.mark.parametrize("out_int32", [False, True])
def test_bucketize_matches_eager(right, out_int32):
    x = torch.tensor([[-3.0, -1.0, 0.0, 0.5, 2.5], [7.0, 9.0, NAN, -INF, INF]])

    def f(t, b):
        return torch.bucketize(t, b, right=right, out_int32=out_int32)

    _same(_compiled(f)(x, BOUNDS), f(x, BOUNDS))


@pytest.mark.parametrize("bounds", [
    torch.tensor([3.0, -1.0, 2.0, 0.0, 5.0, 1.0]),  # not sorted: torch's probes decide
    torch.tensor([1.0, 2.0, NAN]),
    torch.tensor([NAN, 1.0, 2.0, 4.0]),
    torch.tensor([2.0]),
    torch.arange(37.0) * 0.5,
])
def test_bucketize_probes_as_torch_does(bounds):
    """Boundaries torch does not promise anything for still give eager's answer: the
    same binary search probes the same positions."""
    x = torch.tensor([NAN, -2.0, 0.0, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 20.0])

    def f(t, b):
        return torch.bucketize(t, b), torch.bucketize(t, b, right=True)

    _same(_compiled(f)(x, bounds), f(x, bounds))


def test_bucketize_of_ints_against_float_boundaries():
    x = torch.tensor([[0, 3, 7], [-5, 2, 100]])

    def f(t, b):
        return torch.bucketize(t, b)

    _same(_compiled(f)(x, BOUNDS), f(x, BOUNDS))


@pytest.mark.parametrize("kw", [{}, {"right": True}, {"side": "right"}, {"side": "left"},
                                {"out_int32": True}])
def test_searchsorted_rows_match_eager(kw):
    seq = torch.sort(torch.randint(0, 6, (3, 9)).float(), dim=-1).values
    x = torch.tensor([[0.0, 2.0, 5.0, 6.0], [NAN, -1.0, 3.0, 3.0], [1.0, 1.0, 4.0, 9.0]])

    def f(s, t):
        return torch.searchsorted(s, t, **kw)

    _same(_compiled(f)(seq, x), f(seq, x))


def test_searchsorted_through_a_sorter():
    seq = torch.tensor([[5.0, 1.0, 3.0, 3.0, 0.0], [2.0, 9.0, 4.0, 4.0, -1.0]])
    sorter = torch.argsort(seq, dim=-1, stable=True)
    x = torch.tensor([[3.0, 0.5, 6.0], [4.0, 10.0, -3.0]])

    def f(s, t, o):
        return torch.searchsorted(s, t, sorter=o), torch.searchsorted(s, t, sorter=o,
                                                                       right=True)

    _same(_compiled(f)(seq, x, sorter), f(seq, x, sorter))


def test_searchsorted_of_ints_and_empty_inputs():
    seq = torch.tensor([1, 3, 3, 8])

    def f(s, t):
        return torch.searchsorted(s, t), torch.searchsorted(s, t[:0])

    x = torch.tensor([[0, 3, 9], [3, 4, 8]])
    _same(_compiled(f)(seq, x), f(seq, x))
    empty = torch.zeros(0)
    _same(_compiled(lambda s, t: torch.searchsorted(s, t))(empty, torch.ones(3)),
          torch.searchsorted(empty, torch.ones(3)))


# -- median and nanmedian ------------------------------------------------------

def _ties(shape, seed=0):
    """Few distinct values (ties everywhere) and NaN among them."""
    g = torch.Generator().manual_seed(seed)
    values = torch.tensor([NAN, -INF, INF, 0.0, 1.5, -2.0, 1.5, 3.0])
    return values[torch.randint(0, len(values), shape, generator=g)]


@pytest.mark.parametrize("op", [torch.nanmedian, torch.median])
@pytest.mark.parametrize("dim,keepdim", [(0, False), (1, True), (-1, False), (2, False)])
def test_median_along_a_dim_matches_eager(op, dim, keepdim):
    x = _ties((5, 7, 6))
    x[0, :, 0] = NAN  # a row of NaN only (7 of them along dim 1)
    if op is torch.nanmedian and dim in (1, -1, 2):
        x[0, :, 0] = 1.0  # torch's index for a long NaN-only row is nth_element's accident

    def f(t):
        return op(t, dim, keepdim)

    _same(_compiled(f)(x), f(x))


@pytest.mark.parametrize("n", [1, 2, 3])
def test_nanmedian_of_a_short_row_of_nan_only(n):
    """Up to 3 elements torch picks the first NaN, as braze does for any length."""
    x = torch.full((2, n), NAN)
    x[1, 0] = 4.0

    def f(t):
        return torch.nanmedian(t, 1)

    _same(_compiled(f)(x), f(x))


def test_median_ties_pick_torch_index():
    x = torch.tensor([[3.0, 1.0, 1.0, 3.0], [NAN, 1.0, NAN, 1.0], [2.0, 2.0, 2.0, 2.0]])

    def f(t):
        return torch.nanmedian(t, 1), torch.median(t, 1)

    got, want = _compiled(f)(x), f(x)
    _same(got[0], want[0])
    _same(got[1], want[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int32])
def test_median_of_the_whole_tensor(dtype):
    x = (_ties((4, 9), seed=3) if dtype.is_floating_point
         else torch.randint(-3, 4, (4, 9)).to(dtype))

    def f(t):
        return torch.nanmedian(t), torch.median(t), torch.median(t, 0)

    got, want = _compiled(f)(x), f(x)
    _same(got[:2], want[:2])
    _same(got[2], want[2])


def test_median_of_empty_and_0_d_tensors():
    def f(t, s):
        return torch.nanmedian(t), torch.median(t, 1), torch.nanmedian(s, 0)

    args = (torch.zeros(0, 3), torch.tensor(2.5))
    got, want = _compiled(f)(*args), f(*args)
    _same(got[0], want[0])
    _same(got[1], want[1])
    _same(got[2], want[2])


def test_median_of_a_long_axis_stays_on_torch_with_its_reason():
    hosts, _ = _hosts(lambda x: aten.nanmedian.dim(x, 1), torch.randn(2, SORT_MAX_N + 1))
    assert len(hosts) == 1 and "ranks its axis" in hosts[0].attrs["reason"]
