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


def test_lrn_of_even_size_and_other_ranks_follows_the_spec():
    # onnxruntime takes only odd sizes on 4-d inputs; the spec's formula, in float64
    size, shape = 4, (1, 7, 9)
    model, x = _model(size, shape)
    sq = np.pad(x.astype(np.float64) ** 2, ((0, 0), (1, 2), (0, 0)))
    window = sum(sq[:, j:j + shape[1]] for j in range(size))
    want = x / (1.5 + 2e-3 / size * window) ** 0.6
    got = bridge.compile_onnx(model, allow_fallback=False)(x)[0]
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
