"""Max pooling with its indices (importers/pool_indices.py) through both importers, and
what uses them (torch's max_unpool and max pooling's backward, ONNX MaxUnpool), average
pooling with divisor_override, ONNX MaxPool over uint8: compiled with nothing on the
host, numbers against eager torch and onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper

import bridge

OPTS = {"allow_fallback": False, "strict": True}
aten = torch.ops.aten


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="braze", dynamic=False, fullgraph=True, options=OPTS)


def _check_torch(fn, *args):
    torch.testing.assert_close(_compiled(fn)(*args), fn(*args), rtol=1e-6, atol=1e-6,
                               equal_nan=True)


# -- torch --------------------------------------------------------------------

@pytest.mark.parametrize("fn,shape", [
    (lambda t: F.max_pool2d(t, 3, 2, 1, return_indices=True), (2, 3, 9, 8)),
    (lambda t: F.max_pool2d(t, (2, 3), (2, 1), (1, 1), dilation=(2, 1), ceil_mode=True,
                            return_indices=True), (1, 2, 9, 7)),
    (lambda t: F.max_pool2d(t, 3, 2, ceil_mode=True, return_indices=True), (1, 2, 8, 8)),
    (lambda t: F.max_pool2d(t, 2, return_indices=True), (3, 6, 6)),  # unbatched
    (lambda t: F.max_pool1d(t, 3, 2, 1, return_indices=True), (2, 3, 10)),
    (lambda t: F.max_pool3d(t, (2, 3, 2), (1, 2, 2), (1, 1, 0), return_indices=True),
     (1, 2, 5, 7, 6)),
    (lambda t: F.adaptive_max_pool2d(t, (3, 4), return_indices=True), (2, 3, 7, 9)),
    (lambda t: F.adaptive_max_pool1d(t, 5, return_indices=True), (2, 3, 8)),
    (lambda t: F.adaptive_max_pool3d(t, (2, 3, 2), return_indices=True), (1, 2, 5, 7, 3)),
])
def test_torch_max_pool_indices(fn, shape):
    torch.manual_seed(0)
    x = torch.randn(shape)
    _check_torch(fn, x)


def test_indices_are_a_select_chain_and_values_alone_keep_max_pool():
    """Structural: with its indices used, elementwise and movement ops only (one select
    pair per tap of a 3x3 window); without, the IR's max_pool as before."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from importers.fx import import_fx

    x = torch.randn(1, 2, 8, 8)

    def ops(fn):
        gm = make_fx(fn)(x)
        gm.graph.eliminate_dead_code()  # (as AOTAutograd's graphs are: no unused getitem)
        return [n.op for n in import_fx(gm, [x]).graph.nodes]

    both = ops(lambda t: F.max_pool2d(t, 3, 2, 1, return_indices=True))
    assert "max_pool" not in both and "host" not in both and both.count("select") == 18
    assert ops(lambda t: F.max_pool2d(t, 3, 2, 1)).count("max_pool") == 1


@pytest.mark.parametrize("fill", [1.0, float("nan"), float("-inf")])
def test_torch_indices_of_ties_nan_and_minus_inf(fill):
    """Ties keep the first maximum; a NaN wins its window (torch's CPU kernel takes the
    last NaN it meets); windows of -inf with padding point at the first real element."""
    x = torch.randn(1, 2, 7, 7)
    x[0, 0, 1:4, 2:5] = fill
    x[0, 1] = fill

    def fn(t):
        return F.max_pool2d(t, 3, 2, 1, return_indices=True)

    _check_torch(fn, x)


def test_max_unpool_of_max_pool_indices():
    def fn(t):
        y, i = F.max_pool2d(t, 2, 2, return_indices=True)
        return F.max_unpool2d(y * 2, i, 2, 2, output_size=t.shape[-2:])

    _check_torch(fn, torch.randn(2, 3, 8, 7))


