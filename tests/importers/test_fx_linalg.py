"""torch importer: addbmm, addmv and _cdist_forward (importers/fx_linalg.py) with
nothing on torch, against eager: the bias broadcast, alpha and beta (beta = 0 dropping
a NaN input), empty contractions, addbmm summed in eager's order (exactly, where terms
cancel), cdist for p = 0, 1, 2, inf and others, each compute_mode, broadcast batches."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from compiler.ir import verify
from importers.fx import import_fx
from importers.fx_linalg import ADDBMM_CHAIN, EUCLID_MM_ROWS

from tests.importers import fx_compare
from tests.importers.fx_compare import close, compiled as _compiled

seeded = fx_compare.seeded  # autouse: a fixed seed for every test here

NAN, INF = float("nan"), float("inf")
aten = torch.ops.aten

_close = close


@pytest.mark.parametrize("fn,args", [
    (lambda c, a, b: aten.addbmm.default(c, a, b, beta=0.5, alpha=2),
     (torch.randn(4, 5), torch.randn(3, 4, 6), torch.randn(3, 6, 5))),
    (lambda c, m, v: aten.addmv.default(c, m, v), (torch.randn(4), torch.randn(4, 6),
                                                   torch.randn(6))),
    (lambda a, b: aten._cdist_forward.default(a, b, 2.0, None),
     (torch.randn(5, 3), torch.randn(40, 3))),
    (lambda a, b: aten._cdist_forward.default(a, b, 1.5, 2),
     (torch.randn(2, 5, 3), torch.randn(4, 3))),
    (lambda a, b: aten.dist.default(a, b, 3), (torch.randn(4, 5), torch.randn(5))),
    (lambda x: aten._pdist_forward.default(x, 2.0), (torch.randn(6, 3),)),
])
def test_imports_with_no_host_node(fn, args):
    imp = import_fx(make_fx(fn)(*args), list(args))
    verify(imp.graph)
    assert not any(n.op == "host" for n in imp.graph.nodes), imp.refusals


# -- addbmm and addmv -------------------------------------------------------------

@pytest.mark.parametrize("bias_shape", [(4, 5), (1,), (5,), ()])
@pytest.mark.parametrize("beta,alpha", [(1, 1), (0.6, 0.2), (0, 1), (2, -3)])
def test_addbmm_matches_eager(bias_shape, beta, alpha):
    c, a, b = torch.randn(bias_shape), torch.randn(3, 4, 6), torch.randn(3, 6, 5)
    if beta == 0:
        c = torch.full(bias_shape, NAN)  # beta = 0: input is not read at all

    def f(c, a, b):
        return torch.addbmm(c, a, b, beta=beta, alpha=alpha)

    _close(_compiled(f)(c, a, b), f(c, a, b))


def _accumulates_onto_output(c, a, b) -> bool:
    """Whether this machine's torch.addmm adds a @ b's outer products one by one onto c
    (its BLAS's path for the CPU: MKL did on an AMD Zen 4; on an Intel Xeon it sums the
    product first, then adds c)."""
    want = c.double()
    for k in range(a.shape[1]):
        want = (want + a[:, k:k + 1].double() * b[k:k + 1].double()).float().double()
    return torch.equal(torch.addmm(c, a, b), want.float())


def test_addbmm_sums_in_eagers_order():
    """Large terms that cancel: summed in another order the result is off by more
    than float32's tolerance; in eager's order (where torch's BLAS adds onto the
    output) it is eager's, bit for bit. Elsewhere it is within recursive summation's
    error bound, n * eps * sum |term|, of the float64 result."""
    g = torch.Generator().manual_seed(1)
    c = torch.randn(5, 10, generator=g) * 10
    a, b = torch.randn(5, 5, 5, generator=g) * 10, torch.randn(5, 5, 10, generator=g) * 10

    def f(c, a, b):
        return torch.addbmm(c, a, b)

    got = _compiled(f)(c, a, b)
    if _accumulates_onto_output(c, a[0], b[0]):
        _close(got, f(c, a, b), rtol=0, atol=0)
        return
    exact = torch.addbmm(c.double(), a.double(), b.double())
    terms = c.double().abs() + torch.einsum("bik,bkj->ij", a.double().abs(), b.double().abs())
    bound = (a.shape[0] * a.shape[2] + 1) * 2.0 ** -24 * terms
    got = got[0] if isinstance(got, (list, tuple)) else got
    assert ((got.double() - exact).abs() <= bound).all()


def test_addbmm_of_many_terms_is_a_batched_matmul():
    """Past ADDBMM_CHAIN terms the per-batch products come from one batched matmul."""
    c, a, b = torch.randn(4, 5), torch.randn(9, 4, ADDBMM_CHAIN // 8), torch.randn(
        9, ADDBMM_CHAIN // 8, 5)
    ops = [n.op for n in import_fx(make_fx(torch.addbmm)(c, a, b), [c, a, b]).graph.nodes]
    assert ops.count("matmul") == 1 and "host" not in ops

    def f(c, a, b):
        return torch.addbmm(c, a, b, alpha=0.5)

    _close(_compiled(f)(c, a, b), f(c, a, b))


def test_addbmm_of_empty_batches_and_contractions():
    def f(c, a, b, a0, b0):
        return torch.addbmm(c, a0, b0), torch.addbmm(c, a[:, :, :0], b[:, :0], beta=2)

    args = (torch.randn(4, 5), torch.randn(3, 4, 6), torch.randn(3, 6, 5),
            torch.randn(0, 4, 6), torch.randn(0, 6, 5))
    _close(_compiled(f)(*args), f(*args))


@pytest.mark.parametrize("beta,alpha", [(1, 1), (0.2, 0.6), (0, 1.5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_addmv_matches_eager(beta, alpha, dtype):
    c, m, v = (torch.randn(5, dtype=dtype), torch.randn(5, 10, dtype=dtype),
               torch.randn(10, dtype=dtype))
    if beta == 0:
        c[2] = NAN

    def f(c, m, v):
        return torch.addmv(c, m, v, beta=beta, alpha=alpha), torch.addmv(c[:1], m, v)

    _close(_compiled(f)(c, m, v), f(c, m, v))


def test_addmv_of_ints_and_an_empty_vector():
    c, m, v = torch.arange(3), torch.randint(-5, 5, (3, 4)), torch.randint(-5, 5, (4,))

    def f(c, m, v):
        return torch.addmv(c, m, v, beta=2, alpha=3), torch.addmv(c, m[:, :0], v[:0])

    _close(_compiled(f)(c, m, v), f(c, m, v))


# -- cdist --------------------------------------------------------------------------

@pytest.mark.parametrize("p", [0.0, 1.0, 2.0, INF, 3.0, 0.5])
@pytest.mark.parametrize("mode", ["use_mm_for_euclid_dist_if_necessary",
                                  "use_mm_for_euclid_dist", "donot_use_mm_for_euclid_dist"])
def test_cdist_matches_eager(p, mode):
    g = torch.Generator().manual_seed(0)
    x1, x2 = torch.randn(2, 6, 4, generator=g), torch.randn(2, 7, 4, generator=g)
    if not (p == 2 and mode == "use_mm_for_euclid_dist"):
        # (by products, a zero distance is sqrt of a cancellation's rounding: ~1e-3
        # in eager and in braze alike, but not the same one)
        x2[0, 1] = x1[0, 2]  # a zero distance
    x1[1, 3, 0] = x2[1, 4, 0]  # a zero difference in one coordinate (p = 0 counts)

    def f(a, b):
        return torch.cdist(a, b, p=p, compute_mode=mode)

    _close(_compiled(f)(x1, x2), f(x1, x2))


@pytest.mark.parametrize("rows", [EUCLID_MM_ROWS, EUCLID_MM_ROWS + 1])
def test_cdist_takes_torchs_branch_by_row_count(rows):
    """Past EUCLID_MM_ROWS rows the default mode takes the matrix-product path, as
    torch does (it rounds differently from the differences)."""
    g = torch.Generator().manual_seed(1)
    x1, x2 = torch.randn(rows, 8, generator=g) * 3, torch.randn(5, 8, generator=g) * 3

    def f(a, b):
        return torch.cdist(a, b)

    _close(_compiled(f)(x1, x2), f(x1, x2))


def test_cdist_broadcasts_batches_and_handles_empty_inputs():
    g = torch.Generator().manual_seed(2)
    x1, x2 = torch.randn(3, 1, 5, 2, generator=g), torch.randn(4, 6, 2, generator=g)

    def f(a, b):
        return (torch.cdist(a, b, p=1.0), torch.cdist(a, b, compute_mode="use_mm_for_euclid_dist"),
                torch.cdist(a[..., :0], b[..., :0]), torch.cdist(a[:, :, :0], b))

    _close(_compiled(f)(x1, x2), f(x1, x2))


# -- dist and pdist ---------------------------------------------------------------

@pytest.mark.parametrize("p", [0, 1, 2, 3.5, INF, -INF, 0.5])
def test_dist_matches_eager(p):
    """torch.dist over broadcast operands, with zeros, a NaN-free and a NaN input."""
    a, b = torch.randn(3, 4, 5), torch.randn(4, 5)
    a[0, 0, :2] = b[0, :2]  # some differences are exactly 0 (p = 0 counts the others)

    def f(a, b):
        return torch.dist(a, b, p)

    _close(_compiled(f)(a, b), f(a, b))
    a[1, 2, 3] = NAN
    _close(_compiled(f)(a, b), f(a, b))


@pytest.mark.parametrize("p", [0, 1, 2, 1.5, INF])
@pytest.mark.parametrize("n", [1, 2, 7])
def test_pdist_matches_eager(p, n):
    """torch.pdist: the upper triangle of the pairwise distances, row-major; a repeated
    row gives exact zeros."""
    x = torch.randn(n, 4)
    if n > 2:
        x[2] = x[0]

    def f(x):
        return torch.nn.functional.pdist(x, p)

    _close(_compiled(f)(x), f(x))


@pytest.mark.parametrize("shapes,bias", [(((3, 4), (3, 5)), True), (((2, 7, 4), (2, 7, 5)), False)])
def test_bilinear_trilinear_matches_eager(shapes, bias):
    """F.bilinear (aten._trilinear): with and without bias, batch dims folded; the
    product and the sum over i and j import as one multiply-and-reduce, no host node."""
    x1, x2 = (torch.randn(*s) for s in shapes)
    a, b = torch.randn(6, 4, 5), torch.randn(6) if bias else None
    fn = lambda x1, x2: torch.nn.functional.bilinear(x1, x2, a, b)  # noqa: E731
    close(_compiled(fn)(x1, x2), fn(x1, x2), rtol=1e-5, atol=1e-5)
    imp = import_fx(make_fx(lambda x1, x2, a: torch.ops.aten._trilinear.default(
        x1.reshape(-1, 4), a, x2.reshape(-1, 5), [1, 3], [0], [1, 2], [2, 3]))(x1, x2, a),
        [x1, x2, a])
    verify(imp.graph)
    ops = {n.op for n in imp.graph.nodes}
    assert "reduce_sum" in ops and "host" not in ops
