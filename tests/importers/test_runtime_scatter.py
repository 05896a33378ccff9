"""Scatters at positions known only at run time (importers/scatter.py -> the IR's scatter
op): ONNX ScatterND, ScatterElements, Scatter and TensorScatter against onnxruntime,
torch's index_put, scatter, scatter_add, scatter_reduce, index_add, index_copy,
index_fill, index_reduce and put against eager, all with nothing on the host; and a KV
cache [1, heads, 128, 64] updated at a run-time position, compiled once for every
position."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch.func import functionalize
from torch.fx.experimental.proxy_tensor import make_fx

import bridge
from compiler.errors import BrazeIndexError
from compiler.interp import evaluate
from importers.fx import import_fx

RNG = np.random.default_rng(0)
F32, I64 = TensorProto.FLOAT, TensorProto.INT64


# -- ONNX -----------------------------------------------------------------------

def _model(op, inputs, attrs=None, opset=18, inits=()):
    """One `op` node over graph inputs [(name, elem, shape)], output y."""
    node = helper.make_node(op, [n for n, _, _ in inputs] + [i.name for i in inits], ["y"],
                            **(attrs or {}))
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, e, s) for n, e, s in inputs],
        [helper.make_tensor_value_info("y", inputs[0][1], None)], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _ort(model, feeds):
    return ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _ops(compiled) -> list[str]:
    return [n.op for spec in compiled._specs.values() for n in spec.plan.graph.nodes]


def _check(model, feeds, exact=False):
    compiled = bridge.compile_onnx(model, allow_fallback=False)
    got, want = compiled(*feeds.values())[0], _ort(model, feeds)
    if exact:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert "scatter" in _ops(compiled) and "host" not in _ops(compiled)
    return compiled


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("data_shape,index_shape", [((5, 4, 3), (6, 1)), ((5, 4, 3), (2, 3, 2)),
                                                    ((5, 4, 3), (7, 3))])
def test_scatter_nd_at_run_time_matches_onnxruntime(reduction, data_shape, index_shape):
    k = index_shape[-1]
    lead = np.array(data_shape[:k])
    idx = RNG.integers(-lead, lead, size=index_shape)  # repeats and negatives
    upd_shape = index_shape[:-1] + data_shape[k:]
    data = (RNG.standard_normal(data_shape) * 3).astype(np.float32)
    upd = (RNG.standard_normal(upd_shape) * 3).astype(np.float32)
    attrs = {} if reduction == "none" else {"reduction": reduction}
    model = _model("ScatterND", [("x", F32, data_shape), ("i", I64, index_shape),
                                 ("u", F32, upd_shape)], attrs)
    _check(model, {"x": data, "i": idx.astype(np.int64), "u": upd})


def test_scatter_nd_of_integers_and_the_last_write_wins():
    data = np.zeros((6, 2), np.int64)
    idx = np.array([[1], [3], [1], [-1]], np.int64)
    upd = np.arange(8, dtype=np.int64).reshape(4, 2) + 1
    model = _model("ScatterND", [("x", I64, (6, 2)), ("i", I64, (4, 1)), ("u", I64, (4, 2))])
    compiled = _check(model, {"x": data, "i": idx, "u": upd}, exact=True)
    np.testing.assert_array_equal(compiled(data, idx, upd)[0][1], upd[2])


@pytest.mark.parametrize("reduction", ["none", "add", "max"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scatter_elements_at_run_time_matches_onnxruntime(reduction, axis):
    data = RNG.standard_normal((5, 6, 4)).astype(np.float32)
    n = data.shape[axis]
    idx = RNG.integers(-n, n, size=(4, 5, 3)).astype(np.int64)
    upd = RNG.standard_normal(idx.shape).astype(np.float32)
    attrs = {"axis": axis} | ({} if reduction == "none" else {"reduction": reduction})
    model = _model("ScatterElements", [("x", F32, data.shape), ("i", I64, idx.shape),
                                       ("u", F32, upd.shape)], attrs)
    _check(model, {"x": data, "i": idx, "u": upd})


def test_old_scatter_op():
    data = np.zeros((3, 3), np.float32)
    idx = np.array([[1, 0, 2], [0, 2, 1]], np.int64)
    upd = np.array([[1, 1.1, 1.2], [2, 2.1, 2.2]], np.float32)
    model = _model("Scatter", [("x", F32, (3, 3)), ("i", I64, (2, 3)), ("u", F32, (2, 3))],
                   {"axis": 1}, opset=10)
    _check(model, {"x": data, "i": idx, "u": upd})


@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter_with_write_indices(mode):
    cache = RNG.standard_normal((2, 3, 8, 4)).astype(np.float32)
    update = RNG.standard_normal((2, 3, 3, 4)).astype(np.float32)
    write = np.array([1, 5] if mode == "linear" else [6, 2], np.int64)
    model = _model("TensorScatter", [("c", F32, cache.shape), ("u", F32, update.shape),
                                     ("w", I64, (2,))], {"mode": mode}, opset=24)
    _check(model, {"c": cache, "u": update, "w": write})


def test_an_index_out_of_range_raises_index_error_like_onnxruntime():
    """Index 4 of an axis of 4: its flat position would land inside data (row 1, col 0),
    but each index is checked against its own axis."""
    model = _model("ScatterElements", [("x", F32, (3, 4)), ("i", I64, (1, 2)),
                                       ("u", F32, (1, 2))], {"axis": 1})
    compiled = bridge.compile_onnx(model, allow_fallback=False)
    x, u = np.zeros((3, 4), np.float32), np.ones((1, 2), np.float32)
    compiled(x, np.array([[0, 3]]), u)
    with pytest.raises(BrazeIndexError):
        compiled(x, np.array([[0, 4]]), u)
    with pytest.raises(Exception):
        _ort(model, {"x": x, "i": np.array([[0, 4]]), "u": u})


HEADS, SEQ, DIM = 4, 128, 64


def _kv_model():
    """cache [1, H, 128, 64] with new [1, H, 1, 64] written at position pos (an int64 [1]
    input): ScatterND at index tuples (0, h, pos) built from pos, as exporters write it."""
    nodes = [
        helper.make_node("Reshape", ["pos", "one4"], ["p4"]),
        helper.make_node("Expand", ["p4", "grid_shape"], ["pgrid"]),
        helper.make_node("Concat", ["zeros", "heads", "pgrid"], ["idx"], axis=-1),
        helper.make_node("ScatterND", ["cache", "idx", "new"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.array([1, 1, 1, 1], np.int64), "one4"),
             numpy_helper.from_array(np.array([1, HEADS, 1, 1], np.int64), "grid_shape"),
             numpy_helper.from_array(np.zeros((1, HEADS, 1, 1), np.int64), "zeros"),
             numpy_helper.from_array(np.arange(HEADS, dtype=np.int64).reshape(1, HEADS, 1, 1),
                                     "heads")]
    graph = helper.make_graph(
        nodes, "kv", [helper.make_tensor_value_info("cache", F32, (1, HEADS, SEQ, DIM)),
                      helper.make_tensor_value_info("pos", I64, (1,)),
                      helper.make_tensor_value_info("new", F32, (1, HEADS, 1, DIM))],
        [helper.make_tensor_value_info("y", F32, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_kv_cache_update_at_a_run_time_position_compiles_once():
    model = _kv_model()
    compiled = bridge.compile_onnx(model, allow_fallback=False)
    cache = RNG.standard_normal((1, HEADS, SEQ, DIM)).astype(np.float32)
    for pos in (0, 17, SEQ - 1):
        new = RNG.standard_normal((1, HEADS, 1, DIM)).astype(np.float32)
        feeds = {"cache": cache, "pos": np.array([pos], np.int64), "new": new}
        got = compiled(*feeds.values())[0]
        np.testing.assert_array_equal(got, _ort(model, feeds))
        np.testing.assert_array_equal(got[:, :, pos], new[:, :, 0])
        cache = got
    assert len(compiled._specs) == 1  # not specialized on the position's value
    assert "scatter" in _ops(compiled) and "host" not in _ops(compiled)
    with pytest.raises(BrazeIndexError):
        compiled(cache, np.array([SEQ], np.int64), new)


def test_kv_cache_update_by_tensor_scatter():
    model = _model("TensorScatter", [("c", F32, (1, HEADS, SEQ, DIM)),
                                     ("u", F32, (1, HEADS, 1, DIM)), ("w", I64, (1,))],
                   {"axis": 2}, opset=24)
    compiled = bridge.compile_onnx(model, allow_fallback=False)
    cache = RNG.standard_normal((1, HEADS, SEQ, DIM)).astype(np.float32)
    new = RNG.standard_normal((1, HEADS, 1, DIM)).astype(np.float32)
    for pos in (3, 99):
        feeds = {"c": cache, "u": new, "w": np.array([pos], np.int64)}
        np.testing.assert_array_equal(compiled(*feeds.values())[0], _ort(model, feeds))
    assert len(compiled._specs) == 1 and "scatter" in _ops(compiled)


# -- torch ----------------------------------------------------------------------

def _compiled(fn):
    torch._dynamo.reset()  # the reduce variants share one code object
    return torch.compile(fn, backend="braze", dynamic=False, fullgraph=True,
                         options={"allow_fallback": False, "strict": True})


def _put_rows(x, i, v):
    y = x.clone()
    y[i] = v
    return y


def _put_points(x, i, v):
    return torch.index_put(x, (i, i.flip(0) % 6), v[:, 0], accumulate=True)


def _put_apart(x, i, v):  # indexed dims apart: the broadcast index dims go first
    y = x.reshape(2, 2, 6).clone()
    y[i % 2, :, i.flip(0) % 6] = v[:, :2]
    return y


def _put_negative(x, i, v):
    y = x.clone()
    y[i - 4] = v * 2
    return y


def _scatter_reduce(reduce, include_self):
    def fn(x, i, v):
        return x.scatter_reduce(1, i.reshape(4, 1).expand(4, 2) % 6, v[:, :2], reduce,
                                include_self=include_self)
    return fn


def _index_reduce(reduce):
    def fn(x, i, v):
        return x.index_reduce(0, i % 4, v, reduce, include_self=False)
    return fn


GATHERED = [
    ("index_put rows", _put_rows),
    ("index_put accumulate", _put_points),
    ("index_put apart", _put_apart),
    ("index_put negative", _put_negative),
    ("scatter src", lambda x, i, v: x.scatter(1, i.reshape(4, 1).expand(4, 3) % 6, v[:, :3])),
    ("scatter value", lambda x, i, v: x.scatter(0, i.reshape(1, 4) % 4, 2.5)),
    ("scatter reduce", lambda x, i, v: x.scatter(1, i.reshape(4, 1) % 6, v, reduce="multiply")),
    ("scatter_add", lambda x, i, v: torch.zeros(3, 6).scatter_add(
        0, (i % 3).reshape(4, 1).expand(4, 6), v)),
    ("index_add", lambda x, i, v: x.index_add(0, i % 4, v, alpha=0.5)),
    ("index_copy", lambda x, i, v: x.index_copy(1, i[:2] + 2, v[:, :2] + i[:, None])),
    ("index_fill", lambda x, i, v: x.index_fill(1, i % 6, -1.0)),
    ("put", lambda x, i, v: x.put(i * 5 - 7, v[:, 0], accumulate=True)),
] + [(f"scatter_reduce {r} {s}", _scatter_reduce(r, s))
       for r in ("sum", "prod", "amax", "amin", "mean") for s in (True, False)] + [
    (f"index_reduce {r}", _index_reduce(r)) for r in ("prod", "amax", "mean")]


@pytest.mark.parametrize("name,fn", GATHERED, ids=[n for n, _ in GATHERED])
def test_torch_scatters_at_run_time_match_eager(name, fn):
    gen = torch.Generator().manual_seed(0)
    x, v = torch.randn(4, 6, generator=gen), torch.randn(4, 6, generator=gen)
    i = torch.tensor([3, 1, 3, 2])
    gm = make_fx(functionalize(fn, remove="mutations"))(x, i, v)
    imp = import_fx(gm, [x, i, v])
    ops = [n.op for n in imp.graph.nodes]
    assert "scatter" in ops and "host" not in ops, imp.refusals
    want = fn(x, i, v).numpy()
    got = evaluate(imp.graph, [[x, i, v][k].numpy() for k in imp.input_indices])[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    with torch.no_grad():
        np.testing.assert_allclose(_compiled(fn)(x, i, v).numpy(), want, rtol=1e-6, atol=1e-6)


def test_gnn_message_passing_sums_over_edges():
    """scatter_add of each edge's message into its target node (repeats add in order)."""
    def layer(h, src, dst):
        msg = h[src] * 0.5
        return torch.zeros_like(h).index_add(0, dst, msg) + h

    gen = torch.Generator().manual_seed(1)
    h = torch.randn(10, 16, generator=gen)
    src, dst = (torch.randint(0, 10, (40,), generator=gen) for _ in range(2))
    with torch.no_grad():
        np.testing.assert_allclose(_compiled(layer)(h, src, dst).numpy(),
                                   layer(h, src, dst).numpy(), rtol=1e-5, atol=1e-6)


