"""Host nodes on constants run once at compile time (bridge/onnx_fold.py)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import bridge
from bridge import onnx_fold
from importers.onnx import import_onnx


def _model(random: bool = False):
    """x + MeanVarianceNormalization(c) (an op braze has no converter for): its result
    is a constant."""
    zeros = numpy_helper.from_array(np.zeros((4, 5), np.float32), "zeros")
    c = numpy_helper.from_array(np.arange(20, dtype=np.float32).reshape(4, 5) % 7, "c")
    nodes = [helper.make_node("MeanVarianceNormalization", ["c"], ["mask"], axes=[1]),
             helper.make_node("Add", ["x", "mask"], ["y"])]
    if random:
        nodes = [helper.make_node("RandomUniformLike", ["zeros"], ["mask"], seed=1.0),
                 helper.make_node("Add", ["x", "mask"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [4, 5])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [4, 5])], [zeros, c])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_host_node_on_constants_becomes_a_constant():
    model = _model()
    g = import_onnx(model).graph
    (host,) = [n for n in g.nodes if n.op == "host"]
    assert onnx_fold.refusal(host) is None
    assert onnx_fold.fold_constant_host_nodes(g, 17) == 1
    assert not any(n.op == "host" for n in g.nodes)
    x = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    compiled = bridge.compile_onnx(model.SerializeToString(), allow_fallback=False)
    got, = compiled(x)
    want, = ort.InferenceSession(model.SerializeToString(),
                                 providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(got, want)


def test_random_and_run_time_host_nodes_stay():
    g = import_onnx(_model(random=True)).graph
    (host,) = [n for n in g.nodes if n.op == "host"]
    assert "random" in onnx_fold.refusal(host)
    assert onnx_fold.fold_constant_host_nodes(g, 17) == 0
    cumsum = helper.make_model(helper.make_graph(
        [helper.make_node("MeanVarianceNormalization", ["x"], ["y"], axes=[0])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [numpy_helper.from_array(np.array(0, np.int64), "ax")]),
        opset_imports=[helper.make_opsetid("", 17)])
    (host,) = [n for n in import_onnx(cumsum).graph.nodes if n.op == "host"]
    assert "computed at run time" in onnx_fold.refusal(host)


def test_explain_shows_the_plan_compile_runs():
    """`braze explain` folds constant host nodes as compile_onnx does: it reported
    Swin's mask builders (ScatterND, before braze converted it) as a host cluster that
    compiled models never run."""
    from bridge.onnx_api import explain_onnx

    text = explain_onnx(_model(), {})
    assert "(host" not in text and "1 of 1 nodes compiled by braze" in text
