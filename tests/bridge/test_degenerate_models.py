"""Valid models at the edges that onnxruntime runs (issue 16, items 4 and 5): dims of
size 0 (an empty batch), an empty contraction (K = 0), a long chain of elementwise ops,
names that are not valid UTF-8. braze must give onnxruntime's outputs: shapes, dtypes
and values (empty arrays included), never an internal error."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import bridge
from bridge.cli import main
from importers.onnx_load import text_strings

V = helper.make_tensor_value_info
RNG = np.random.default_rng(0)


def _f(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _init(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(array, name)


def _model(nodes, inputs, inits=(), outputs=None) -> onnx.ModelProto:
    outputs = outputs or [nodes[-1].output[0]]
    graph = helper.make_graph(nodes, "g", inputs,
                              [helper.make_empty_tensor_value_info(o) for o in outputs],
                              list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _check(model, feeds: dict, **options) -> list[np.ndarray]:
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    got = bridge.compile_onnx(model, allow_fallback=False, **options)(**feeds)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    return got


def _node(op, ins, out, **attrs):
    return helper.make_node(op, ins, [out], **attrs)


# (id, nodes, graph inputs with their feeds, initializers): every one has a dim of size 0
EMPTY = [
    ("matmul_relu", [_node("MatMul", ["x", "w"], "m"), _node("Relu", ["m"], "y")],
     {"x": _f(0, 8)}, [_init("w", _f(8, 4))]),
    ("gemm_bias_weights_as_inputs", [_node("Gemm", ["x", "w", "b"], "y", transB=1)],
     {"x": _f(0, 8), "w": _f(4, 8), "b": _f(4)}, []),
    ("gemm_no_columns", [_node("Gemm", ["x", "w"], "y")], {"x": _f(2, 8)},
     [_init("w", _f(8, 0))]),
    ("conv_relu", [_node("Conv", ["x", "w"], "c", pads=[1] * 4), _node("Relu", ["c"], "y")],
     {"x": _f(0, 3, 8, 8)}, [_init("w", _f(4, 3, 3, 3))]),
    ("winograd_conv", [_node("Conv", ["x", "w"], "y", pads=[1] * 4)],
     {"x": _f(0, 16, 8, 8)}, [_init("w", _f(32, 16, 3, 3))]),
    ("pointwise_conv_bias", [_node("Conv", ["x", "w", "b"], "y")], {"x": _f(0, 16, 4, 4)},
     [_init("w", _f(8, 16, 1, 1)), _init("b", _f(8))]),
    ("max_pool", [_node("MaxPool", ["x"], "y", kernel_shape=[2, 2], strides=[2, 2])],
     {"x": _f(0, 3, 8, 8)}, []),
    ("global_average_pool", [_node("GlobalAveragePool", ["x"], "y")],
     {"x": _f(0, 3, 8, 8)}, []),
    ("softmax", [_node("Softmax", ["x"], "y", axis=-1)], {"x": _f(0, 8)}, []),
    ("softmax_over_empty_axis", [_node("Softmax", ["x"], "y", axis=0)], {"x": _f(3, 0)}, []),
    ("layer_norm", [_node("LayerNormalization", ["x", "g", "b"], "y", axis=-1)],
     {"x": _f(0, 8)}, [_init("g", _f(8)), _init("b", _f(8))]),
    ("reduce_sum_over_empty_axis", [_node("ReduceSum", ["x", "ax"], "y", keepdims=0)],
     {"x": _f(3, 0)}, [_init("ax", np.array([1], np.int64))]),
    ("argmax", [_node("ArgMax", ["x"], "y", axis=1)], {"x": _f(0, 8)}, []),
    ("concat_with_empty", [_node("Concat", ["x", "z"], "y", axis=0)],
     {"x": _f(0, 8), "z": _f(2, 8)}, []),
    ("transpose_exp", [_node("Transpose", ["x"], "t", perm=[1, 0]), _node("Exp", ["t"], "y")],
     {"x": _f(0, 8)}, []),
    ("gather_no_indices", [_node("Gather", ["d", "i"], "y")],
     {"i": np.zeros(0, np.int64)}, [_init("d", _f(10, 4))]),
    ("int_add", [_node("Add", ["x", "x"], "y")], {"x": np.zeros((0, 3), np.int32)}, []),
]


def _graph_inputs(feeds: dict) -> list:
    dtype = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int64): TensorProto.INT64,
             np.dtype(np.int32): TensorProto.INT32}
    return [V(k, dtype[a.dtype], list(a.shape)) for k, a in feeds.items()]


@pytest.mark.parametrize("nodes, feeds, inits", [c[1:] for c in EMPTY],
                         ids=[c[0] for c in EMPTY])
def test_empty_dims_give_onnxruntimes_outputs(nodes, feeds, inits):
    """A Gemm, MatMul or Conv on an empty batch raised ZeroDivisionError in
    gemm.tile_rows: a kernel with an empty root now has no work items."""
    _check(_model(nodes, _graph_inputs(feeds), inits), feeds)


@pytest.mark.parametrize("threads", [1, 2])
def test_symbolic_batch_fed_zero_rows_then_some(threads):
    nodes = [_node("MatMul", ["x", "w"], "m"), _node("Relu", ["m"], "y")]
    model = _model(nodes, [V("x", TensorProto.FLOAT, ["N", 8])], [_init("w", _f(8, 40))])
    for rows in (0, 3, 0):
        _check(model, {"x": _f(rows, 8)}, threads=threads)


def test_cli_compiles_and_runs_an_empty_batch(tmp_path, capsys):
    nodes = [_node("MatMul", ["x", "w"], "m"), _node("Relu", ["m"], "y")]
    path, art, x = tmp_path / "mm.onnx", tmp_path / "mm.braze", tmp_path / "x.npy"
    onnx.save(_model(nodes, [V("x", TensorProto.FLOAT, ["N", 8])], [_init("w", _f(8, 4))]),
              path)
    np.save(x, np.zeros((0, 8), np.float32))
    assert main(["compile", str(path), "--shape", "x=0,8", "-o", str(art)]) == 0
    assert main(["run", str(art), "--input", f"x={x}", "--output-dir", str(tmp_path)]) == 0
    assert np.load(tmp_path / "y.npy").shape == (0, 4)


# (id, nodes, feeds, initializers): a matmul whose contraction has no terms
EMPTY_CONTRACTION = [
    ("matmul_constant_weight", [_node("MatMul", ["x", "w"], "y")], {"x": _f(2, 0)},
     [_init("w", _f(0, 3))]),
    ("gemm_bias_relu", [_node("Gemm", ["x", "w", "b"], "g"), _node("Relu", ["g"], "y")],
     {"x": _f(2, 0)}, [_init("w", _f(0, 40)), _init("b", _f(40))]),
    ("batched_sigmoid", [_node("MatMul", ["x", "w"], "m"), _node("Sigmoid", ["m"], "y")],
     {"x": _f(3, 2, 0)}, [_init("w", _f(0, 5))]),
    ("weights_as_input", [_node("MatMul", ["x", "w"], "y")], {"x": _f(2, 0), "w": _f(0, 3)},
     []),
    ("vectors", [_node("MatMul", ["x", "w"], "y")], {"x": _f(0)}, [_init("w", _f(0))]),
]


@pytest.mark.parametrize("nodes, feeds, inits", [c[1:] for c in EMPTY_CONTRACTION],
                         ids=[c[0] for c in EMPTY_CONTRACTION])
def test_empty_contraction_is_the_epilogue_of_zero(nodes, feeds, inits):
    """x[2, 0] @ w[0, 3] is zeros (the packed GEMM returned NaN); with a bias and ReLU,
    relu(bias) in every row."""
    got = _check(_model(nodes, _graph_inputs(feeds), inits), feeds)
    assert np.isfinite(got[0]).all()


def test_conv_of_no_input_channels_is_its_bias_on_the_host():
    """A conv with no input channels is an empty contraction whose result is the bias:
    braze's kernels do not take it (the direct conv summed garbage), onnxruntime does."""
    nodes = [_node("Conv", ["x", "w", "b"], "c", pads=[1] * 4), _node("Relu", ["c"], "y")]
    inits = [_init("w", np.zeros((40, 0, 3, 3), np.float32)), _init("b", _f(40))]
    model = _model(nodes, [V("x", TensorProto.FLOAT, [1, 0, 8, 8])], inits)
    feeds = {"x": _f(1, 0, 8, 8)}
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    m = bridge.compile_onnx(model)
    np.testing.assert_allclose(m(**feeds)[0], want, rtol=1e-6)
    assert "empty contraction" in m.explain()


