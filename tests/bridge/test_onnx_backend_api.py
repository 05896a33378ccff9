"""bridge.onnx_backend: the onnx.backend module API (prepare, run_model, run_node, devices)."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import bridge.onnx_backend as backend
from bridge import BrazeError, CompileError


def _add_relu() -> onnx.ModelProto:
    g = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
        "ar", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3]) for n in "ab"],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


A = np.array([1, -2, 3], np.float32)
B = np.array([-4, 1, 1], np.float32)
WANT = np.maximum(A + B, 0)


def test_prepare_runs_lists_and_dicts():
    rep = backend.prepare(_add_relu(), "CPU")
    np.testing.assert_array_equal(rep.run([A, B])[0], WANT)
    np.testing.assert_array_equal(rep.run({"b": B, "a": A})[0], WANT)
    np.testing.assert_array_equal(backend.run_model(_add_relu(), [A, B])[0], WANT)


def test_prepare_takes_serialized_models_and_options():
    rep = backend.prepare(_add_relu().SerializeToString(), allow_fallback=False, threads=1)
    np.testing.assert_array_equal(rep.run([A, B])[0], WANT)
    with pytest.raises(BrazeError, match="unknown braze option"):
        backend.prepare(_add_relu(), turbo=True)


def test_run_node_infers_types_from_the_inputs():
    node = helper.make_node("Mul", ["x", "y"], ["z"])
    x = np.arange(6, dtype=np.int64).reshape(2, 3)
    np.testing.assert_array_equal(backend.run_node(node, [x, x])[0], x * x)


def test_devices():
    assert backend.supports_device("CPU") and not backend.supports_device("CUDA")
    assert backend.is_compatible(_add_relu(), "CPU")
    with pytest.raises(RuntimeError, match="CUDA"):
        backend.prepare(_add_relu(), "CUDA")


def test_no_fallback_refuses_an_op_without_a_converter():
    axis = numpy_helper.from_array(np.array(0, np.int64), "axis")
    g = helper.make_graph([helper.make_node("MeanVarianceNormalization", ["x"], ["y"], name="cs", axes=[0])], "cs",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])], [axis])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    import onnxruntime

    want = onnxruntime.InferenceSession(model.SerializeToString(),
                                        providers=["CPUExecutionProvider"]).run(None, {"x": A})
    np.testing.assert_allclose(backend.prepare(model).run([A])[0], want[0], rtol=1e-6)
    with pytest.raises(CompileError, match="cannot compile MeanVarianceNormalization node 'cs'"):
        backend.prepare(model, allow_fallback=False).run([A])
