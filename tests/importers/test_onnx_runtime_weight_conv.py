"""Conv and ConvTranspose whose weight is a graph input (importers/onnx_ops/nn.py): an
im2col of strided slices and a matmul of two run-time operands, compiled with nothing
on the host; numbers against onnxruntime. A constant weight keeps the packed conv."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import bridge

RNG = np.random.default_rng(0)
TYPES = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE}


def _model(op, x_shape, w_shape, bias, dtype=np.float32, **attrs):
    elem = TYPES[dtype]
    names = ["x", "w"] + (["b"] if bias else [])
    outs = w_shape[1] * attrs.get("group", 1) if op == "ConvTranspose" else w_shape[0]
    shapes = [x_shape, w_shape] + ([(outs,)] if bias else [])
    node = helper.make_node(op, names, ["y"], **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, elem, list(s))
                      for n, s in zip(names, shapes)],
        [helper.make_tensor_value_info("y", elem, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {n: RNG.standard_normal(s).astype(dtype) for n, s in zip(names, shapes)}
    return model, feeds


def _check(model, feeds, rtol=1e-4):
    m = bridge.compile_onnx(model, allow_fallback=False)
    got = m(**feeds)[0]
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max())
    return m


def _spec(m):
    return next(iter(m._specs.values()))


def _ops(m) -> list[str]:
    return [n.op for n in _spec(m).plan.graph.nodes]


def _impls(m) -> list[str]:
    return [k.impl.name for p in _spec(m).parts if p.compiled is not None
            for k in p.compiled.kernels if k.impl is not None]


# (x shape, weight shape, bias, attrs)
CONV_CASES = [
    ((2, 6, 9, 8), (4, 6, 3, 3), True, dict(pads=[1, 0, 2, 1], strides=[2, 1])),
    ((1, 4, 10, 9), (6, 2, 3, 2), True, dict(dilations=[2, 3], group=2, pads=[1, 1, 1, 1])),
    ((1, 6, 7, 7), (6, 1, 3, 3), False, dict(group=6, pads=[1, 1, 1, 1])),  # depthwise
    ((1, 3, 8, 8), (5, 3, 3, 3), True, dict(auto_pad="SAME_UPPER", strides=[2, 2])),
    ((2, 3, 7, 5), (4, 3, 1, 1), True, {}),  # 1x1: the input itself, no slice
    ((2, 3, 11), (4, 3, 3), True, dict(strides=[2], pads=[1, 2], dilations=[2])),  # 1-d
    ((1, 2, 5, 6, 4), (3, 2, 2, 3, 2), True, dict(pads=[1, 0, 1, 0, 1, 1])),  # 3-d
]


@pytest.mark.parametrize("x_shape,w_shape,bias,attrs", CONV_CASES)
def test_conv_with_runtime_weight(x_shape, w_shape, bias, attrs):
    m = _check(*_model("Conv", x_shape, w_shape, bias, **attrs))
    ops = _ops(m)
    assert "conv" not in ops and "host" not in ops and "matmul" in ops


def test_conv_with_runtime_weight_float64():
    """(onnxruntime has no float64 Conv: against torch)"""
    import torch

    model, feeds = _model("Conv", (1, 4, 6, 6), (6, 2, 3, 3), True, np.float64, group=2,
                          pads=[1, 1, 1, 1], strides=[2, 1])
    got = bridge.compile_onnx(model, allow_fallback=False)(**feeds)[0]
    t = {k: torch.from_numpy(v) for k, v in feeds.items()}
    want = torch.nn.functional.conv2d(t["x"], t["w"], t["b"], (2, 1), 1, 1, 2).numpy()
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_float32_conv_runs_on_the_batched_gemm():
    m = _check(*_model("Conv", (1, 8, 12, 12), (16, 8, 3, 3), True, pads=[1, 1, 1, 1]))
    assert "batched_gemm" in _impls(m)


# (x shape, weight shape [C, M/G, K...], bias, attrs)
TRANSPOSE_CASES = [
    ((1, 4, 5, 5), (4, 3, 3, 3), True, dict(strides=[2, 2], pads=[1, 1, 1, 1],
                                            output_padding=[1, 1])),
    ((2, 4, 4, 3), (4, 2, 3, 2), True, dict(strides=[1, 2], pads=[0, 1, 2, 0], group=2,
                                            dilations=[2, 1])),
    ((1, 4, 5, 6), (4, 3, 2, 2), True, dict(strides=[2, 2])),  # non-overlapping
    ((1, 4, 3, 3), (4, 1, 2, 2), False, dict(strides=[2, 2], group=2)),
    ((1, 3, 4, 5), (3, 2, 3, 3), True, dict(strides=[2, 2], output_shape=[10, 12])),
    ((1, 3, 4, 5), (3, 2, 3, 3), False, dict(strides=[2, 2], auto_pad="SAME_UPPER")),
    ((1, 2, 6, 5), (2, 2, 2, 2), False, dict(pads=[2, 1, 2, 2])),  # pads past the reach
    ((2, 4, 7), (4, 3, 3), True, dict(strides=[2], pads=[1, 0], output_padding=[1])),  # 1-d
]


@pytest.mark.parametrize("x_shape,w_shape,bias,attrs", TRANSPOSE_CASES)
def test_conv_transpose_with_runtime_weight(x_shape, w_shape, bias, attrs):
    m = _check(*_model("ConvTranspose", x_shape, w_shape, bias, **attrs))
    ops = _ops(m)
    assert "conv" not in ops and "host" not in ops and "matmul" in ops
    assert _spec(m).values == {}  # not specialized on the weight's value


def test_runtime_bias_with_constant_weight_keeps_the_packed_conv():
    w = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6]),
                      helper.make_tensor_value_info("b", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": RNG.standard_normal((1, 3, 6, 6)).astype(np.float32),
             "b": RNG.standard_normal(4).astype(np.float32)}
    m = _check(model, feeds)
    assert "conv" in _ops(m)


def test_constant_weight_still_uses_the_packed_conv():
    w = RNG.standard_normal((8, 4, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(8).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 9, 9])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m = _check(model, {"x": RNG.standard_normal((1, 4, 9, 9)).astype(np.float32)})
    assert "matmul" not in _ops(m) and "conv" in _ops(m)
    assert "direct_conv" in _impls(m) and "batched_gemm" not in _impls(m)

