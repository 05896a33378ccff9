"""torch importer: topk, sort (argsort, msort) and kthvalue (importers/fx_selection.py)
compiled with nothing on torch, against eager: values and indices exactly, NaN and
infinities, ties (torch's stable sort order exactly; where torch leaves the tied
positions unspecified, the same values at valid, distinct positions), and a tiny
MoE router (top-2 of 8 experts, then a gather of the chosen experts' outputs)."""

from __future__ import annotations

import pytest
import torch

from importers.fx_selection import ROUNDS_FIRST
from importers.selection import SORT_MAX_N, TOPK_MAX_K

from tests.importers.fx_compare import OPTS, close, compiled as _compiled

NAN, INF = float("nan"), float("inf")


def _same(got, want):
    """Equal values, NaN where NaN, dtypes and shapes too."""
    close(got, want, rtol=0, atol=0)


def _pool(n, generator):
    """Few distinct values (ties everywhere), NaN and infinities among them."""
    values = torch.tensor([NAN, -INF, INF, 0.0, 1.5, -2.0, 1.5])
    return values[torch.randint(0, len(values), n, generator=generator)]


# -- no ties: values and indices as eager exactly ------------------------------

@pytest.mark.parametrize("k,dim,largest", [(1, -1, True), (2, -1, False), (5, 1, True),
                                           (3, 0, False), (20, 1, True), (12, 1, False),
                                           (9, 2, True)])
def test_topk_matches_eager(k, dim, largest):
    x = torch.randn(4, 20, 9)
    x[1, 3, 2] = NAN  # one NaN a row: the largest, no tie
    x[2, 5, 0] = INF
    x[3, 7, 1] = -INF

    def f(t):
        return torch.topk(t, k, dim=dim, largest=largest)

    _same(_compiled(f)(x), f(x))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float64])
def test_topk_other_dtypes(dtype):
    x = torch.randperm(40).reshape(4, 10).to(dtype) - 20

    def f(t):
        return torch.topk(t, 3), torch.topk(t, 4, largest=False, dim=0)

    got, want = _compiled(f)(x), f(x)
    _same(got[0], want[0])
    _same(got[1], want[1])


def test_topk_larger_k_by_ranks():
    """k past ROUNDS_FIRST on a short axis is ranked; past TOPK_MAX_K too."""
    x = torch.randn(3, 100)

    def f(t):
        return torch.topk(t, ROUNDS_FIRST + 3), torch.topk(t, TOPK_MAX_K + 6, largest=False)

    got, want = _compiled(f)(x), f(x)
    _same(got[0], want[0])
    _same(got[1], want[1])


def test_topk_unsorted_gives_the_same_set():
    """sorted=False: torch's order is nth_element's (unspecified); braze's comes sorted."""
    x = torch.randn(5, 12)

    def f(t):
        return torch.topk(t, 7, sorted=False)

    (v, i), (wv, wi) = _compiled(f)(x), f(x)
    order = wi.argsort(dim=-1)
    _same((i.sort(-1).values, v.gather(-1, i.argsort(-1))),
          (wi.gather(-1, order), wv.gather(-1, order)))


@pytest.mark.parametrize("k,dim,keepdim", [(1, -1, False), (4, -1, True), (2, 0, False),
                                           (ROUNDS_FIRST + 4, 1, False)])
def test_kthvalue_matches_eager(k, dim, keepdim):
    x = torch.randn(6, 30)
    x[2, 4] = NAN

    def f(t):
        return torch.kthvalue(t, k, dim=dim, keepdim=keepdim)

    _same(_compiled(f)(x), f(x))


def test_kthvalue_nan_is_the_largest():
    x = torch.tensor([[3.0, NAN, 1.0, 2.0], [NAN, -INF, 0.0, INF]])

    def f(t):
        return torch.kthvalue(t, 4), torch.kthvalue(t, 3)

    got, want = _compiled(f)(x), f(x)
    _same(got[0], want[0])
    _same(got[1], want[1])


# -- sort: torch's stable order, ties and NaN included -------------------------

@pytest.mark.parametrize("dim,descending", [(-1, False), (-1, True), (0, False), (1, True)])
def test_stable_sort_matches_eager_with_ties_and_nan(dim, descending):
    g = torch.Generator().manual_seed(0)
    f = _compiled(lambda t: torch.sort(t, dim=dim, descending=descending, stable=True))
    for _ in range(5):
        x = _pool((5, 24, 3), g)
        _same(f(x), torch.sort(x, dim=dim, descending=descending, stable=True))


