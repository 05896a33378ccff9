"""CenterCropPad, LpPool and LpNormalization: converted with nothing on the host (a
slice and a pad; an average pool of |x|^p scaled to a sum; a norm and a select), and
their numbers against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import bridge

RNG = np.random.default_rng(5)


def _run(node, x, opset, inits=()):
    """(braze with allow_fallback=False, onnxruntime) on a one-node model of input x."""
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, x.shape)], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)], list(inits))
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m = bridge.compile_onnx(model, allow_fallback=False)
    got = m(x)[0]
    ops = {n.op for n in next(iter(m._specs.values())).plan.graph.nodes}
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    return got, want, ops


@pytest.mark.parametrize("shape,axes", [((20, 8, 3), None), ((5, 10, 3), [0, 1]),
                                        ((3, 9, 10), [-1, -2])])
def test_center_crop_pad(shape, axes):
    """Crop an odd excess (the extra element left at the end) and pad an odd shortfall
    (the extra zero at the end), per axis."""
    x = RNG.standard_normal(shape).astype(np.float32)
    size = {None: [10, 9, 3], (0, 1): [10, 7], (-1, -2): [7, 12]}[tuple(axes) if axes else None]
    attrs = {} if axes is None else {"axes": axes}
    node = helper.make_node("CenterCropPad", ["x", "s"], ["y"], **attrs)
    got, want, ops = _run(node, x, 18, [numpy_helper.from_array(np.array(size, np.int64), "s")])
    np.testing.assert_array_equal(got, want)
    assert "host" not in ops


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3]},
    {"kernel_shape": [2, 3], "strides": [2, 1], "pads": [1, 0, 0, 1]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [2, 2], "dilations": [2, 2]}])
def test_lp_pool(p, attrs):
    x = RNG.standard_normal((2, 3, 9, 8)).astype(np.float32)
    node = helper.make_node("LpPool", ["x"], ["y"], p=p, **attrs)
    got, want, ops = _run(node, x, 18)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)
    assert "avg_pool" in ops and "host" not in ops


@pytest.mark.parametrize("p,axis", [(1, -1), (2, 0), (2, 1)])
def test_lp_normalization_with_a_zero_slice(p, axis):
    """A slice whose norm is 0 gives 0 there (not 0 / 0)."""
    x = RNG.standard_normal((4, 5)).astype(np.float32)
    x[:, 2] = 0
    x[1] = 0
    node = helper.make_node("LpNormalization", ["x"], ["y"], p=p, axis=axis)
    got, want, ops = _run(node, x, 17)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert not np.isnan(got).any() and "host" not in ops