@pytest.mark.parametrize("n", [400, 2000])
def test_long_elementwise_chain_matches_onnxruntime(n):
    """350 or more elementwise nodes raised RecursionError in the fusion walk."""
    ops = ["Add", "Mul", "Sin"]
    nodes = [_node(ops[i % 3], [f"t{i}", "s"] if i % 3 < 2 else [f"t{i}"], f"t{i + 1}")
             for i in range(n)]
    x = _f(4, 8)
    feeds = {"t0": x, "s": x * np.float32(0.1)}
    _check(_model(nodes, _graph_inputs(feeds)), feeds)


def _with_invalid_utf8(model: onnx.ModelProto, name: bytes, bad: bytes) -> bytes:
    """`model`'s bytes with every one-byte string `name` (node and value names) made
    `bad`, a byte that is not UTF-8 (helper.make_* refuses such names)."""
    raw = model.SerializeToString()
    for tag in (b"\x0a", b"\x12", b"\x1a"):  # value info name, node output, node name
        raw = raw.replace(tag + b"\x01" + name, tag + b"\x01" + bad)
    return raw


@pytest.mark.parametrize("name", [b"n", b"y"], ids=["node_name", "value_name"])
def test_names_that_are_not_utf8_compile_and_run(name):
    """Protobuf returns such strings as bytes: a node name raised TypeError from the cache
    key's JSON, a value name from the IR printer. onnxruntime runs the model."""
    model = _model([helper.make_node("Relu", ["x"], ["y"], name="n"),
                    helper.make_node("Neg", ["y"], ["z"], name="m")],
                   [V("x", TensorProto.FLOAT, [2, 3])])
    raw = _with_invalid_utf8(model, name, b"\xfe")
    parsed = onnx.ModelProto()
    parsed.ParseFromString(raw)
    assert any(isinstance(s, bytes) for n in parsed.graph.node for s in [n.name, *n.output])
    x = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    want = ort.InferenceSession(raw, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for source in (raw, parsed):
        np.testing.assert_array_equal(bridge.compile_onnx(source)(x)[0], want[0])
    assert any(isinstance(s, bytes) for n in parsed.graph.node for s in [n.name, *n.output])


def test_text_strings_copies_only_when_needed():
    model = _model([helper.make_node("Relu", ["x"], ["y"], name="n")],
                   [V("x", TensorProto.FLOAT, [2])])
    assert text_strings(model) is model
    parsed = onnx.ModelProto()
    parsed.ParseFromString(_with_invalid_utf8(model, b"n", b"\xff"))
    fixed = text_strings(parsed)
    assert fixed is not parsed and fixed.graph.node[0].name == "\\xff"
    assert parsed.graph.node[0].name == b"\xff"
