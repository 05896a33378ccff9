"""ONNX ScatterND with constant indices (importers/scans.py): one gather from data and
updates side by side, or for a reduction one gather per write to a position; numbers
against onnxruntime with nothing on the host, duplicates and negative indices included;
indices computed at run time become the IR's scatter op."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import bridge

RNG = np.random.default_rng(0)


def _model(data_shape, indices, updates_shape, reduction, dtype=np.float32, opset=18):
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    attrs = {} if reduction == "none" else {"reduction": reduction}
    node = helper.make_node("ScatterND", ["x", "i", "u"], ["y"], **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", elem, data_shape),
                      helper.make_tensor_value_info("u", elem, updates_shape)],
        [helper.make_tensor_value_info("y", elem, None)],
        [numpy_helper.from_array(indices.astype(np.int64), "i")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _ort(model, feeds):
    return ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("data_shape,index_shape", [
    ((5, 4, 3), (6, 1)),  # whole slices of the first axis
    ((5, 4, 3), (2, 3, 2)),  # rows, a 2-d grid of index tuples
    ((5, 4, 3), (7, 3)),  # single elements
    ((4, 6), (3, 2)),
])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_scatter_nd_matches_onnxruntime(reduction, data_shape, index_shape, dtype):
    k = index_shape[-1]
    lead = np.array(data_shape[:k])
    # repeats included (several writes to one place), negative indices too
    idx = RNG.integers(-lead, lead, size=index_shape)
    if reduction == "none":  # onnxruntime's order for repeats is its own: keep them apart
        flat = np.ravel_multi_index(tuple((idx.reshape(-1, k) % lead).T), data_shape[:k])
        idx = idx.reshape(-1, k)[np.sort(np.unique(flat, return_index=True)[1])]
    upd_shape = tuple(idx.shape[:-1]) + tuple(data_shape[k:])
    data = (RNG.standard_normal(data_shape) * 4).astype(dtype)
    upd = (RNG.standard_normal(upd_shape) * 4).astype(dtype)
    model = _model(data_shape, idx, upd_shape, reduction, dtype)
    compiled = bridge.compile_onnx(model, allow_fallback=False)
    got, want = compiled(data, upd)[0], _ort(model, {"x": data, "u": upd})
    if dtype == np.int64:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    ops = [n.op for n in next(iter(compiled._specs.values())).plan.graph.nodes]
    # constant positions: data movement (a gather, or, where the writes are whole runs of
    # elements, a concat of slices: identities.constant_gather), not the scatter kernel
    assert "scatter" not in ops and ("gather" in ops or "concat" in ops)


def test_last_write_wins_without_a_reduction():
    """Repeats under reduction "none" (undefined in ONNX): the last update wins, as
    onnxruntime's loop over the updates leaves it."""
    idx = np.array([[1], [3], [1]])
    data = np.zeros((5, 2), np.float32)
    upd = np.arange(6, dtype=np.float32).reshape(3, 2) + 1
    model = _model(data.shape, idx, upd.shape, "none")
    got = bridge.compile_onnx(model, allow_fallback=False)(data, upd)[0]
    np.testing.assert_array_equal(got, _ort(model, {"x": data, "u": upd}))
    np.testing.assert_array_equal(got[1], upd[2])


def test_indices_known_only_at_run_time_compile_to_the_scatter_op():
    """(importers/scatter.py; tests/importers/test_runtime_scatter.py has the rest)"""
    node = helper.make_node("ScatterND", ["x", "i", "u"], ["y"])
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (4, 3)),
                      helper.make_tensor_value_info("i", TensorProto.INT64, (2, 1)),
                      helper.make_tensor_value_info("u", TensorProto.FLOAT, (2, 3))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    i = np.array([[2], [0]], np.int64)
    u = RNG.standard_normal((2, 3)).astype(np.float32)
    compiled = bridge.compile_onnx(model, allow_fallback=False)
    np.testing.assert_array_equal(compiled(x, i, u)[0], _ort(model, {"x": x, "i": i, "u": u}))
    ops = [n.op for n in next(iter(compiled._specs.values())).plan.graph.nodes]
    assert "scatter" in ops


@pytest.mark.parametrize("reduction", ["none", "add", "max"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scatter_elements_matches_onnxruntime(reduction, axis):
    data = RNG.standard_normal((5, 6, 4)).astype(np.float32)
    shape = [4, 5, 3]
    n = data.shape[axis]
    if reduction == "none":  # distinct targets along the axis (onnxruntime's repeats order)
        line = list(shape)
        line[axis] = n
        idx = np.take(np.argsort(RNG.random(line), axis=axis), range(shape[axis]), axis=axis)
        idx = idx - n * (RNG.random(idx.shape) < 0.5)  # some negative
    else:
        idx = RNG.integers(-n, n, size=shape)
    upd = RNG.standard_normal(idx.shape).astype(np.float32)
    attrs = {} if reduction == "none" else {"reduction": reduction}
    node = helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=axis, **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, data.shape),
                      helper.make_tensor_value_info("u", TensorProto.FLOAT, upd.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(idx.astype(np.int64), "i")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    got = bridge.compile_onnx(model, allow_fallback=False)(data, upd)[0]
    np.testing.assert_allclose(got, _ort(model, {"x": data, "u": upd}), rtol=1e-6, atol=1e-6)
