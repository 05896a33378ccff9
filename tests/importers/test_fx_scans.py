"""torch importer: cummax, cummin and segment_reduce (importers/fx_scans.py) with
nothing on torch, against eager: running values and indices exactly (ties take the
later index, NaN sticks and its index follows the latest NaN, ints and bools, 0-d and
empty), segment reductions with lengths or offsets read at run time (empty segments,
an initial value, every reduction, trailing dims)."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from compiler.ir import verify
from importers.fx import import_fx

from tests.importers import fx_compare
from tests.importers.fx_compare import close, compiled as _compiled

seeded = fx_compare.seeded  # autouse: a fixed seed for every test here

NAN, INF = float("nan"), float("inf")
aten = torch.ops.aten


def _same(got, want, exact=True):
    close(got, want, **({"rtol": 0, "atol": 0} if exact else {}))


@pytest.mark.parametrize("fn,args", [
    (lambda x: aten.cummax.default(x, 1), (torch.randn(3, 9),)),
    (lambda x: aten.cummin.default(x, 0), (torch.randn(3, 9),)),
    (lambda x, n: aten.segment_reduce.default(x, "sum", lengths=n),
     (torch.randn(6, 2), torch.tensor([2, 0, 4]))),
    (lambda x, o: aten.segment_reduce.default(x, "max", offsets=o, initial=0.0),
     (torch.randn(6), torch.tensor([0, 1, 1, 6]))),
])
def test_imports_with_no_host_node(fn, args):
    imp = import_fx(make_fx(fn)(*args), list(args))
    verify(imp.graph)
    assert not any(n.op == "host" for n in imp.graph.nodes), imp.refusals


# -- cummax and cummin ----------------------------------------------------------

def _ties(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    values = torch.tensor([NAN, -INF, INF, 0.0, 1.5, -2.0, 1.5, 3.0, 3.0])
    return values[torch.randint(0, len(values), shape, generator=g)]


@pytest.mark.parametrize("op", [torch.cummax, torch.cummin])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cummax_cummin_match_eager_with_ties_and_nan(op, dim):
    x = _ties((6, 37, 5))

    def f(t):
        return op(t, dim)

    _same(_compiled(f)(x), f(x))


def test_running_extremes_of_a_known_row():
    x = torch.tensor([1.0, 1.0, NAN, 2.0, NAN, 0.0, 3.0])

    def f(t):
        return torch.cummax(t, 0), torch.cummin(t, 0), torch.cummax(t[3:], 0)

    got, want = _compiled(f)(x), f(x)
    for g, w in zip(got, want):
        _same(g, w)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool,
                                   torch.float64])
def test_cummax_cummin_of_other_dtypes(dtype):
    x = torch.randint(0, 4, (5, 11)).to(dtype)

    def f(t):
        return torch.cummax(t, 1), torch.cummin(t, 0)

    got, want = _compiled(f)(x), f(x)
    _same(got[0], want[0])
    _same(got[1], want[1])


def test_cummax_of_0_d_and_empty_tensors():
    def f(s, e):
        return torch.cummax(s, 0), torch.cummin(e, 1)

    args = (torch.tensor(2.0), torch.zeros(3, 0))
    got, want = _compiled(f)(*args), f(*args)
    _same(got[0], want[0])
    _same(got[1], want[1])


# -- segment_reduce ---------------------------------------------------------------

REDUCTIONS = ["sum", "mean", "max", "min", "prod"]


@pytest.mark.parametrize("reduce", REDUCTIONS)
@pytest.mark.parametrize("initial", [None, 2.0])
def test_segment_reduce_by_lengths_matches_eager(reduce, initial):
    x = torch.randn(9, 3)
    x[4, 1] = NAN

    def f(t, n):
        return torch.segment_reduce(t, reduce, lengths=n, initial=initial)

    compiled = _compiled(f)
    for lengths in ([2, 0, 4, 3], [0, 9, 0, 0], [1, 1, 1, 6]):
        n = torch.tensor(lengths)
        _same(compiled(x, n), f(x, n), exact=False)


@pytest.mark.parametrize("reduce", REDUCTIONS)
def test_segment_reduce_by_offsets_matches_eager(reduce):
    x = torch.randn(7)

    def f(t, o):
        return torch.segment_reduce(t, reduce, offsets=o, initial=None if reduce == "mean"
                                    else 1.0)

    compiled = _compiled(f)
    for offsets in ([0, 0, 1, 3, 7], [0, 7, 7, 7, 7]):
        o = torch.tensor(offsets)
        _same(compiled(x, o), f(x, o), exact=False)


def test_segment_reduce_along_a_later_axis():
    """lengths of rank 2: one row of segments per leading index (axis 1)."""
    x = torch.randn(2, 6, 3)
    n = torch.tensor([[1, 2, 3], [0, 6, 0]])

    def f(t, n):
        return (torch.segment_reduce(t, "sum", lengths=n, axis=1),
                torch.segment_reduce(t, "mean", lengths=n, axis=1))

    _same(_compiled(f)(x, n), f(x, n), exact=False)


@pytest.mark.parametrize("reduce", REDUCTIONS)
def test_segment_reduce_of_no_elements(reduce):
    """An empty axis: every segment is empty (initial, the identity, or NaN for mean)."""
    def f(t, n):
        return (torch.segment_reduce(t, reduce, lengths=n),
                torch.segment_reduce(t, reduce, lengths=n, initial=-1.5))

    args = (torch.zeros(0, 2), torch.tensor([0, 0, 0]))
    _same(_compiled(f)(*args), f(*args))
