"""bridge.compile_onnx: numerics vs onnxruntime, calling conventions, shapes, errors, threads."""

import threading

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import bridge
from bridge import CompileError, InputError

RNG = np.random.default_rng(0)


def _mlp(batch="N") -> onnx.ModelProto:
    """softmax(relu(x @ w + b) * 2): symbolic batch, two inputs (x, scale)."""
    inits = [numpy_helper.from_array(RNG.standard_normal((8, 4)).astype(np.float32), "w"),
             numpy_helper.from_array(RNG.standard_normal(4).astype(np.float32), "b")]
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["g"], name="gemm"),
             helper.make_node("Relu", ["g"], ["r"], name="relu"),
             helper.make_node("Mul", ["r", "scale"], ["m"], name="mul"),
             helper.make_node("Softmax", ["m"], ["y"], axis=-1, name="softmax")]
    g = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8]),
         helper.make_tensor_value_info("scale", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _ort(model, feeds):
    return ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)


def _inputs(n=3):
    return RNG.standard_normal((n, 8)).astype(np.float32), np.array([2.0], np.float32)


def test_matches_onnxruntime_positional_and_keyword():
    model = _mlp()
    m = bridge.compile_onnx(model)
    assert m.input_names == ["x", "scale"] and m.output_names == ["y"]
    x, s = _inputs()
    ref = _ort(model, {"x": x, "scale": s})[0]
    np.testing.assert_allclose(m(x, s)[0], ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m(scale=s, x=x)[0], ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m(x, scale=s)[0], ref, rtol=1e-5, atol=1e-6)


def test_new_shape_respecializes_and_is_cached():
    model = _mlp()
    m = bridge.compile_onnx(model)
    for n in (1, 5, 1, 5):
        x, s = _inputs(n)
        np.testing.assert_allclose(m(x, s)[0], _ort(model, {"x": x, "scale": s})[0],
                                   rtol=1e-5, atol=1e-6)
    assert len(m._specs) == 2


def test_from_path_and_threads(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_mlp(2), path)
    m = bridge.compile_onnx(str(path), threads=1)
    x, s = _inputs(2)
    assert m(x, s)[0].shape == (2, 4)


@pytest.mark.parametrize("call,words", [
    (lambda m, x, s: m(x), ["missing", "scale"]),
    (lambda m, x, s: m(x, s, s), ["takes 2 input(s)"]),
    (lambda m, x, s: m(x, s, extra=s), ["unknown input", "extra"]),
    (lambda m, x, s: m(x, x=x, scale=s), ["given twice"]),
    (lambda m, x, s: m(x.astype(np.float64), s), ["float32", "float64"]),
    (lambda m, x, s: m(x[0], s), ["rank 2"]),
    (lambda m, x, s: m(x[:, :3], s), ["dim 1 must be 8"]),
])
def test_bad_calls_raise_input_error(call, words):
    m = bridge.compile_onnx(_mlp())
    x, s = _inputs()
    with pytest.raises(InputError) as e:
        call(m, x, s)
    for w in words:
        assert w in str(e.value)


def test_unknown_option_and_target():
    with pytest.raises(bridge.BrazeError, match="unknown braze option"):
        bridge.compile_onnx(_mlp(), fast=True)
    with pytest.raises(bridge.BrazeError, match="unknown target"):
        bridge.compile_onnx(_mlp(), target="tpu")


def _onnxruntime(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """The model's first output, run by onnxruntime."""
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def _with_cumsum() -> onnx.ModelProto:
    """relu(mvn(x)): MeanVarianceNormalization has no braze converter, so it runs on
    onnxruntime."""
    axis = numpy_helper.from_array(np.array(0, np.int64), "axis")
    nodes = [helper.make_node("MeanVarianceNormalization", ["x"], ["c"], name="cumsum0", axes=[0]),
             helper.make_node("Relu", ["c"], ["y"], name="relu0")]
    g = helper.make_graph(nodes, "cs", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                       [5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5])], [axis])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_allow_fallback_false_names_the_node():
    x = RNG.standard_normal(5).astype(np.float32)
    np.testing.assert_allclose(bridge.compile_onnx(_with_cumsum())(x)[0],
                               _onnxruntime(_with_cumsum(), x), rtol=1e-6)
    m = bridge.compile_onnx(_with_cumsum(), allow_fallback=False)
    with pytest.raises(CompileError, match=r"cannot compile MeanVarianceNormalization node 'cumsum0': "
                       r".*MeanVarianceNormalization"):
        m(x)


def test_explain_lists_clusters_and_reasons():
    text = bridge.compile_onnx(_with_cumsum()).explain()
    assert "cluster 0" in text and "not compiled" in text and "MeanVarianceNormalization" in text


