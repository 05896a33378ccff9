"""ONNX TopK, Hardmax and OneHot (importers/onnx_ops/selection.py): nothing on the host,
and numbers against onnxruntime exactly: TopK's order among ties, NaN, infinities and
the dtype's extremes (the value a taken position is masked with), Hardmax's first
maximum, OneHot's negative, out-of-range and float indices."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import bridge
from importers.onnx import import_onnx
from importers.onnx_ops.selection import TOPK_MAX_K

RNG = np.random.default_rng(0)
F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=(), opset=13):
    graph = helper.make_graph(nodes, "g", inputs,
                              [helper.make_empty_tensor_value_info(o) for o in outputs],
                              list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
                                         shape)


def _check(model, feeds, trials=1, draw=None):
    """braze (no host node) and onnxruntime agree exactly, NaN where NaN, on `feeds` and
    on `trials - 1` more drawn by `draw()`; braze's outputs for `feeds`."""
    compiled = bridge.compile_onnx(model, allow_fallback=False)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    first = compiled(**feeds)
    for _ in range(trials):
        got, want = compiled(**feeds), sess.run(None, feeds)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(g, w, err_msg=str(feeds))
        feeds = draw() if draw else feeds
    return first


def _ops(model, shapes):
    return [n.op for n in import_onnx(model, shapes).graph.nodes]


# -- TopK ---------------------------------------------------------------------

def _topk_model(shape, dtype, cases, opset=13):
    """One TopK per (k, axis, largest) in `cases`, all reading x."""
    nodes, outs, inits = [], [], []
    for j, (k, axis, largest) in enumerate(cases):
        inits.append(numpy_helper.from_array(np.array([k], np.int64), f"k{j}"))
        nodes.append(helper.make_node("TopK", ["x", f"k{j}"], [f"v{j}", f"i{j}"], axis=axis,
                                      largest=largest))
        outs += [f"v{j}", f"i{j}"]
    return _model(nodes, [_vi("x", dtype, shape)], outs, inits, opset)


