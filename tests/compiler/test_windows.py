"""1-d and 3-d windows lowered to 2-d ones (compiler/passes/windows.py): what the
graph becomes (no 3-d window left, volumes channels-last between windows), and the
numbers against torch in float64 through both front ends, with nothing on the host."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import bridge
from compiler import driver
from compiler.passes.windows import lower_windows
from compiler.text import parse_graph

RNG = np.random.default_rng(0)

VIDEO = """
graph video(%x: f32[1,4,5,6,6]) -> (%y) {
  %w1 = const() {value=@w1} : f32[8,4,3,3,3]
  %w2 = const() {value=@w2} : f32[8,8,3,1,1]
  %zero = const() {value=dense<f32[]: [0.0]>} : f32[]
  %c1 = conv(%x, %w1) {strides=[1, 1, 1], pads=[1, 1, 1, 1, 1, 1], dilations=[1, 1, 1], group=1} : f32[1,8,5,6,6]
  %r1 = max(%c1, %zero) : f32[1,8,5,6,6]
  %c2 = conv(%r1, %w2) {strides=[2, 1, 1], pads=[1, 0, 0, 1, 0, 0], dilations=[1, 1, 1], group=1} : f32[1,8,3,6,6]
  %r2 = max(%c2, %zero) : f32[1,8,3,6,6]
  %m = reduce_sum(%r2) {axes=[2, 3, 4], keepdims=true} : f32[1,8,1,1,1]
  %y = reshape(%m) {shape=[1, 8]} : f32[1,8]
}
"""


def _video():
    w1 = RNG.standard_normal((8, 4, 3, 3, 3)).astype(np.float32)
    w2 = RNG.standard_normal((8, 8, 3, 1, 1)).astype(np.float32)
    return parse_graph(VIDEO, {"w1": w1, "w2": w2})


def test_3d_convs_become_2d_ones_and_volumes_stay_channels_last():
    g = _video()
    driver.optimize(g, "cpu")
    convs = [n for n in g.nodes if n.op == "conv"]
    assert len(convs) == 2 and all(len(n.inputs[0].shape) == 4 for n in convs)
    assert all(n.attrs["layout"] == "NHWC" for n in convs)
    # the image enters channels-last once; between the two convs nothing is transposed
    # (the rank-5 transposes cancel), and the pooled features leave as a reshape
    assert sum(n.op == "transpose" for n in g.nodes) == 1
    assert all(c.compiled for c in driver.cut(g, "cpu").clusters)


def test_the_cuda_target_keeps_3d_windows():
    g = _video()
    assert not lower_windows(g, "cuda")
    assert sum(n.op == "conv" and len(n.inputs[0].shape) == 5 for n in g.nodes) == 2


def _onnx_model(op: str, x_shape, attrs: dict, w=None, b=None) -> onnx.ModelProto:
    inits, names = [], ["x"]
    for name, arr in (("w", w), ("b", b)):
        if arr is not None:
            inits.append(numpy_helper.from_array(arr, name))
            names.append(name)
    node = helper.make_node(op, names, ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, list(x_shape))], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _braze(model, x):
    m = bridge.compile_onnx(model, allow_fallback=False, threads=1)
    return m(x)[0]


def _close(y, want, terms: int):
    atol = 4e-7 * np.sqrt(terms) * np.abs(want).max() + 1e-6
    np.testing.assert_allclose(y, want, rtol=0, atol=atol)


# (x, out channels, kernel, strides, pads (d0, h0, w0, d1, h1, w1), dilations, group, bias)
CONV3D = [
    ((1, 4, 5, 7, 6), 8, (3, 3, 3), (1, 1, 1), (1, 1, 1, 1, 1, 1), (1, 1, 1), 1, True),
    ((2, 3, 6, 6, 6), 5, (3, 3, 3), (2, 2, 2), (1, 0, 1, 0, 1, 0), (1, 1, 1), 1, False),
    ((1, 8, 4, 6, 5), 6, (1, 3, 3), (1, 2, 1), (0, 1, 1, 0, 1, 1), (1, 1, 1), 1, True),
    ((1, 8, 6, 4, 4), 8, (3, 1, 1), (1, 1, 1), (1, 0, 0, 1, 0, 0), (1, 1, 1), 1, True),
    ((1, 8, 7, 5, 5), 8, (3, 3, 3), (1, 1, 1), (2, 1, 1, 2, 1, 1), (2, 1, 1), 2, True),
    ((1, 16, 5, 6, 6), 16, (3, 3, 3), (1, 2, 2), (1, 1, 1, 1, 1, 1), (1, 1, 1), 16, False),
    ((1, 3, 4, 9, 9), 4, (2, 5, 5), (2, 1, 1), (0, 2, 2, 1, 2, 2), (1, 2, 1), 1, True),
]


@pytest.mark.parametrize("x_shape,cout,k,strides,pads,dil,group,bias", CONV3D)
def test_conv3d_matches_torch(x_shape, cout, k, strides, pads, dil, group, bias):
    x = RNG.standard_normal(x_shape).astype(np.float32)
    w = RNG.standard_normal((cout, x_shape[1] // group) + k).astype(np.float32)
    b = RNG.standard_normal(cout).astype(np.float32) if bias else None
    attrs = dict(kernel_shape=list(k), strides=list(strides), pads=list(pads),
                 dilations=list(dil), group=group)
    y = _braze(_onnx_model("Conv", x_shape, attrs, w, b), x)
    xt = torch.nn.functional.pad(torch.from_numpy(x).double(),
                                 (pads[2], pads[5], pads[1], pads[4], pads[0], pads[3]))
    want = torch.nn.functional.conv3d(xt, torch.from_numpy(w).double(),
                                      None if b is None else torch.from_numpy(b).double(),
                                      stride=strides, dilation=dil, groups=group).numpy()
    _close(y, want, int(np.prod(w.shape[1:])))


# (x, kernel, strides, pads, dilations, ceil_mode)
POOL3D = [
    ((1, 4, 5, 8, 8), (3, 3, 3), (2, 2, 2), (1, 1, 1, 1, 1, 1), (1, 1, 1), 0),
    ((1, 3, 6, 7, 7), (2, 2, 2), (2, 2, 2), (0, 0, 0, 0, 0, 0), (1, 1, 1), 1),
    ((2, 2, 4, 5, 6), (1, 3, 3), (1, 2, 2), (0, 1, 1, 0, 1, 1), (1, 1, 1), 0),
    ((1, 2, 7, 6, 6), (3, 2, 2), (1, 1, 1), (0, 0, 0, 0, 0, 0), (2, 1, 1), 0),
]


@pytest.mark.parametrize("x_shape,k,strides,pads,dil,ceil", POOL3D)
def test_max_pool3d_matches_torch(x_shape, k, strides, pads, dil, ceil):
    x = RNG.standard_normal(x_shape).astype(np.float32)
    attrs = dict(kernel_shape=list(k), strides=list(strides), pads=list(pads),
                 dilations=list(dil), ceil_mode=ceil)
    y = _braze(_onnx_model("MaxPool", x_shape, attrs), x)
    want = torch.nn.functional.max_pool3d(torch.from_numpy(x), k, strides, pads[:3], dil,
                                          ceil_mode=bool(ceil)).numpy()
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("k,stride,pads,dil", [(3, 1, (1, 1), 1), (5, 2, (2, 1), 2),
                                               (1, 1, (0, 0), 1)])
def test_conv1d_with_one_group_matches_torch(k, stride, pads, dil):
    x = RNG.standard_normal((2, 6, 17)).astype(np.float32)
    w = RNG.standard_normal((10, 6, k)).astype(np.float32)
    b = RNG.standard_normal(10).astype(np.float32)
    attrs = dict(kernel_shape=[k], strides=[stride], pads=list(pads), dilations=[dil])
    y = _braze(_onnx_model("Conv", x.shape, attrs, w, b), x)
    xt = torch.nn.functional.pad(torch.from_numpy(x).double(), pads)
    want = torch.nn.functional.conv1d(xt, torch.from_numpy(w).double(),
                                      torch.from_numpy(b).double(), stride=stride,
                                      dilation=dil).numpy()
    _close(y, want, 6 * k)


class _Video(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv3d(3, 8, (3, 3, 3), padding=1, stride=(1, 2, 2))
        self.bn = torch.nn.BatchNorm3d(8)
        self.pool = torch.nn.MaxPool3d((1, 2, 2))
        self.b = torch.nn.Conv3d(8, 8, (3, 1, 1), padding=(1, 0, 0), groups=2)

    def forward(self, x):
        y = self.pool(torch.relu(self.bn(self.a(x))))
        return self.b(y).mean((2, 3, 4))


def test_a_video_block_through_torch_compile_runs_compiled():
    torch.manual_seed(0)
    model = _Video().eval()
    x = torch.randn(1, 3, 6, 12, 12)
    with torch.no_grad():
        want = model(x)
        got = torch.compile(model, backend="braze",
                            options={"allow_fallback": False, "strict": True})(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pads,include", [((0, 1, 1, 0, 1, 1), 0), ((1, 1, 1, 1, 1, 1), 1),
                                          ((0, 0, 0, 0, 0, 0), 0)])
def test_avg_pool3d_matches_torch(pads, include):
    x = RNG.standard_normal((1, 3, 6, 7, 7)).astype(np.float32)
    attrs = dict(kernel_shape=[3, 3, 3], strides=[1, 2, 2], pads=list(pads),
                 count_include_pad=include)
    y = _braze(_onnx_model("AveragePool", x.shape, attrs), x)
    want = torch.nn.functional.avg_pool3d(torch.from_numpy(x).double(), 3, (1, 2, 2),
                                          pads[:3], count_include_pad=bool(include)).numpy()
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)


def test_a_depth_padded_average_without_the_padding_compiles_rescaled():
    # the padding-counted average times (window size) / (its elements in the image)
    x_shape = (1, 3, 6, 7, 7)
    attrs = dict(kernel_shape=[3, 3, 3], pads=[1, 1, 1, 1, 1, 1], count_include_pad=0)
    m = bridge.compile_onnx(_onnx_model("AveragePool", x_shape, attrs), allow_fallback=False)
    x = RNG.standard_normal(x_shape).astype(np.float32)
    got = m(x)[0]
    assert "17 of 17 nodes compiled by braze" in m.explain()
    want = torch.nn.functional.avg_pool3d(torch.from_numpy(x).double(), 3, 1, 1,
                                          count_include_pad=False).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("x_shape,kernel,strides,pads", [
    ((1, 2, 9), [2], [2], [0, 0]),                     # Funnel's pooling: 9 -> 5
    ((1, 2, 7, 8), [3, 2], [2, 3], [1, 1, 1, 0]),
    ((1, 2, 5, 6, 7), [2, 3, 2], [2, 2, 2], [1, 0, 1, 1, 0, 1]),
])
def test_a_ceil_mode_average_counting_its_pads_compiles(x_shape, kernel, strides, pads):
    # the divisor counts the declared pads, not the end padding ceil_mode adds
    attrs = dict(kernel_shape=kernel, strides=strides, pads=pads, ceil_mode=1,
                 count_include_pad=1)
    model = _onnx_model("AveragePool", x_shape, attrs)
    x = RNG.standard_normal(x_shape).astype(np.float32)
    import onnxruntime as ort

    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = _braze(model, x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_pool1d_matches_torch(op):
    x = RNG.standard_normal((2, 5, 19)).astype(np.float32)
    attrs = dict(kernel_shape=[3], strides=[2], pads=[1, 1])
    y = _braze(_onnx_model(op, x.shape, attrs), x)
    f = torch.nn.functional.max_pool1d if op == "MaxPool" else \
        lambda t, *a: torch.nn.functional.avg_pool1d(t, *a, count_include_pad=False)
    want = f(torch.from_numpy(x).double(), 3, 2, 1).numpy()
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dil,pad,size", [(24, 24, 14), (12, 12, 14), (36, 36, 14), (6, 6, 9)])
def test_taps_that_read_only_padding_are_dropped(dil, pad, size):
    # DeepLab's ASPP: a 3x3 conv at dilation 24 on a 14 x 14 map reads only its centre
    x = RNG.standard_normal((1, 8, size, size)).astype(np.float32)
    w = RNG.standard_normal((6, 8, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(6).astype(np.float32)
    attrs = dict(kernel_shape=[3, 3], pads=[pad] * 4, dilations=[dil, dil])
    m = bridge.compile_onnx(_onnx_model("Conv", x.shape, attrs, w, b), allow_fallback=False)
    got = m(x)[0]
    conv = next(n for n in next(iter(m._specs.values())).plan.graph.nodes if n.op == "conv")
    if dil >= size:
        assert conv.inputs[1].shape[2:] == (1, 1)  # only the centre tap left
    want = torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(),
                                      torch.from_numpy(b).double(), padding=pad,
                                      dilation=dil).numpy()
    _close(got, want, 8 * 9)


def _dilated_conv(x, w, b, pad, dil):
    """A 3x3 ONNX Conv compiled with nothing on the host: (its output, its
    specialization, torch's float64 conv2d)."""
    attrs = dict(kernel_shape=[3, 3], pads=[pad[0], pad[1], pad[0], pad[1]], dilations=list(dil))
    m = bridge.compile_onnx(_onnx_model("Conv", x.shape, attrs, w, b), allow_fallback=False)
    got = m(x)[0]
    want = torch.nn.functional.conv2d(
        torch.from_numpy(x).double(), torch.from_numpy(w).double(),
        None if b is None else torch.from_numpy(b).double(), padding=pad, dilation=dil).numpy()
    return got, next(iter(m._specs.values())), want


@pytest.mark.parametrize("size,dil,pad,bias", [
    ((14, 14), (12, 12), (12, 12), True),  # DeepLab's ASPP branch at rate 12 on 14 x 14
    ((9, 11), (6, 4), (6, 4), False),      # rectangular, unequal dilations
    ((5, 7), (3, 5), (2, 5), True),        # pads smaller than the dilation
])
def test_a_dilated_conv_mostly_over_padding_runs_as_one_1x1_conv_per_tap(size, dil, pad, bias):
    x = RNG.standard_normal((1, 8) + size).astype(np.float32)
    w = RNG.standard_normal((6, 8, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(6).astype(np.float32) if bias else None
    got, spec, want = _dilated_conv(x, w, b, pad, dil)
    convs = [n for n in spec.plan.graph.nodes if n.op == "conv"]
    assert len(convs) > 1 and all(n.inputs[1].shape[2:] == (1, 1) for n in convs)
    _close(got, want, 8 * 9)


def test_a_dilated_conv_that_mostly_reads_the_image_stays_one_conv():
    from compiler.passes.windows import split_taps

    x = RNG.standard_normal((1, 8, 28, 28)).astype(np.float32)
    w = RNG.standard_normal((6, 8, 3, 3)).astype(np.float32)
    got, spec, want = _dilated_conv(x, w, None, (2, 2), (2, 2))
    convs = [n for n in spec.plan.graph.nodes if n.op == "conv"]
    assert len(convs) == 1 and convs[0].inputs[1].shape[2:] == (3, 3)
    g = parse_graph("""
graph g(%x: f32[1,8,14,14]) -> (%y) {
  %w = const() {value=@w} : f32[6,8,3,3]
  %y = conv(%x, %w) {strides=[2, 2], pads=[12, 12, 12, 12], dilations=[12, 12], group=1} : f32[1,6,7,7]
}
""", {"w": w})
    assert not split_taps(g, g.nodes[-1])  # strided: left to the kernel
    _close(got, want, 8 * 9)


@pytest.mark.parametrize("size,dil,bias", [
    ((28, 28), (4, 4), True),   # a dilated ResNet's last stage (DeepLab, FCN)
    ((30, 29), (2, 3), False),  # sides not whole phases, unequal dilations
])
def test_a_dilated_3x3_conv_runs_undilated_over_its_phases(size, dil, bias):
    # space-to-batch: an undilated conv over the dy x dx phases, on Winograd's kernel
    x = RNG.standard_normal((1, 16) + size).astype(np.float32)
    w = RNG.standard_normal((32, 16, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(32).astype(np.float32) if bias else None
    got, spec, want = _dilated_conv(x, w, b, dil, dil)
    conv = next(n for n in spec.plan.graph.nodes if n.op == "conv")
    assert tuple(conv.attrs["dilations"]) == (1, 1)
    assert conv.inputs[0].shape[0] == dil[0] * dil[1]  # the phases, in the batch
    kernels = spec.parts[0].compiled.kernels
    assert any(k.impl is not None and k.impl.name == "winograd" for k in kernels)
    _close(got, want, 16 * 9 * 4)  # Winograd's transforms: a few times a direct sum's rounding


def test_a_dilated_conv_with_phases_too_small_for_winograd_stays_dilated():
    x = RNG.standard_normal((1, 16, 14, 14)).astype(np.float32)
    w = RNG.standard_normal((32, 16, 3, 3)).astype(np.float32)
    # 14 x 14 at dilation 4: 4 x 4 phases, below Winograd's smallest side
    got, spec, want = _dilated_conv(x, w, None, (4, 4), (4, 4))
    conv = next(n for n in spec.plan.graph.nodes if n.op == "conv")
    assert conv.inputs[0].shape[0] == 1
    _close(got, want, 16 * 9)


@pytest.mark.parametrize("strides,pads,dil,group", [
    ((1, 1, 1), (1, 0, 0, 1, 0, 0), (1, 1, 1), 1),   # R(2+1)D's temporal conv
    ((2, 1, 1), (0, 0, 0, 1, 0, 0), (2, 1, 1), 2),
])
def test_a_temporal_conv_reads_its_depth_taps_in_place(strides, pads, dil, group):
    # KD x 1 x 1: a 2-d KD x 1 conv over N, C, D, H*W, no KD-fold copy of the input
    x = RNG.standard_normal((1, 8, 6, 5, 7)).astype(np.float32)
    w = RNG.standard_normal((16, 8 // group, 3, 1, 1)).astype(np.float32)
    attrs = dict(kernel_shape=[3, 1, 1], strides=list(strides), pads=list(pads),
                 dilations=list(dil), group=group)
    m = bridge.compile_onnx(_onnx_model("Conv", x.shape, attrs, w), allow_fallback=False)
    got = m(x)[0]
    nodes = next(iter(m._specs.values())).plan.graph.nodes
    assert not any(n.op == "concat" for n in nodes)
    conv = next(n for n in nodes if n.op == "conv")
    assert conv.inputs[1].shape[2:] == (3, 1)
    xp = torch.nn.functional.pad(torch.from_numpy(x).double(), (0, 0, 0, 0, pads[0], pads[3]))
    want = torch.nn.functional.conv3d(xp, torch.from_numpy(w).double(), stride=strides,
                                      dilation=dil, groups=group).numpy()
    _close(got, want, 8 * 3)