def test_outputs_do_not_alias_inputs_or_each_other():
    g = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "id",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])])
    m = bridge.compile_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    x = np.arange(3, dtype=np.float32)
    y, x_out = m(x)
    y[0] = 42
    x_out[1] = 42
    np.testing.assert_array_equal(x, [0, 1, 2])
    assert y[1] == 1


def test_concurrent_calls_give_the_same_answers():
    model = _mlp()
    m = bridge.compile_onnx(model)
    batches = [_inputs(n) for n in (1, 2, 3, 4) * 4]
    refs = [_ort(model, {"x": x, "scale": s})[0] for x, s in batches]
    results = [None] * len(batches)
    errors = []

    def work(i):
        try:
            for _ in range(5):
                results[i] = m(*batches[i])[0]
        except Exception as e:  # collected and re-raised in the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(batches))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for got, ref in zip(results, refs):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_small_integer_inputs_used_as_axes_are_specialized_on():
    g = helper.make_graph(
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0, name="rs")], "rs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4]),
         helper.make_tensor_value_info("axes", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m = bridge.compile_onnx(model, allow_fallback=False)
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    for axis in (0, 1, 0):
        np.testing.assert_allclose(m(x, np.array([axis]))[0], x.sum(axis), rtol=1e-5)
    assert "compiled by braze" in m.explain()


def test_inputs_that_a_wanted_constant_is_computed_from_are_specialized_on():
    """Pad's pads computed from an integer input (Sub, Div, Concat, as ONNX's function
    expansions do) and Resize's scales given as a float input: both specialized on,
    compiled with nothing on the host, one compile per value."""
    g = helper.make_graph(
        [helper.make_node("Sub", ["size", "four"], ["grow"]),
         helper.make_node("Div", ["grow", "two"], ["half"]),
         helper.make_node("Concat", ["half", "half"], ["pads"], axis=0),
         helper.make_node("Pad", ["x", "pads"], ["p"]),
         helper.make_node("Resize", ["p", "", "scales"], ["y"], mode="nearest")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4]),
         helper.make_tensor_value_info("size", TensorProto.INT64, [4]),
         helper.make_tensor_value_info("scales", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([0, 0, 4, 4], np.int64), "four"),
         numpy_helper.from_array(np.array(2, np.int64), "two")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    m = bridge.compile_onnx(model, allow_fallback=False)
    x = RNG.standard_normal((1, 1, 4, 4)).astype(np.float32)
    builds = []
    for size, scale in [(8, 2.0), (6, 0.5), (8, 2.0)]:
        feeds = {"x": x, "size": np.array([1, 1, size, size], np.int64),
                 "scales": np.array([1, 1, scale, scale], np.float32)}
        np.testing.assert_array_equal(m(*feeds.values())[0], sess.run(None, feeds)[0])
        builds.append(m.compiles)
    assert builds[2] == builds[1]  # values seen before: nothing built again


def test_explain_data_is_the_structured_form():
    m = bridge.compile_onnx(_with_cumsum())
    data = m.explain_data({"x": (5,)})
    assert data["nodes"] == sum(len(c["ops"]) for c in data["clusters"])
    assert [c["kind"] for c in data["clusters"]].count("host") >= 1
    (entry,) = [e for e in data["not_compiled"] if e["op"] == "MeanVarianceNormalization"]
    assert entry["name"] == "cumsum0" and "MeanVarianceNormalization" in entry["reason"]
    assert data["compiled_nodes"] == data["nodes"] - len(data["not_compiled"])


def test_specializations_are_bounded(monkeypatch):
    import bridge.specializations

    monkeypatch.setattr(bridge.specializations, "MAX_SPECIALIZATIONS", 2)
    m = bridge.compile_onnx(_mlp(), dynamic="off")  # exact shapes: no buckets
    for n in (1, 2, 3, 1):
        m(*_inputs(n))
    assert [dict(k)["x"] for k in m._specs] == [(3, 8), (1, 8)]  # 2 was least recently used


@pytest.mark.parametrize("threads", [0, -1, 1.5, "2"])
def test_bad_threads_option(threads):
    with pytest.raises(bridge.BrazeError, match="threads must be a positive integer"):
        bridge.compile_onnx(_mlp(), threads=threads)


def test_lists_are_accepted_as_inputs_and_checked_like_arrays():
    m = bridge.compile_onnx(_mlp(2))
    x, s = _inputs(2)
    np.testing.assert_allclose(m(x.tolist(), [2.0])[0], m(x, s)[0], rtol=1e-6)
    with pytest.raises(InputError, match="'scale' must have rank 1"):
        m(x, 2.0)
