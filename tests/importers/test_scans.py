"""Prefix sums and products and take-along-axis gathers (importers/scans.py) from both
front ends: the scan is log-step adds (or muls), the gather one flat gather; numbers against onnxruntime
and torch, compiled with nothing on the host, and an index out of range raised."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import bridge

RNG = np.random.default_rng(0)


def _model(nodes, inputs, inits=(), out=TensorProto.FLOAT):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s)
                                           for n, t, s in inputs],
                              [helper.make_tensor_value_info("y", out, None)], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _ort(model, feeds):
    return ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.mark.parametrize("op", ["CumSum", "CumProd"])
@pytest.mark.parametrize("dtype,axis,exclusive,reverse", [
    (np.float32, 1, 0, 0), (np.float32, -1, 1, 0), (np.int64, 1, 0, 1),
    (np.int32, 0, 1, 1), (np.float64, 2, 0, 0)])
def test_scans_match_onnxruntime(op, dtype, axis, exclusive, reverse):
    # products of values near 1 (and small integers) stay finite over 37 steps
    x = RNG.standard_normal((3, 37, 5)) * 10 if op == "CumSum" else \
        RNG.uniform(0.8, 1.25, (3, 37, 5)) * RNG.choice([-1, 1], (3, 37, 5))
    if op == "CumProd" and np.issubdtype(dtype, np.integer):
        x = RNG.choice([-1, 1, 2], (3, 37, 5))
    x = x.astype(dtype)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    node = helper.make_node(op, ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", elem, x.shape)],
                              [helper.make_tensor_value_info("y", elem, None)],
                              [numpy_helper.from_array(np.array(axis, np.int64), "axis")])
    model = helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17 if op == "CumSum" else 26)])
    m = bridge.compile_onnx(model, allow_fallback=False)
    got, want = m(x)[0], _ort(model, {"x": x})
    if np.issubdtype(dtype, np.integer):
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    combine = "add" if op == "CumSum" else "mul"
    steps = sum(n.op == combine for n in next(iter(m._specs.values())).plan.graph.nodes)
    assert steps == int(np.ceil(np.log2(x.shape[axis])))  # log-step, not a running one


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements_matches_onnxruntime(axis):
    data = RNG.standard_normal((4, 6, 5)).astype(np.float32)
    idx_shape = list(data.shape)
    idx_shape[axis] = 3
    n = data.shape[axis]
    idx = RNG.integers(-n, n, idx_shape).astype(np.int64)
    node = helper.make_node("GatherElements", ["x", "i"], ["y"], axis=axis)
    model = _model([node], [("x", TensorProto.FLOAT, data.shape),
                            ("i", TensorProto.INT64, idx.shape)])
    got = bridge.compile_onnx(model, allow_fallback=False)(data, idx)[0]
    np.testing.assert_array_equal(got, _ort(model, {"x": data, "i": idx}))


def test_gather_elements_on_one_dim():
    """A 1-d gather (no other axes to add to the flat index)."""
    data = RNG.standard_normal(7).astype(np.float32)
    idx = np.array([6, -1, 0, 3], np.int64)
    node = helper.make_node("GatherElements", ["x", "i"], ["y"], axis=0)
    model = _model([node], [("x", TensorProto.FLOAT, data.shape),
                            ("i", TensorProto.INT64, idx.shape)])
    got = bridge.compile_onnx(model, allow_fallback=False)(data, idx)[0]
    np.testing.assert_array_equal(got, _ort(model, {"x": data, "i": idx}))


def test_gather_elements_out_of_range_raises():
    node = helper.make_node("GatherElements", ["x", "i"], ["y"], axis=1)
    model = _model([node], [("x", TensorProto.FLOAT, [2, 3]), ("i", TensorProto.INT64, [2, 2])])
    m = bridge.compile_onnx(model)
    with pytest.raises(IndexError):
        m(np.zeros((2, 3), np.float32), np.array([[0, 1], [3, 0]], np.int64))


class _Positions(torch.nn.Module):
    """RoBERTa's position ids: a cumsum over the mask."""

    def forward(self, ids, table):
        mask = ids.ne(1).int()
        pos = torch.cumsum(mask, dim=1).type_as(mask) * mask + 1
        return pos, torch.cumsum(table, -1)


def test_torch_cumsum_runs_compiled():
    ids = torch.tensor([[0, 5, 7, 1, 1, 9, 4, 2]])
    table = torch.randn(1, 16)
    model = _Positions()
    with torch.no_grad():
        want = model(ids, table)
        got = torch.compile(model, backend="braze",
                            options={"allow_fallback": False, "strict": True})(ids, table)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_torch_cumprod_runs_compiled():
    """torch.cumprod in float and int (a discount factor's running product, say)."""
    def f(x, n):
        return torch.cumprod(x, 1), torch.cumprod(n, 0, dtype=torch.int64)

    x = torch.rand(3, 9) + 0.5
    n = torch.randint(-3, 4, (6, 2), dtype=torch.int32)
    want = f(x, n)
    got = torch.compile(f, backend="braze", dynamic=False,
                        options={"allow_fallback": False, "strict": True})(x, n)
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-6)
    assert torch.equal(got[1], want[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("dim", [1, 0, -1])
def test_torch_logcumsumexp_runs_compiled(dtype, dim):
    """Large magnitudes (no overflow), -inf runs (the identity), +inf and NaN kept, a
    value far below the running maximum."""
    x = torch.randn(4, 37, dtype=dtype) * 30
    x[0, 5] = x[1, 0] = x[1, 1] = x[1, 2] = float("-inf")
    x[2, 7], x[3, 9], x[0, 20] = float("inf"), float("nan"), -1000.0
    got = torch.compile(lambda x: torch.logcumsumexp(x, dim), backend="braze", dynamic=False,
                        options={"allow_fallback": False, "strict": True})(x)
    want = torch.logcumsumexp(x, dim)
    torch.testing.assert_close(got, want, equal_nan=True,
                               rtol=1e-6 if dtype == torch.float32 else 1e-12, atol=0)
