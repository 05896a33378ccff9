"""torch importer: copysign, angle, unbind_copy, as_strided_scatter and
_batch_norm_with_update_functional (importers/fx_misc.py) with nothing on torch,
against eager: signed zeros and NaN, int operands promoted, Python scalars; every
unbound slice; strided writes into a contiguous clone (and the refusals torch would
raise for); training-mode batch norm's six outputs, running statistics included."""

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

_close = close


def _imported(fn, *args):
    imp = import_fx(make_fx(fn)(*args), list(args))
    verify(imp.graph)
    return imp


BN_ARGS = (torch.randn(4, 3, 5), torch.randn(3), torch.randn(3), torch.randn(3),
           torch.rand(3) + 0.5)


@pytest.mark.parametrize("fn,args", [
    (lambda a, b: aten.copysign.Tensor(a, b), (torch.randn(4), torch.randn(3, 1))),
    (lambda a: aten.copysign.Scalar(a, -0.0), (torch.randn(4),)),
    (lambda a: aten.angle.default(a), (torch.randn(4),)),
    (lambda a: aten.unbind_copy.int(a, 1), (torch.randn(2, 3),)),
    (lambda a, s: aten.as_strided_scatter.default(a, s, (2, 2), (1, 3), 1),
     (torch.randn(3, 3), torch.randn(2, 2))),
    (lambda x, w, b, m, v: aten._batch_norm_with_update_functional.default(
        x, w, b, m, v, 0.1, 1e-5), BN_ARGS),
])
def test_imports_with_no_host_node(fn, args):
    imp = _imported(fn, *args)
    assert not any(n.op == "host" for n in imp.graph.nodes), imp.refusals


# -- copysign and angle ----------------------------------------------------------

SIGNS = torch.tensor([-0.0, 0.0, -1.0, 2.0, -INF, INF, NAN, -3.5])


def test_copysign_matches_eager_with_signed_zeros():
    a = torch.tensor([[1.0], [-2.0], [0.0], [-0.0], [NAN], [INF]])

    def f(a, b):
        return torch.copysign(a, b), torch.copysign(b, a)

    got, want = _compiled(f)(a, SIGNS), f(a, SIGNS)
    _close(got, want, rtol=0, atol=0)
    for g, w in zip(got, want):  # the sign of every zero too, not only its value
        number = ~torch.isnan(w)
        assert torch.equal(torch.signbit(g)[number], torch.signbit(w)[number])


@pytest.mark.parametrize("b", [-0.0, 0.0, -2, 3, 1.5, True])
def test_copysign_by_a_python_scalar(b):
    a = torch.tensor([1.0, -2.0, 0.0, -0.0, INF])

    def f(t):
        return torch.copysign(t, b)

    got, want = _compiled(f)(a), f(a)
    _close(got, want, rtol=0, atol=0)
    assert torch.equal(torch.signbit(got), torch.signbit(want))


def test_copysign_copies_a_nans_sign_bit():
    """A NaN b with its sign bit set makes the result negative, as torch copies the bit
    (read through a bitcast, in float32 and float64)."""
    for dtype in (torch.float32, torch.float64):
        a = torch.tensor([1.0, -2.0, 3.0, -4.0], dtype=dtype)
        b = torch.tensor([NAN, NAN, NAN, NAN], dtype=dtype)
        b[:2] = -b[:2]  # a NaN with its sign bit set
        assert torch.signbit(b).tolist() == [True, True, False, False]
        got, want = _compiled(torch.copysign)(a, b), torch.copysign(a, b)
        _close(got, want, rtol=0, atol=0)
        assert torch.equal(torch.signbit(got), torch.signbit(want))


def test_copysign_promotes_ints_to_float():
    a, b = torch.tensor([3, -4, 0, 5]), torch.tensor([-1, 2, -7, 0])

    def f(a, b, c):
        return torch.copysign(a, b), torch.copysign(a, c), torch.copysign(c, b)

    args = (a, b, torch.tensor([-0.0, 1.0, -2.0, NAN], dtype=torch.float64))
    _close(_compiled(f)(*args), f(*args), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bool])
