"""The host boundary: a model onnxruntime runs whole costs what onnxruntime alone does.

Its host session may spin between parallel sections (no braze kernel shares the
cores), reshapes between host nodes join them in one step, and the numbers are
onnxruntime's. A model with compiled steps keeps non-spinning host sessions.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import bridge
from runtime.fallback_onnx import OnnxHostStep

H, I, T = 64, 6, 64  # the tail Exp: T x H = 4096 elements, not too cheap to compile


def _gru_model(tail_op: str) -> onnx.ModelProto:
    """GRU -> Squeeze -> GRU -> `tail_op`: two host nodes with a reshape between them."""
    rng = np.random.default_rng(0)

    def init(name, shape):
        return helper.make_tensor(name, TensorProto.FLOAT, shape,
                                  rng.standard_normal(shape).astype(np.float32).ravel())

    inits = [init("W0", [1, 3 * H, I]), init("R0", [1, 3 * H, H]),
             init("W1", [1, 3 * H, H]), init("R1", [1, 3 * H, H]),
             helper.make_tensor("ax", TensorProto.INT64, [1], [1])]
    # GRUs with a non-default activation list: braze compiles GRU only with the default
    # one, so these are host nodes (the boundary under test)
    acts = {"hidden_size": H, "activations": ["Sigmoid", "Relu"]}
    nodes = [helper.make_node("GRU", ["x", "W0", "R0"], ["y0"], **acts),
             helper.make_node("Squeeze", ["y0", "ax"], ["s0"]),
             helper.make_node("GRU", ["s0", "W1", "R1"], ["y1"], **acts),
             helper.make_node(tail_op, ["y1"], ["out"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [T, 1, I])], [helper.make_tensor_value_info(
            "out", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _host_sessions(compiled) -> list:
    spec = next(iter(compiled._specs.values()))
    return [p.step for p in spec.parts if p.compiled is None]


def _spins(step: OnnxHostStep) -> str:
    return step.session.get_session_options().get_session_config_entry(
        "session.intra_op.allow_spinning")


@pytest.mark.parametrize("threads", [1, 2])
def test_a_model_the_host_runs_whole_is_one_spinning_session(threads):
    model = _gru_model("Identity")
    x = np.random.default_rng(1).standard_normal((T, 1, I)).astype(np.float32)
    compiled = bridge.compile_onnx(model.SerializeToString(), threads=threads)
    got, = compiled(x)
    steps = _host_sessions(compiled)
    assert len(steps) == 1 and isinstance(steps[0], OnnxHostStep)
    assert _spins(steps[0]) == "1"
    want, = ort.InferenceSession(model.SerializeToString(),
                                 providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_host_sessions_beside_braze_kernels_do_not_spin():
    model = _gru_model("Exp")  # a compiled step after the host's
    x = np.random.default_rng(2).standard_normal((T, 1, I)).astype(np.float32)
    compiled = bridge.compile_onnx(model.SerializeToString(), threads=2)
    got, = compiled(x)
    spec = next(iter(compiled._specs.values()))
    assert [p.compiled is None for p in spec.parts] == [True, False]
    assert _spins(_host_sessions(compiled)[0]) == "0"
    want, = ort.InferenceSession(model.SerializeToString(),
                                 providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
