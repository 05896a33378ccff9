"""importers/fx.py: aten graphs -> IR (structure), host nodes, freezing, specialization."""

import numpy as np
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from compiler.interp import evaluate
from compiler.ir import verify
from importers.fx import import_fx

aten = torch.ops.aten


def _import(fn, *args, **kw):
    gm = make_fx(fn)(*args)
    return gm, import_fx(gm, list(args), **kw)


def _run(imp, args):
    """Interpret the IR, host nodes through their recorded aten callables."""
    def host_eval(node, inputs):
        op = imp.host_ops[node.attrs["payload"].decode()]
        return [t.numpy() for t in op([torch.from_numpy(np.asarray(a)) for a in inputs])]

    return evaluate(imp.graph, [args[i].numpy() for i in imp.input_indices], host_eval)


def test_softmax_is_written_out_from_primitives():
    x = torch.randn(3, 5)
    _, imp = _import(lambda x: torch.softmax(x, -1), x)
    verify(imp.graph)
    ops = [n.op for n in imp.graph.nodes if n.op != "const"]
    assert ops == ["reduce_max", "sub", "exp", "reduce_sum", "div"]
    np.testing.assert_allclose(_run(imp, [x])[0], torch.softmax(x, -1).numpy(), rtol=1e-6)


def test_type_promotion_casts_to_the_result_dtype():
    a, b = torch.arange(6, dtype=torch.int32).reshape(2, 3), torch.randn(3)
    _, imp = _import(lambda a, b: (a + b, a < 2.5), a, b)
    verify(imp.graph)
    assert [v.dtype for v in imp.graph.outputs] == ["f32", "bool"]
    got = _run(imp, [a, b])
    np.testing.assert_allclose(got[0], (a + b).numpy())
    np.testing.assert_array_equal(got[1], (a < 2.5).numpy())


def test_unconverted_op_becomes_a_host_node_with_its_reason():
    x = torch.randn(4, 3)
    _, imp = _import(lambda x: torch.special.airy_ai(x * 2), x)
    (host,) = [n for n in imp.graph.nodes if n.op == "host"]
    assert host.attrs["framework"] == "torch"
    assert host.attrs["op_type"] == "aten.special_airy_ai.default"
    assert "no braze converter" in host.attrs["reason"]
    assert imp.refusals[0][1] == "aten.special_airy_ai.default"
    np.testing.assert_allclose(_run(imp, [x])[0], torch.special.airy_ai(x * 2).numpy(), rtol=1e-6)


def test_random_ops_stay_on_torch():
    x = torch.randn(8)
    _, imp = _import(lambda x: x + torch.rand_like(x), x)
    (host,) = [n for n in imp.graph.nodes if n.op == "host"]
    assert "random" in host.attrs["reason"]


def test_factory_ops_become_constants():
    x = torch.randn(4)
    _, imp = _import(lambda x: x + torch.arange(4, dtype=torch.float32), x)
    assert not any(n.op == "host" for n in imp.graph.nodes)
    np.testing.assert_allclose(_run(imp, [x])[0], (x + torch.arange(4.0)).numpy())


def test_frozen_inputs_become_constants():
    w, x = torch.randn(3, 3), torch.randn(2, 3)
    gm = make_fx(lambda w, x: (x @ w,))(w, x)
    imp = import_fx(gm, [w, x], frozen={0: w.numpy()})
    assert imp.input_indices == [1] and len(imp.graph.inputs) == 1
    assert imp.graph.nodes[0].op == "const"


def test_symbolic_graph_specializes_with_concrete_values():
    from bridge.torch_backend import concrete_vals

    gm = make_fx(lambda x: (x.view(-1, 2).sum(0),), tracing_mode="symbolic")(torch.randn(6))
    x = torch.randn(10)
    imp = import_fx(gm, [x], vals=concrete_vals(gm, [x]))
    verify(imp.graph)
    assert imp.graph.inputs[0].shape == (10,)
    np.testing.assert_allclose(_run(imp, [x])[0], x.view(-1, 2).sum(0).numpy(), rtol=1e-6)