def test_angle_of_real_tensors(dtype):
    x = SIGNS.to(dtype) if dtype.is_floating_point else torch.tensor([-3, 0, 2]).to(dtype)

    def f(t):
        return torch.angle(t)

    _close(_compiled(f)(x), f(x), rtol=0, atol=0)


# -- unbind_copy ------------------------------------------------------------------

@pytest.mark.parametrize("dim", [0, 1, -1])
def test_unbind_copy_matches_eager(dim):
    x = torch.randn(3, 4, 2)

    def f(t):
        return torch.unbind_copy(t, dim)

    _close(_compiled(f)(x), f(x), rtol=0, atol=0)


# -- as_strided_scatter -------------------------------------------------------------

@pytest.mark.parametrize("size,stride,offset", [
    ((2, 2), (1, 2), 0), ((2, 2), (3, 1), 4), ((3,), (4,), None), ((), (), 5),
    ((2, 0), (1, 1), 0), ((3, 3), (3, 1), 0),
])
def test_as_strided_scatter_matches_eager(size, stride, offset):
    x, src = torch.randn(3, 3), torch.randn(size)

    def f(a, s):
        return torch.as_strided_scatter(a, s, size, stride, offset)

    _close(_compiled(f)(x, src), f(x, src), rtol=0, atol=0)


def test_as_strided_scatter_of_a_strided_input_and_overlapping_writes_stay_on_torch():
    overlapping = _imported(lambda a, s: aten.as_strided_scatter.default(a, s, (2, 2),
                                                                         (1, 1), 0),
                            torch.randn(3, 3), torch.randn(2, 2))
    (host,) = [n for n in overlapping.graph.nodes if n.op == "host"]
    assert "twice" in host.attrs["reason"]
    transposed = _imported(lambda a, s: aten.as_strided_scatter.default(a.t(), s, (2,),
                                                                        (1,), 0),
                           torch.randn(3, 3), torch.randn(2))
    (host,) = [n for n in transposed.graph.nodes if n.op == "host"]
    assert "not contiguous" in host.attrs["reason"]


# -- _batch_norm_with_update_functional ---------------------------------------------

@pytest.mark.parametrize("shape", [(4, 3, 5), (6, 3), (2, 3, 4, 4)])
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_with_update_matches_eager(shape, affine):
    x, w, b = torch.randn(shape) * 3 + 1, torch.randn(3), torch.randn(3)
    mean, var = torch.randn(3), torch.rand(3) + 0.5
    if not affine:
        w = b = None

    def f(x, m, v):
        return aten._batch_norm_with_update_functional.default(x, w, b, m, v, 0.3, 1e-5)

    got, want = _compiled(f)(x, mean, var), f(x, mean, var)
    _close(got, want)


def test_training_batch_norm_module_updates_its_running_statistics():
    """BatchNorm1d in training mode under torch.compile: the output and the running
    statistics it writes back match eager's."""
    torch.manual_seed(0)
    eager, compiled = torch.nn.BatchNorm1d(4), torch.nn.BatchNorm1d(4)
    compiled.load_state_dict(eager.state_dict())
    x = torch.randn(8, 4, 6)
    with torch.no_grad():
        want = eager(x)
        got = _compiled(compiled)(x)
    _close(got, want)
    _close(compiled.running_mean, eager.running_mean)
    _close(compiled.running_var, eager.running_var)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16],
                         ids=["f32", "f64", "f16"])
def test_frexp_matches_eager_bit_for_bit(dtype):
    """Mantissa and int32 exponent: zeros of both signs, +-inf and NaN (x, 0),
    subnormals (scaled to normal first), the largest finite values, random values."""
    fi = torch.finfo(dtype)
    x = torch.tensor([0.0, -0.0, 1.0, -1.0, 0.5, 3.0, -7.25, fi.tiny, fi.tiny / 4,
                      -fi.tiny / 8, fi.max, -fi.max, INF, -INF, NAN], dtype=dtype)
    x = torch.cat([x, (torch.randn(64) * 100).to(dtype)])
    got = _compiled(lambda x: torch.frexp(x))(x)
    want = torch.frexp(x)
    close(got, want, rtol=0, atol=0)
    assert torch.equal(torch.signbit(got[0]), torch.signbit(want[0]))
    imp = _imported(lambda x: torch.frexp(x), x)
    assert "bitcast" in {n.op for n in imp.graph.nodes}