def test_argsort_msort_and_sort_without_stable():
    """argsort and msort are aten.sort; no ties: torch's unstable sort agrees; ties up to
    16 elements: so does its order (insertion sort), braze's being the stable one."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(7, 40, generator=g)
    tied = _pool((6, 16), g)

    def f(t, u):
        return (torch.argsort(t, dim=-1), torch.argsort(t, dim=0, descending=True),
                torch.msort(t), torch.sort(u), torch.sort(u, descending=True),
                torch.argsort(u, stable=True))

    got, want = _compiled(f)(x, tied), f(x, tied)
    for gv, wv in zip(got, want):
        _same(gv if isinstance(gv, tuple) else (gv,), wv if isinstance(wv, tuple) else (wv,))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool])
def test_sort_integers_and_bools_with_ties(dtype):
    x = torch.randint(-3, 3, (4, 30), generator=torch.Generator().manual_seed(2)).to(dtype)

    def f(t):
        return torch.sort(t, stable=True), torch.sort(t, dim=0, descending=True, stable=True)

    got, want = _compiled(f)(x), f(x)
    _same(got[0], want[0])
    _same(got[1], want[1])


def test_scalars_and_one_element_axes():
    def f(t):
        s = t[0, 0]
        return (torch.topk(s, 1), torch.topk(s, 0), torch.sort(s), torch.kthvalue(s, 1),
                torch.sort(t, dim=1), torch.topk(t, 1, dim=1))

    x = torch.randn(3, 1)
    for g, w in zip(_compiled(f)(x), f(x)):
        _same(g, w)


# -- ties where torch's choice is unspecified -----------------------------------

def _stable_prefix(x, dim, k, largest, got):
    """(values, indices) are a stable sort's first k: distinct positions holding the
    values, the lowest of tied positions first (braze's order)."""
    sv, si = torch.sort(x, dim=dim, descending=largest, stable=True)
    keep = torch.arange(k)
    _same(got, (sv.index_select(dim, keep), si.index_select(dim, keep)))


@pytest.mark.parametrize("largest", [True, False])
def test_topk_with_ties_and_nans(largest):
    g = torch.Generator().manual_seed(3)
    f = _compiled(lambda t: torch.topk(t, 5, dim=1, largest=largest))
    for _ in range(5):
        x = _pool((4, 13, 2), g)
        got, want = f(x), torch.topk(x, 5, dim=1, largest=largest)
        _same((got[0],), (want[0],))  # the values agree with eager
        _stable_prefix(x, 1, 5, largest, got)


def test_kthvalue_with_ties():
    x = torch.tensor([[1.0, 3.0, 1.0, 3.0, NAN, 1.0], [2.0, 2.0, 2.0, 2.0, 2.0, 2.0]])

    for k in range(1, 7):
        v, i = _compiled(lambda t: torch.kthvalue(t, k))(x)
        wv, _ = torch.kthvalue(x, k)
        _same((v,), (wv,))
        sv, si = torch.sort(x, stable=True)
        _same((v, i), (sv[:, k - 1], si[:, k - 1]))


# -- where it stays on torch -----------------------------------------------------

def test_long_sort_falls_back_with_the_reason():
    x = torch.randn(2, SORT_MAX_N + 1)
    with pytest.raises(Exception, match=f"braze sorts up to {SORT_MAX_N}"):
        _compiled(lambda t: torch.sort(t))(x)
    f = _compiled(lambda t: torch.sort(t), {"strict": True})  # fallback allowed: torch
    _same(f(x), torch.sort(x))


def test_topk_of_a_long_axis_with_a_large_k_falls_back():
    x = torch.randn(2, 1000)
    with pytest.raises(Exception, match=f"more than {TOPK_MAX_K} rounds"):
        _compiled(lambda t: torch.topk(t, TOPK_MAX_K + 1))(x)


# -- MoE routing ------------------------------------------------------------------

class _Router(torch.nn.Module):
    """Top-2 of 8 experts per token: softmax gate, the chosen weights renormalized, the
    experts' outputs (all computed, tiny) gathered at the chosen ones and mixed."""

    def __init__(self, d=16, experts=8, k=2):
        super().__init__()
        self.k = k
        self.gate = torch.nn.Linear(d, experts, bias=False)
        self.w = torch.nn.Parameter(torch.randn(experts, d, d) * 0.1)

    def forward(self, x):
        probs = self.gate(x).softmax(dim=-1)
        weight, chosen = probs.topk(self.k, dim=-1)
        weight = weight / weight.sum(dim=-1, keepdim=True)
        every = torch.einsum("td,edh->teh", x, self.w)
        picked = every.gather(1, chosen[..., None].expand(-1, -1, every.shape[-1]))
        return (picked * weight[..., None]).sum(dim=1), chosen


def test_moe_router_compiles_whole():
    torch.manual_seed(0)
    router = _Router().eval()
    x = torch.randn(32, 16)
    with torch.no_grad():
        torch._dynamo.reset()
        compiled = torch.compile(router, backend="braze", options=OPTS, fullgraph=True)
        (y, chosen), (wy, wchosen) = compiled(x), router(x)
        x2 = torch.randn(32, 16)
        (y2, chosen2), (wy2, wchosen2) = compiled(x2), router(x2)
    assert torch.equal(chosen, wchosen) and torch.equal(chosen2, wchosen2)
    torch.testing.assert_close(y, wy, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y2, wy2, rtol=1e-5, atol=1e-5)
