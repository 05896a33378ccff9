"""Call-time errors are braze's (issue 16 item 6): a host step that onnxruntime or torch
fails on raises HostOpError naming the node, with the framework's exception as its
cause (torch's class kept); wrong inputs raise InputError. The same models with good
inputs match onnxruntime / torch eager."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import bridge
from bridge import BrazeError, HostOpError, InputError

RNG = np.random.default_rng(0)


def _model(nodes, inits, inputs, name="m") -> onnx.ModelProto:
    g = helper.make_graph(nodes, name, inputs,
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _cumsum(axis: int) -> onnx.ModelProto:
    """relu(cumsum(x, axis)): CumSum runs on onnxruntime (no braze converter)."""
    return _model([helper.make_node("CumSum", ["x", "axis"], ["c"], name="cs"),
                   helper.make_node("Relu", ["c"], ["y"], name="r")],
                  [numpy_helper.from_array(np.array(axis, np.int64), "axis")],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])])


def _gather_nd(index: int) -> onnx.ModelProto:
    return _model([helper.make_node("GatherND", ["x", "i"], ["y"], name="gnd")],
                  [numpy_helper.from_array(np.array([[index]], np.int64), "i")],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])])


def _lstm(hidden: int) -> onnx.ModelProto:
    """An LSTM whose weights are for hidden size 4."""
    w = numpy_helper.from_array(RNG.standard_normal((1, 16, 8)).astype(np.float32), "W")
    r = numpy_helper.from_array(RNG.standard_normal((1, 16, 4)).astype(np.float32), "R")
    return _model([helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=hidden,
                                    name="lstm")], [w, r],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 4, 8])])


def _ort(model, x):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


# (case, bad model, good model, x, words the message must hold)
HOST_FAILURES = [
    ("cumsum_axis", _cumsum(5), _cumsum(1), (4, 8),
     ['CumSum node "cs"', "axis 5 is not in valid range"]),
    ("gather_nd_index", _gather_nd(9), _gather_nd(3), (4, 8),
     ['GatherND node "gnd"', "invalid index", "9"]),
    ("lstm_weights", _lstm(3), _lstm(4), (5, 4, 8), ['LSTM node "lstm"', "Input W"]),
]


@pytest.mark.parametrize("case,bad,good,shape,words", HOST_FAILURES,
                         ids=[c[0] for c in HOST_FAILURES])
def test_onnxruntime_failure_at_call_time_names_the_node(case, bad, good, shape, words, capfd):
    x = RNG.standard_normal(shape).astype(np.float32)
    with pytest.raises(HostOpError) as e:
        bridge.compile_onnx(bad)(x)
    msg = str(e.value)
    assert isinstance(e.value, BrazeError) and "\n" not in msg
    assert msg.startswith("onnxruntime failed running ")
    for w in words:
        assert w in msg, (w, msg)
    assert "onnxruntime_src" not in msg and "[ONNXRuntimeError]" not in msg
    assert type(e.value.__cause__).__module__.startswith("onnxruntime")
    assert "onnxruntime" not in capfd.readouterr().err  # no log lines of its own
    with pytest.raises(Exception) as direct:  # onnxruntime alone fails on the same file
        _ort(bad, x)
    assert not isinstance(direct.value, BrazeError)
    np.testing.assert_allclose(bridge.compile_onnx(good)(x)[0], _ort(good, x),
                               rtol=1e-5, atol=1e-5)


# -- torch host steps --------------------------------------------------------------


def _embedding_renorm(t, i):
    """aten.embedding_renorm (F.embedding's max_norm): a host node; torch raises
    IndexError for an index out of range. (index_copy served here until braze compiled
    scatters at run-time positions.)"""
    return torch.nn.functional.embedding(i, t, max_norm=1.0) + 1


def _embedding_bag(t, i):
    """aten._embedding_bag_forward_only with its bag_size output read: a host node (braze
    compiles the bags' result alone, importers/fx_embedding_bag.py); torch raises
    RuntimeError for an index out of range. (aten.gather, then scatter_add, then plain
    embedding_bag served here until braze compiled them: their out-of-range index is then
    braze's BrazeIndexError, tests/bridge/test_torch_backend.py,
    tests/importers/test_runtime_scatter.py, tests/importers/test_fx_embedding_bag.py.)"""
    offsets = torch.arange(0, i.numel(), i.shape[-1])
    out, _, size, _ = torch.ops.aten._embedding_bag_forward_only(t * 2, i.reshape(-1), offsets)
    return out + size[:, None]


@pytest.mark.parametrize("fn,torch_class,op", [
    (_embedding_renorm, IndexError, "aten.embedding_renorm.default"),
    (_embedding_bag, RuntimeError, "aten._embedding_bag_forward_only.default")])
def test_torch_host_op_failure_keeps_torch_class_and_names_the_node(fn, torch_class, op):
    torch._dynamo.reset()
    t = torch.randn(6, 3)
    good, bad = torch.tensor([[1, 2, 0], [5, 0, 3]]), torch.tensor([[1, 2, 0], [19, 0, 3]])
    strict = torch.compile(fn, backend="braze", options={"strict": True})
    torch.testing.assert_close(strict(t, good), fn(t, good))
    with pytest.raises(torch_class) as e:
        strict(t, bad)
    assert isinstance(e.value, HostOpError) and isinstance(e.value, BrazeError)
    msg = str(e.value)
    assert msg.startswith(f"torch failed running {op} node") and "\n" not in msg
    assert type(e.value.__cause__) is torch_class
    torch._dynamo.reset()
    lenient = torch.compile(fn, backend="braze")  # braze's run fails, eager raises torch's
    torch.testing.assert_close(lenient(t, good), fn(t, good))
    with pytest.raises(torch_class):
        lenient(t, bad)


def test_host_op_error_keeps_only_mixable_classes():
    from compiler.errors import host_op_error

    e = host_op_error("m", UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"), keep_type=True)
    assert type(e) is HostOpError  # its constructor needs more than a message
    e = host_op_error("m", KeyError("k"), keep_type=True)
    assert isinstance(e, KeyError) and isinstance(e, HostOpError)
    assert type(host_op_error("m", KeyError("k"))) is HostOpError


# -- inputs ----------------------------------------------------------------------


def _mlp() -> onnx.ModelProto:
    w = numpy_helper.from_array(RNG.standard_normal((8, 4)).astype(np.float32), "w")
    return _model([helper.make_node("MatMul", ["x", "w"], ["m"]),
                   helper.make_node("Cast", ["k"], ["kf"], to=TensorProto.FLOAT),
                   helper.make_node("Add", ["m", "kf"], ["a"]),
                   helper.make_node("Tanh", ["a"], ["y"])], [w],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8]),
                   helper.make_tensor_value_info("k", TensorProto.INT64, [1])])


MLP = _mlp()


def _mlp_ort(x, k):
    sess = ort.InferenceSession(MLP.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x, "k": k})[0]


X = RNG.standard_normal((3, 8)).astype(np.float32)
K = np.array([1], np.int64)

BAD_INPUTS = [
    ("too_many", (X, K, K), "takes 2 input"),
    ("missing", (X,), "missing input.*'k'"),
    ("rank", (X[0], K), "'x' must have rank 2"),
    ("dim", (X[:, :4], K), "'x' dim 1 must be 8"),
    ("dtype", (X.astype(np.float64), K), "'x' must be float32, got float64"),
    ("object_array", (X.astype(object), K), "'x' must be float32, got object"),
    ("object_list_array", (np.array([[1.0] * 8, "a"], dtype=object), K), "'x' must be float32"),
    ("ragged_list", ([[1.0] * 8, [1.0] * 7], K), "'x' .* is not an array"),
    ("string_list", ([["a"] * 8], K), "'x' must be float32, got list of <U1"),
    ("float_list_for_int", (X, [1.5]), "'k' must be int64, got list of float64"),
    ("tensor_needing_grad", (torch.ones(3, 8, requires_grad=True), K), "'x' .* is not an array"),
    ("none", (X, None), "'k' must be int64, got NoneType of object"),
]


@pytest.mark.parametrize("case,args,words", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_wrong_inputs_raise_input_error(case, args, words):
    m = bridge.compile_onnx(MLP)
    with pytest.raises(InputError, match=words) as e:
        m(*args)
    assert "\n" not in str(e.value)


def test_lists_and_cpu_tensors_convert_within_their_kind():
    m = bridge.compile_onnx(MLP)
    want = _mlp_ort(X, K)
    np.testing.assert_allclose(m(X.tolist(), [1])[0], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m(torch.from_numpy(X), K)[0], want, rtol=1e-5, atol=1e-6)