@pytest.mark.parametrize("fn", [
    lambda x: x[1:, ::2],
    lambda x: x.flip(0),
    lambda x: torch.nn.functional.pad(x, (1, -1)),
    lambda x: torch.roll(x, 1, 1),
    lambda x: x.repeat(2, 1),
    lambda x: torch.cat([x, x * 2], 1),
    lambda x: x.amax(1) + x.var(0).sum(),
    lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    lambda x: torch.where(x > 0, x, 0.5),
    lambda x: torch.div(x * 7, 2, rounding_mode="floor"),
    lambda x: torch.where(~(x > 0), torch.full_like(x, 2.5), x),
    lambda x: torch.full_like(x, 3, dtype=torch.int64) + x.sum(),
])
def test_converters_match_eager(fn):
    x = torch.randn(4, 6)
    _, imp = _import(fn, x)
    verify(imp.graph)
    assert not any(n.op == "host" for n in imp.graph.nodes), imp.refusals
    np.testing.assert_allclose(_run(imp, [x])[0], fn(x).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fn, want_ops", [
    (lambda x: x.as_strided((6, 4), (4, 1)), {"reshape"}),  # every element, in order
    (lambda x: x.as_strided((3, 2), (1, 6)), {"gather"}),  # a strided view: a gather
    (lambda x: x.as_strided((2, 2), (6, 1), 3), {"gather"}),  # with a storage offset
    (lambda x: (x * 2).as_strided((4, 1, 1), (6, 1, 1)), {"gather"}),
])
def test_as_strided_of_a_contiguous_tensor_is_index_arithmetic(fn, want_ops):
    x = torch.randn(4, 6)
    _, imp = _import(fn, x)
    verify(imp.graph)
    assert not any(n.op == "host" for n in imp.graph.nodes), imp.refusals
    assert want_ops <= {n.op for n in imp.graph.nodes}
    np.testing.assert_array_equal(_run(imp, [x])[0], fn(x).numpy())


def test_as_strided_of_a_non_contiguous_tensor_stays_on_torch():
    x = torch.randn(4, 6)
    fn = lambda x: x.t().as_strided((3, 2), (1, 4))  # noqa: E731  (reads x's storage)
    _, imp = _import(fn, x)
    hosts = [n for n in imp.graph.nodes if n.op == "host"]
    assert hosts and "not contiguous" in hosts[0].attrs["reason"]
    np.testing.assert_array_equal(_run(imp, [x])[0], fn(x).numpy())


def test_an_unconverted_op_on_constants_is_computed_once_at_import():
    """airy_ai has no converter, but here it reads only constants: torch computes it at
    import and the graph holds the result (Swin's window mask is built this way)."""
    x = torch.randn(4, 6)

    def fn(x):  # what functionalization makes of mask[1:3] = 1
        mask = torch.slice_scatter(torch.zeros(4, 6), torch.ones(2, 6), dim=0, start=1, end=3)
        return x + torch.special.airy_ai(mask)

    _, imp = _import(fn, x)
    verify(imp.graph)
    assert not any(n.op == "host" for n in imp.graph.nodes), imp.refusals
    np.testing.assert_array_equal(_run(imp, [x])[0], fn(x).numpy())


