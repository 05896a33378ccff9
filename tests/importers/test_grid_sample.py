"""Grid sampling (importers/grid_sample.py, onnx_ops/resize.py's GridSample converter;
torch's grid_sample is tested in tests/bridge/test_torch_backend.py): the structure
(gathers at computed indices, one per corner, and no host step) and the numbers against
onnxruntime, 2-d and 3-d, every mode and padding mode (cubic: 2-d)."""

from __future__ import annotations

import itertools

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import bridge

RNG = np.random.default_rng(0)


def _model(x_shape, grid_shape, opset=20, **attrs):
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape)),
        helper.make_tensor_value_info("grid", TensorProto.FLOAT, list(grid_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


CASES = [(mode, padding, align, dims)
         for mode, padding, align, dims in itertools.product(
             ("linear", "nearest"), ("zeros", "border", "reflection"), (0, 1), (2, 3))]


@pytest.mark.parametrize("mode,padding,align,dims", CASES)
def test_grid_sample_matches_onnxruntime_with_nothing_on_the_host(mode, padding, align,
                                                                  dims):
    x_shape = (2, 3, 5, 7) if dims == 2 else (2, 3, 4, 5, 6)
    grid_shape = (2, 6, 4, dims) if dims == 2 else (2, 3, 4, 2, dims)
    x = RNG.standard_normal(x_shape).astype(np.float32)
    grid = (RNG.random(grid_shape) * 2.8 - 1.4).astype(np.float32)  # past [-1, 1] too
    if mode == "nearest":  # no position exactly half-way (a rounding tie)
        grid = (np.round(grid * 64) / 64 + 1 / 256).astype(np.float32)
    model = _model(x_shape, grid_shape, mode=mode, padding_mode=padding,
                   align_corners=align)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": x, "grid": grid})[0]
    m = bridge.compile_onnx(model, allow_fallback=False)
    got = m(x, grid)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_grid_sample_is_one_gather_per_corner():
    model = _model((1, 2, 6, 6), (1, 3, 3, 2), mode="linear")
    m = bridge.compile_onnx(model, allow_fallback=False)
    m(RNG.standard_normal((1, 2, 6, 6)).astype(np.float32),
      RNG.random((1, 3, 3, 2)).astype(np.float32))
    graph = m.explain()
    assert "compiled by braze" in graph
    spec = next(iter(m._specs.values()))
    ops = [n.op for p in spec.parts if p.compiled is not None for n in p.compiled.graph.nodes]
    assert ops.count("gather") == 4  # 2 x 2 corners


@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_bicubic_grid_sample_matches_onnxruntime(padding, align):
    """GridSample-16's bicubic: 16 gathers (4 x 4 taps), each tap padded on its own."""
    model = _model((2, 3, 5, 6), (2, 4, 3, 2), opset=16, mode="bicubic",
                   padding_mode=padding, align_corners=align)
    x = RNG.standard_normal((2, 3, 5, 6)).astype(np.float32)
    grid = (RNG.random((2, 4, 3, 2)) * 2.8 - 1.4).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=[
        "CPUExecutionProvider"]).run(None, {"x": x, "grid": grid})[0]
    m = bridge.compile_onnx(model, allow_fallback=False)
    np.testing.assert_allclose(m(x, grid)[0], want, rtol=1e-5, atol=2e-5)
    spec = next(iter(m._specs.values()))
    ops = [n.op for p in spec.parts if p.compiled is not None for n in p.compiled.graph.nodes]
    assert ops.count("gather") == 16


def test_cubic_grid_sample_of_a_volume_is_refused_with_its_reason():
    """braze builds cubic sampling in 2-d only (onnxruntime, the host, in 4-d inputs
    only too: it raises at run time, named)."""
    model = _model((1, 2, 3, 4, 4), (1, 2, 2, 2, 3), mode="cubic")
    x = RNG.standard_normal((1, 2, 3, 4, 4)).astype(np.float32)
    grid = (RNG.random((1, 2, 2, 2, 3)) * 2 - 1).astype(np.float32)
    with pytest.raises(Exception, match="2-d only"):
        bridge.compile_onnx(model, allow_fallback=False)(x, grid)
    with pytest.raises(Exception, match="GridSample"):
        bridge.compile_onnx(model)(x, grid)