@pytest.mark.parametrize("shape,offset,dim1,dim2", [
    ((4, 4), 0, 0, 1), ((3, 5), 2, 0, 1), ((5, 3), -1, 0, 1), ((2, 4, 3), 1, 2, 0),
    ((3, 2, 4, 5), -2, -1, 1), ((3, 3), 5, 0, 1),  # an empty diagonal: x itself
])
def test_diagonal_scatter_matches_eager(shape, offset, dim1, dim2):
    x = torch.randn(*shape)
    src = torch.randn(*x.diagonal(offset, dim1, dim2).shape)
    fn = lambda x, s: aten.diagonal_scatter.default(x, s, offset, dim1, dim2) * 1.0  # noqa: E731
    close(_compiled(fn)(x, src), fn(x, src), rtol=0, atol=0)
    # a non-contiguous input: the positions are the logical row-major order
    xt = torch.randn(*reversed(shape)).permute(*reversed(range(len(shape))))
    close(_compiled(fn)(xt, src), fn(xt, src), rtol=0, atol=0)


BITS_SPECIALS = [0.0, -0.0, 1.0, -1.0, 2.5, 1e-45, -1e-45, 3.4e38, -3.4e38, INF, -INF, NAN,
                 1e-38]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_nextafter_and_signbit_match_eager_bit_for_bit(dtype):
    """Every pairing of zeros of both signs, subnormals, the largest finite values,
    infinities and NaN: the next float (its sign too) and the sign bit."""
    a = torch.tensor([p for p in BITS_SPECIALS for _ in BITS_SPECIALS], dtype=dtype)
    b = torch.tensor([q for _ in BITS_SPECIALS for q in BITS_SPECIALS], dtype=dtype)
    got = _compiled(lambda a, b: (torch.nextafter(a, b), torch.signbit(a)))(a, b)
    want = (torch.nextafter(a, b), torch.signbit(a))
    close(got, want, rtol=0, atol=0)
    finite = ~want[0].isnan()
    assert torch.equal(torch.signbit(got[0][finite]), torch.signbit(want[0][finite]))


def test_ldexp_narrow_copy_new_empty_strided():
    x, e = torch.randn(5, 7), torch.randint(-20, 20, (5, 7))
    fn = lambda x, e: (torch.ldexp(x, e), torch.narrow_copy(x, 1, 2, 3),  # noqa: E731
                       x.new_empty_strided((3, 4), (4, 1)).shape)
    got, want = _compiled(fn)(x, e), fn(x, e)
    close(got[:2], want[:2], rtol=0, atol=0)
    assert got[2] == want[2]


def test_masked_scatter_matches_eager_and_raises_when_src_is_short():
    """Masked positions (a mask broadcast too, and LLaVA's form: token positions expanded
    over the embedding) take src's elements in order; more masked positions than src
    has elements is an error, as in torch."""
    fn = lambda x, m, s: x.masked_scatter(m, s)  # noqa: E731
    x, src = torch.randn(4, 6), torch.randn(30)
    for m in (torch.rand(4, 6) > 0.5, torch.rand(6) > 0.3, torch.zeros(4, 6, dtype=torch.bool)):
        close(_compiled(fn)(x, m, src), fn(x, m, src), rtol=0, atol=0)
    emb, ids, feat = torch.randn(1, 20, 8), torch.randint(0, 5, (1, 20)), torch.randn(6, 8)
    ids[0, 3:9] = 99
    llava = lambda e, i, f: e.masked_scatter((i == 99).unsqueeze(-1).expand_as(e), f)  # noqa: E731
    close(_compiled(llava)(emb, ids, feat), llava(emb, ids, feat), rtol=0, atol=0)
    with pytest.raises(Exception, match="index out of range"):
        _compiled(fn)(x, torch.ones(4, 6, dtype=torch.bool), torch.randn(5))