class _RelativePositionBias(torch.nn.Module):
    """BEiT's relative position bias, its index built in forward as BEiT builds it."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(52, 4))

    def forward(self, x):
        c = torch.stack(torch.meshgrid(torch.arange(4), torch.arange(4), indexing="ij"))
        rel = (c.flatten(1)[:, :, None] - c.flatten(1)[:, None, :]).permute(1, 2, 0).contiguous()
        rel[:, :, 0] += 3
        rel[:, :, 1] += 3
        rel[:, :, 0] *= 7
        idx = torch.zeros(17, 17, dtype=rel.dtype)
        idx[1:, 1:] = rel.sum(-1)
        idx[0, 0:] = 49
        idx[0:, 0] = 50
        idx[0, 0] = 51  # a 0-d constant copied in: it stays 0-d
        bias = self.table[idx.view(-1)].view(17, 17, 4).permute(2, 0, 1).contiguous()
        return x + bias


def test_constants_computed_by_torch_at_import_are_row_major_and_keep_their_rank():
    """A permuted constant made contiguous, then viewed: the array torch computes it from
    at import is row-major, as the graph's value was (a folded transpose's array was
    not: aten.view on it raised, and BEiT's whole graph ran eagerly)."""
    m = _RelativePositionBias().eval()
    x = torch.randn(1, 4, 17, 17)
    with torch.no_grad():
        want = m(x)
        got = torch.compile(m, backend="braze", options={"strict": True,
                                                         "allow_fallback": False})(x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_an_unconverted_op_on_a_run_time_value_still_runs_on_torch():
    x = torch.randn(4, 6)
    _, imp = _import(lambda x: torch.special.airy_ai(x) + torch.special.airy_ai(torch.ones(4, 6)),
                     x)
    hosts = [n for n in imp.graph.nodes if n.op == "host"]
    assert len(hosts) == 1 and hosts[0].inputs[0] is imp.graph.inputs[0]


def test_bmm_of_merged_batch_dims_is_the_n_d_matmul():
    """aten writes a 4-d matmul as view, bmm, view: the import holds the 4-d matmul."""
    a, b = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 4, 6)
    _, imp = _import(lambda a, b: torch.relu(a @ b), a, b)
    verify(imp.graph)
    (mm,) = [n for n in imp.graph.nodes if n.op == "matmul"]
    assert mm.outputs[0].shape == (2, 3, 5, 6)
    np.testing.assert_allclose(_run(imp, [a, b])[0], torch.relu(a @ b).numpy(), rtol=1e-5,
                               atol=1e-5)


def test_bmm_read_as_merged_batch_stays_3_d():
    a, b = torch.randn(6, 5, 4), torch.randn(6, 4, 3)
    _, imp = _import(lambda a, b: torch.bmm(a, b) + 1, a, b)
    (mm,) = [n for n in imp.graph.nodes if n.op == "matmul"]
    assert mm.outputs[0].shape == (6, 5, 3)
    np.testing.assert_allclose(_run(imp, [a, b])[0], (torch.bmm(a, b) + 1).numpy(), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("self_attention", [True, False])
def test_native_multi_head_attention_is_written_out(self_attention):
    """aten._native_multi_head_attention (nn.MultiheadAttention's fast path): projections,
    one attention node, the output projection; no host node."""
    g = torch.Generator().manual_seed(0)
    e, h = 32, 4
    w_qkv, b_qkv = torch.randn(3 * e, e, generator=g) * 0.2, torch.randn(3 * e, generator=g)
    w_o, b_o = torch.randn(e, e, generator=g) * 0.2, torch.randn(e, generator=g)
    q, kv = torch.randn(2, 10, e, generator=g), torch.randn(2, 10, e, generator=g)

    def mha(q, kv):
        k = q if self_attention else kv
        return aten._native_multi_head_attention(q, k, k, e, h, w_qkv, b_qkv, w_o, b_o,
                                                 need_weights=False)[0]

    _, imp = _import(mha, q, kv)
    verify(imp.graph)
    ops = [n.op for n in imp.graph.nodes]
    assert "host" not in ops and ops.count("attention") == 1
    assert ops.count("matmul") == (2 if self_attention else 4)
    np.testing.assert_allclose(_run(imp, [q, kv])[0], mha(q, kv).numpy(), rtol=1e-4, atol=1e-5)


def test_multi_head_attention_with_a_mask_stays_on_torch():
    e = 8
    w, b = torch.randn(3 * e, e), torch.randn(3 * e)
    q, mask = torch.randn(1, 5, e), torch.zeros(5, 5, dtype=torch.bool)

    def mha(q, mask):
        return aten._native_multi_head_attention(q, q, q, e, 2, w, b, w[:e], b[:e], mask,
                                                 need_weights=False, mask_type=0)[0]

    _, imp = _import(mha, q, mask)
    (host,) = [n for n in imp.graph.nodes if n.op == "host"]
    assert "mask" in host.attrs["reason"]


def test_select_is_a_gather_of_one_index_as_onnx_writes_it():
    x = torch.randn(3, 4, 5)
    _, imp = _import(lambda x: x[2] + x.select(1, -1).sum(), x)
    verify(imp.graph)
    ops = [n.op for n in imp.graph.nodes]
    assert ops.count("gather") == 2 and "slice" not in ops
    np.testing.assert_allclose(_run(imp, [x])[0], (x[2] + x.select(1, -1).sum()).numpy(),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fn", [
    lambda x, i, j: x[i, j],  # leading dims
    lambda x, i, j: x[:, i, j],  # adjacent, after a sliced dim: they stay in place
    lambda x, i, j: x[i, :, j],  # apart: the broadcast dims go first
    lambda x, i, j: x[i[:, None], j[None, :]],  # broadcast index tensors
    lambda x, i, j: x[i, j, i[:2, None] % 3],  # three
])
def test_advanced_indexing_with_several_index_tensors_is_one_gather(fn):
    """x[i, j, ...] as a gather over the indexed dims merged (negative indices too)."""
    x = torch.randn(4, 5, 6)
    i = torch.tensor([0, -1, 2, 3])
    j = torch.tensor([4, 1, -2, 0])
    _, imp = _import(fn, x, i, j)
    verify(imp.graph)
    assert not any(n.op == "host" for n in imp.graph.nodes), imp.refusals
    assert "gather" in {n.op for n in imp.graph.nodes}
    np.testing.assert_array_equal(_run(imp, [x, i, j])[0], fn(x, i, j).numpy())