def _pool(dtype):
    """Few distinct values (ties everywhere), the awkward ones included."""
    if np.dtype(dtype).kind == "f":
        return np.array([np.nan, -np.inf, np.inf, 0.0, -0.0, 1.5, -2.0], dtype)
    info = np.iinfo(dtype)
    return np.array([info.min, info.min + 1, info.max, 0, 1, -1], dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_topk_matches_onnxruntime(dtype):
    shape = (4, 6)
    cases = [(1, -1, 1), (3, -1, 0), (6, -1, 1), (6, 1, 0), (2, 0, 1), (4, 0, 0)]
    model = _topk_model(shape, dtype, cases)
    draw = lambda: {"x": RNG.choice(_pool(dtype), size=shape)}  # noqa: E731
    _check(model, draw(), trials=20, draw=draw)


def test_topk_ties_lower_index_first():
    x = np.array([[3, 1, 3, 2, 1, 3], [0, 5, 4, 5, 0, 1]], np.float32)
    model = _topk_model(x.shape, np.float32, [(4, -1, 1), (4, -1, 0)])
    _, i, _, j = _check(model, {"x": x})
    np.testing.assert_array_equal(i, [[0, 2, 5, 3], [1, 3, 2, 5]])
    np.testing.assert_array_equal(j, [[1, 4, 3, 0], [0, 4, 5, 2]])


@pytest.mark.parametrize("opset", [1, 10])
def test_topk_before_largest(opset):
    """k an attribute (1) or an input (10); no largest attribute: the largest."""
    x = RNG.standard_normal((3, 5, 4)).astype(np.float32)
    inputs = ["x"] if opset == 1 else ["x", "k"]
    attrs = {"k": 2} if opset == 1 else {}
    inits = [] if opset == 1 else [numpy_helper.from_array(np.array([2], np.int64), "k")]
    node = helper.make_node("TopK", inputs, ["v", "i"], axis=1, **attrs)
    _check(_model([node], [_vi("x", np.float32, x.shape)], ["v", "i"], inits, opset), {"x": x})


def test_topk_is_argmax_rounds_on_the_device():
    model = _topk_model((5, 9), np.float32, [(3, -1, 1)])
    ops = _ops(model, {"x": (5, 9)})
    assert "host" not in ops and ops.count("argmax") >= 3


def test_topk_with_k_unknown_or_large_or_f16_stays_on_the_host():
    x = _vi("x", np.float32, (2, 100))
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"])
    runtime_k = _model([node], [x, _vi("k", np.int64, (1,))], ["v", "i"])
    large_k = _model([node], [x], ["v", "i"],
                     [numpy_helper.from_array(np.array([TOPK_MAX_K + 1], np.int64), "k")])
    half = _topk_model((2, 100), np.float16, [(3, -1, 1)])
    for model, shapes, reason in [
        (runtime_k, {"x": (2, 100), "k": (1,)}, "its K input is not a constant"),
        (large_k, {"x": (2, 100)}, f"TopK with k={TOPK_MAX_K + 1}"),
        (half, {"x": (2, 100)}, "TopK of f16"),
    ]:
        (host,) = [n for n in import_onnx(model, shapes).graph.nodes if n.op == "host"]
        assert reason in host.attrs["reason"]


# -- Hardmax ------------------------------------------------------------------

@pytest.mark.parametrize("opset", [11, 13])
def test_hardmax_matches_onnxruntime(opset):
    """Opset 11 coerces x to 2-d at axis, 13 takes one axis; ties: the first."""
    shape = (3, 4, 5)
    axes = (0, 1, -1)
    nodes = [helper.make_node("Hardmax", ["x"], [f"y{j}"], axis=a) for j, a in enumerate(axes)]
    nodes.append(helper.make_node("Hardmax", ["x"], ["yd"]))
    model = _model(nodes, [_vi("x", np.float32, shape)],
                   [f"y{j}" for j in range(len(axes))] + ["yd"], opset=opset)
    draw = lambda: {"x": RNG.integers(0, 3, shape).astype(np.float32)}  # noqa: E731
    _check(model, draw(), trials=5, draw=draw)
    assert "host" not in _ops(model, {"x": shape})


# -- OneHot -------------------------------------------------------------------

def test_onehot_matches_onnxruntime():
    """Negative indices count from the end; those outside [-depth, depth) are all off."""
    depth = 5
    axes = (0, 1, -1)
    nodes = [helper.make_node("OneHot", ["i", "d", "v"], [f"y{j}"], axis=a)
             for j, a in enumerate(axes)]
    model = _model(nodes, [_vi("i", np.int64, (3, 4)), _vi("v", np.float32, (2,))],
                   [f"y{j}" for j in range(len(axes))],
                   [numpy_helper.from_array(np.array(depth, np.int64), "d")], opset=11)
    i = np.array([[0, 4, 5, -1], [-5, -6, 7, 2], [-3, 1, 3, -7]], np.int64)
    _check(model, {"i": i, "v": np.array([-1, 2], np.float32)})
    assert "host" not in _ops(model, {"i": (3, 4), "v": (2,)})


def test_onehot_float_indices_truncate():
    """Float indices (and depth) are truncated toward zero, as onnxruntime does."""
    node = helper.make_node("OneHot", ["i", "d", "v"], ["y"], axis=0)
    model = _model([node], [_vi("i", np.float32, (8,)), _vi("v", np.float32, (2,))], ["y"],
                   [numpy_helper.from_array(np.array(4.7, np.float32), "d")], opset=11)
    i = np.array([0.5, 1.7, -0.5, -1.2, 2.9, -3.9, 3.99, 4.2], np.float32)
    _check(model, {"i": i, "v": np.array([0, 3], np.float32)})