def test_torch_kv_cache_update_at_a_run_time_position():
    def step(cache, pos, new):
        return cache.index_copy(2, pos, new)

    def step_put(cache, pos, new):
        cache = cache.clone()
        cache[:, :, pos] = new
        return cache

    gen = torch.Generator().manual_seed(2)
    cache = torch.randn(1, HEADS, SEQ, DIM, generator=gen)
    for fn in (step, step_put):
        compiled = _compiled(fn)
        c = cache
        with torch.no_grad():
            for pos in (0, 40, SEQ - 1):
                new = torch.randn(1, HEADS, 1, DIM, generator=gen)
                p = torch.tensor([pos])
                got = compiled(c, p, new)
                torch.testing.assert_close(got, fn(c, p, new), rtol=0, atol=0)
                c = got
    gm = make_fx(functionalize(step_put, remove="mutations"))(
        cache, torch.tensor([1]), new)
    ops = [n.op for n in import_fx(gm, [cache, torch.tensor([1]), new]).graph.nodes]
    assert "scatter" in ops and "host" not in ops


def test_torch_index_out_of_range_raises_index_error():
    fn = lambda x, i, v: x.index_add(0, i, v)  # noqa: E731
    x, v = torch.zeros(4, 3), torch.ones(2, 3)
    compiled = _compiled(fn)
    with torch.no_grad():
        compiled(x, torch.tensor([0, 3]), v)
        with pytest.raises(IndexError):
            compiled(x, torch.tensor([0, 4]), v)


@pytest.mark.parametrize("fn", [
    lambda x, v: x.scatter(1, torch.tensor([[0], [2], [1], [5]]), v[:, :1]),
    lambda x, v: x.scatter_add(0, torch.tensor([[1, 1, 0, 3, 2, 1]]), v[:1]),
    lambda x, v: x.index_add(1, torch.tensor([4, 4, 0]), v[:, :3]),
])
def test_constant_indices_keep_the_gathers(fn):
    """Positions known at import: scans.py's gathers (faster), not the scatter kernel."""
    gen = torch.Generator().manual_seed(3)
    x, v = torch.randn(4, 6, generator=gen), torch.randn(4, 6, generator=gen)
    imp = import_fx(make_fx(fn)(x, v), [x, v])
    ops = [n.op for n in imp.graph.nodes]
    assert "gather" in ops and "scatter" not in ops and "host" not in ops
    got = evaluate(imp.graph, [[x, v][k].numpy() for k in imp.input_indices])[0]
    np.testing.assert_allclose(got, fn(x, v).numpy(), rtol=1e-6, atol=1e-6)