def test_advanced_indexing_out_of_range_raises_like_torch():
    """An index past its own dim whose flat index would still land inside x: IndexError
    from the compiled code, as torch raises one."""
    fn = lambda x, i, j: x[i, j]  # noqa: E731
    x, i = torch.randn(4, 5), torch.tensor([0, 1])
    compiled = torch.compile(fn, backend="braze", dynamic=False)
    with torch.no_grad():
        np.testing.assert_array_equal(compiled(x, i, torch.tensor([1, 2])).numpy(),
                                      fn(x, i, torch.tensor([1, 2])).numpy())
        with pytest.raises(IndexError):
            fn(x, i, torch.tensor([5, 0]))
        with pytest.raises(IndexError):
            compiled(x, i, torch.tensor([5, 0]))  # (0, 5) would be flat element 5


@pytest.mark.parametrize("fn", [
    lambda x, s: torch.slice_scatter(x, s[:, :2], dim=1, start=1, end=5, step=2),
    lambda x, s: torch.slice_scatter(x, s[:3], dim=0, start=-3),
    lambda x, s: torch.select_scatter(x, s[0], 0, -1),
    lambda x, s: torch.select_scatter(x, s[:, 0], 1, 2),
    lambda x, s: aten.copy.default(x, s[0, :1] * 2),  # broadcast into x's shape
])
def test_scatters_into_slices_are_gathers(fn):
    """slice_scatter, select_scatter (torch's functional x[...] = y) and copy: constant
    positions, one gather from x and the source side by side; no host node."""
    x, s = torch.randn(4, 6), torch.randn(4, 6)
    _, imp = _import(fn, x, s)
    verify(imp.graph)
    assert not any(n.op == "host" for n in imp.graph.nodes), imp.refusals
    np.testing.assert_array_equal(_run(imp, [x, s])[0], fn(x, s).numpy())


def _put_mask(x):
    y = x.clone()
    y[y < 0] = 0.5
    return y


def _put_rows(x):
    y = x.clone()
    y[torch.tensor([0, 2])] = torch.ones(6)
    return y


def _put_points(x):
    y = x.clone()
    y[torch.tensor([1, -1]), torch.tensor([0, 5])] = torch.tensor([7.0, 8.0])
    return y


def _add_points(x):
    return torch.index_put(x, (torch.tensor([1, 1, 3]), torch.tensor([2, 2, 0])),
                           torch.tensor([1.0, 2.0, 3.0]), accumulate=True)


@pytest.mark.parametrize("fn", [_put_mask, _put_rows, _put_points, _add_points])
def test_index_put_with_a_mask_or_constant_indices_is_compiled(fn):
    """x[mask] = v as a select; constant integer indices (repeats accumulated) as a
    gather from x and the values; through torch.compile, nothing on torch."""
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    compiled = torch.compile(fn, backend="braze", dynamic=False,
                             options={"allow_fallback": False})
    with torch.no_grad():
        # repeats add in update order here; torch's order is its own (a rounding apart)
        np.testing.assert_allclose(compiled(x).numpy(), fn(x).numpy(), rtol=1e-6, atol=0)
