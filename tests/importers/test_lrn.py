"""ONNX LRN (importers/onnx_ops/normalization.py): squares summed over a channel window
by shifted slices, compiled, against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import bridge


def _model(size, shape):
    node = helper.make_node("LRN", ["x"], ["y"], size=size, alpha=2e-3, beta=0.6, bias=1.5)
    model = helper.make_model(helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
        opset_imports=[helper.make_opsetid("", 13)])
    return model, (np.random.default_rng(0).standard_normal(shape) * 5).astype(np.float32)


@pytest.mark.parametrize("size,shape", [(5, (1, 12, 6, 6)), (3, (2, 3, 4, 4)),
                                        (1, (1, 4, 3, 3))])
def test_lrn_matches_onnxruntime(size, shape):
    model, x = _model(size, shape)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = bridge.compile_onnx(model, allow_fallback=False)(x)[0]
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("size,shape", [(4, (1, 7, 9, 3)), (3, (1, 7, 9)), (0, (1, 3, 2, 2))])
def test_lrn_onnxruntime_refuses_is_refused(size, shape):
    model, x = _model(size, shape)
    with pytest.raises(bridge.InvalidModelError, match="LRN of size"):
        bridge.compile_onnx(model)(x)