@pytest.mark.parametrize("k,s,p,ceil", [(3, 2, 1, False), (2, 2, 0, True), (3, 1, 1, True)])
def test_max_pool_backward(k, s, p, ceil):
    x = torch.randn(2, 3, 9, 8)
    y, i = F.max_pool2d(x, k, s, p, ceil_mode=ceil, return_indices=True)
    g = torch.randn_like(y)

    def fn(g, x, i):
        return aten.max_pool2d_with_indices_backward(g, x, [k, k], [s, s], [p, p], [1, 1],
                                                     ceil, i)

    torch.testing.assert_close(_compiled(fn)(g, x, i), fn(g, x, i), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("fn,shape", [
    (lambda t: F.avg_pool2d(t, 3, 2, 1, divisor_override=5), (2, 3, 9, 8)),
    (lambda t: F.avg_pool2d(t, 3, 2, 1, ceil_mode=True, divisor_override=2), (1, 2, 8, 8)),
    (lambda t: F.avg_pool3d(t, 2, 2, divisor_override=3), (1, 2, 4, 6, 5)),
])
def test_torch_avg_pool_divisor_override(fn, shape):
    _check_torch(fn, torch.randn(shape))


# -- ONNX ---------------------------------------------------------------------

def _onnx(node, inputs: dict, outputs: dict, opset=12, initializer=()):
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, t, list(a.shape)) for n, (a, t) in inputs.items()],
        [helper.make_tensor_value_info(n, t, None) for n, t in outputs.items()],
        initializer=list(initializer))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    feeds = {n: a for n, (a, _) in inputs.items()}
    got = bridge.compile_onnx(model, allow_fallback=False)(**feeds)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("shape,attrs", [
    ((2, 3, 7, 6), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ((1, 2, 7, 6), dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1],
                        storage_order=1)),
    ((1, 2, 8, 8), dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    ((1, 2, 8, 7), dict(kernel_shape=[2, 3], strides=[2, 2], auto_pad="SAME_LOWER")),
    ((1, 2, 8, 8), dict(kernel_shape=[2, 2], dilations=[2, 2], pads=[1, 1, 1, 1])),
    ((2, 2, 9), dict(kernel_shape=[3], strides=[2], pads=[1, 1])),
    ((1, 2, 4, 5, 6), dict(kernel_shape=[2, 2, 3], strides=[2, 1, 2], storage_order=1)),
])
def test_onnx_max_pool_indices(shape, attrs):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    x.reshape(-1)[::7] = 0.5  # ties
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], **attrs)
    _onnx(node, {"x": (x, TensorProto.FLOAT)}, {"y": TensorProto.FLOAT, "i": TensorProto.INT64})


@pytest.mark.parametrize("indices", [False, True])
def test_onnx_max_pool_uint8(indices):
    """Pooled as float32 (exact), or through the select chain with its indices."""
    x = np.random.default_rng(0).integers(0, 256, (1, 3, 7, 7)).astype(np.uint8)
    outs = {"y": TensorProto.UINT8, **({"i": TensorProto.INT64} if indices else {})}
    node = helper.make_node("MaxPool", ["x"], list(outs), kernel_shape=[3, 3],
                            pads=[1, 1, 1, 1], strides=[2, 2])
    _onnx(node, {"x": (x, TensorProto.UINT8)}, outs)


@pytest.mark.parametrize("with_shape", [False, True])
def test_onnx_max_unpool(with_shape):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    out = (2, 3, 9, 11) if with_shape else (2, 3, 8, 10)
    plane = out[2] * out[3]
    # distinct positions in each plane (as MaxPool gives), flat over the whole tensor
    idx = np.stack([rng.permutation(plane)[:20] for _ in range(6)]).reshape(x.shape)
    idx = idx + (np.arange(6) * plane).reshape(2, 3, 1, 1)
    names = ["x", "i"] + (["shape"] if with_shape else [])
    node = helper.make_node("MaxUnpool", names, ["y"], kernel_shape=[2, 2], strides=[2, 2])
    inputs = {"x": (x, TensorProto.FLOAT), "i": (idx, TensorProto.INT64)}
    consts = [numpy_helper.from_array(np.array(out, np.int64), "shape")] if with_shape else []
    _onnx(node, inputs, {"y": TensorProto.FLOAT}, initializer=consts)
