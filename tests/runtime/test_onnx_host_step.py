"""OnnxHostStep at call time: onnxruntime's binding run (and the public run it falls back
to) give the same results; a failing node raises HostOpError naming it, with
onnxruntime's exception as the cause; runtime/ort_errors.py's one-line messages."""

import numpy as np
import pytest
from onnx import helper

from compiler.errors import BrazeError, HostOpError
from compiler.ir import Graph, TensorType
from runtime.fallback_onnx import OnnxHostStep, _binding_run
from runtime.ort_errors import ort_message, where

RNG = np.random.default_rng(0)


def _cumsum_graph(axis: int, n: int = 6) -> Graph:
    """exp(CumSum(x, axis)) with CumSum a host node named "host0" (ONNX node "cs0")."""
    g = Graph()
    x = g.add_input("x", TensorType("f32", (n,)))
    ax = g.const(np.array(axis, np.int64), "axis")
    node = helper.make_node("CumSum", ["orig_x", "orig_axis"], ["orig_y"], name="cs0")
    fn = helper.make_function("braze.host", "CumSum", ["orig_x", "orig_axis"], ["orig_y"],
                              [node], [helper.make_opsetid("", 17)])
    (y,) = g.add_node("host", [x, ax], {
        "framework": "onnx", "domain": "", "op_type": "CumSum", "reason": "test",
        "payload": fn.SerializeToString()}, name="host0", out_types=[x.type]).outputs
    g.outputs = [g.op("exp", y)]
    return g


def _public(step: OnnxHostStep) -> OnnxHostStep:
    step._run = step.session.run
    return step


@pytest.mark.parametrize("path", ["binding", "public"])
def test_both_run_paths_match_numpy(path):
    step = OnnxHostStep(_cumsum_graph(0), threads=1)
    if path == "public":
        _public(step)
    else:
        assert step._run != step.session.run  # this onnxruntime has the binding's run
    x = RNG.standard_normal(6).astype(np.float32)
    np.testing.assert_allclose(step([x])[0], np.exp(np.cumsum(x)), rtol=1e-6)


def test_binding_run_falls_back_to_the_public_one():
    class Session:  # no `_sess`: another onnxruntime's layout
        def run(self, names, feed):
            return ["public", names, feed]

    s = Session()
    assert _binding_run(s)(["y"], {"x": 1}) == ["public", ["y"], {"x": 1}]


@pytest.mark.parametrize("path", ["binding", "public"])
def test_failing_node_raises_host_op_error_naming_it(path):
    step = OnnxHostStep(_cumsum_graph(3), threads=1)  # axis 3 of a 1-d input
    if path == "public":
        _public(step)
    with pytest.raises(HostOpError) as e:
        step([np.ones(6, np.float32)])
    msg = str(e.value)
    assert isinstance(e.value, BrazeError) and "\n" not in msg
    assert msg.startswith('onnxruntime failed running CumSum node "cs0": ')
    assert "axis 3 is not in valid range" in msg and "onnxruntime_src" not in msg
    assert type(e.value.__cause__).__module__.startswith("onnxruntime")


def test_where_without_a_node_in_the_message():
    g = _cumsum_graph(0)
    nodes = [n for n in g.nodes if n.op != "const"]
    assert where(RuntimeError("bad input"), nodes) == 'CumSum node "host0"'
    exps = [n for n in nodes if n.op == "exp"] * 5
    assert where(RuntimeError("bad input"), exps) == "exp node, exp node, exp node and 2 more"
    assert where(RuntimeError("Type Error: Type 'tensor(float)' of input parameter (a) of "
                              "operator (CumSum) in node (cs) is invalid."), nodes) == \
        'CumSum node "cs"'


def test_ort_message_keeps_the_reason_on_one_line():
    raw = ("[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running CumSum "
           "node. Name:'cs' Status Message: /onnxruntime_src/onnxruntime/core/providers/"
           "common.h:31 int64_t onnxruntime::HandleNegativeAxis(int64_t, int64_t) "
           "IsAxisInRange(axis, tensor_rank) was false. axis 5 is not in valid range [-2,1]\n")
    assert ort_message(RuntimeError(raw)) == "axis 5 is not in valid range [-2,1]"
    assert ort_message(RuntimeError("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Non-zero "
                                    "status code returned while running GatherND node. "
                                    "Name:'g' Status Message: invalid index found, index = 9"
                                    )) == "invalid index found, index = 9"
    assert ort_message(RuntimeError("two\nlines")) == "two lines"
    assert ort_message(RuntimeError("")) == "RuntimeError"
