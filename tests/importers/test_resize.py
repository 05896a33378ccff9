"""Resizing (importers/interpolation.py, onnx_ops/resize.py, fx_resize.py): each axis as
constant-index gathers, weighted and summed; the taps' structure, and the numbers
against onnxruntime (ONNX Resize, Upsample) and eager torch (F.interpolate), compiled
with nothing on the host."""

from __future__ import annotations

import itertools

import numpy as np
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper

import bridge
from importers.interpolation import Interpolation, axis_taps

RNG = np.random.default_rng(0)


def test_taps_per_mode():
    up = 2.0
    nearest = axis_taps(Interpolation("nearest"), 4, 8, up)
    assert (nearest.weights.sum(axis=0) == 1).all() and set(nearest.weights.ravel()) <= {0, 1}
    linear = axis_taps(Interpolation("linear"), 4, 8, up)
    assert linear.indices.shape == (2, 8)
    np.testing.assert_allclose(linear.weights.sum(axis=0), 1)
    cubic = axis_taps(Interpolation("cubic"), 4, 8, up)
    assert cubic.indices.shape == (4, 8) and cubic.indices.min() == 0 and cubic.indices.max() == 3
    wide = axis_taps(Interpolation("linear", antialias=True), 16, 4, 0.25)
    assert wide.indices.shape[0] == 8  # the triangle stretched 4x
    same = axis_taps(Interpolation("linear", coordinates="align_corners"), 5, 5, 1.0)
    assert same.is_identity()
    assert not axis_taps(Interpolation("nearest"), 2, 1, 0.5).is_identity()  # a new length


def _resize_model(attrs: dict, x_shape, scales=None, sizes=None, opset=19, op="Resize"):
    inits, ins = [], ["x"]
    if op == "Resize" and opset >= 11:
        inits.append(numpy_helper.from_array(np.zeros(0, np.float32), "roi"))
        ins.append("roi")
    if scales is not None:
        inits.append(numpy_helper.from_array(np.array(scales, np.float32), "scales"))
        ins.append("scales")
    elif op == "Resize" and opset >= 11:
        ins.append("")
    if sizes is not None:
        inits.append(numpy_helper.from_array(np.array(sizes, np.int64), "sizes"))
        ins.append("sizes")
    node = helper.make_node(op, ins, ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, list(x_shape))], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _against_onnxruntime(model, x_shape, fallback=False):
    x = RNG.standard_normal(x_shape).astype(np.float32)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": x})[0]
    m = bridge.compile_onnx(model, allow_fallback=fallback)
    got = m(x)[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5)
    return m


RESIZES = [
    (mode, coords, extra, given)
    for mode, coords in itertools.product(
        ("nearest", "linear", "cubic"),
        ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
         "half_pixel_symmetric"))
    for extra in ([{}] if mode == "nearest" else [{}, {"antialias": 1}])
    for given in (("scales", [1, 1, 2, 2]), ("scales", [1, 1, 0.5, 0.6]),
                  ("sizes", [1, 3, 7, 13]))
] + [
    ("nearest", "half_pixel", {"nearest_mode": m}, ("scales", [1, 1, 1.7, 3.0]))
    for m in ("round_prefer_ceil", "floor", "ceil")
] + [
    ("cubic", "half_pixel", {"exclude_outside": 1, "cubic_coeff_a": -0.5},
     ("sizes", [1, 3, 9, 4])),
]


@pytest.mark.parametrize("mode,coords,extra,given", RESIZES)
def test_resize_matches_onnxruntime(mode, coords, extra, given):
    attrs = dict(mode=mode, coordinate_transformation_mode=coords, **extra)
    model = _resize_model(attrs, (1, 3, 5, 6), **{given[0]: given[1]})
    _against_onnxruntime(model, (1, 3, 5, 6))


def test_resize_on_some_axes_and_keep_aspect_ratio():
    attrs = dict(mode="linear", axes=[2, 3], keep_aspect_ratio_policy="not_larger")
    _against_onnxruntime(_resize_model(attrs, (1, 2, 6, 8), sizes=[9, 9]), (1, 2, 6, 8))


@pytest.mark.parametrize("op,opset,mode", [("Resize", 10, "nearest"), ("Resize", 10, "linear"),
                                           ("Upsample", 9, "nearest"), ("Upsample", 9, "linear")])
def test_resize_10_and_upsample_match_onnxruntime(op, opset, mode):
    for scales in ([1, 1, 2, 3], [1, 1, 1.5, 2.5]) + (([1, 1, 0.5, 0.75],) if op == "Resize"
                                                      else ()):
        model = _resize_model(dict(mode=mode), (1, 2, 6, 8), scales=scales, opset=opset, op=op)
        _against_onnxruntime(model, (1, 2, 6, 8))


def test_upsample_by_less_than_one_is_refused_as_onnxruntime_refuses_it():
    model = _resize_model(dict(mode="nearest"), (1, 2, 6, 8), scales=[1, 1, 0.5, 1], opset=9,
                          op="Upsample")
    with pytest.raises(bridge.InvalidModelError, match="at least 1"):
        bridge.compile_onnx(model)(np.zeros((1, 2, 6, 8), np.float32))


def test_a_bilinear_upsample_is_two_gathers_per_axis():
    model = _resize_model(dict(mode="linear"), (1, 3, 8, 8), scales=[1, 1, 2, 2])
    m = _against_onnxruntime(model, (1, 3, 8, 8))
    ops = [n.op for n in next(iter(m._specs.values())).plan.graph.nodes]
    assert "not compiled" not in m.explain()
    assert ops.count("gather") == 4


@pytest.mark.parametrize("scales,last_first", [([1, 1, 8, 8], True), ([1, 1, 0.25, 0.25], False)])
def test_the_last_axis_is_gathered_on_the_fewer_elements(scales, last_first):
    # a gather along the last axis reads a computed position per element (no vectors):
    # an upsample gathers it first, on the input's rows; a downsample last, on the output's
    model = _resize_model(dict(mode="linear"), (1, 3, 16, 16), scales=scales)
    m = _against_onnxruntime(model, (1, 3, 16, 16))
    gathers = [n for n in next(iter(m._specs.values())).plan.graph.nodes if n.op == "gather"]
    along_last = [n for n in gathers if n.attrs["axis"] == n.inputs[0].type.rank - 1]
    assert len(along_last) == 2
    rows = along_last[0].outputs[0].shape[2]
    assert rows == (16 if last_first else 4)


def test_a_resize_row_reads_its_taps_as_vectors():
    # the taps' indices and weights are constants, loaded !invariant.load, so LLVM hoists
    # them out of the row loop and widens the rows (a fault word per element and loads it
    # could not prove unclobbered kept a 224x224 upsample scalar: 1.9 ms -> 70 us)
    from compiler import target as targets
    from compiler.codegen import llvm_cpu

    model = _resize_model(dict(mode="linear"), (1, 3, 16, 16), scales=[1, 1, 8, 8])
    m = _against_onnxruntime(model, (1, 3, 16, 16))
    compiled = next(iter(m._specs.values())).parts[0].compiled
    assert "!invariant.load" in str(compiled.llvm_ir)
    asm = llvm_cpu.emit_assembly(compiled.llvm_ir, targets.parse("cpu"))
    last = f"k{len(compiled.kernels) - 1}:"  # the rows' kernel: [1, 3, 128, 128]
    assert compiled.kernels[-1].root.shape == (1, 3, 128, 128)
    body = asm[asm.index(last):]
    body = body[:body.index(".Lfunc_end")]
    assert "mulps" in body  # vector products (a scalar loop stays for the alias-check fallback)


def test_tf_crop_and_resize_stays_on_the_host():
    attrs = dict(mode="linear", coordinate_transformation_mode="tf_crop_and_resize")
    model = _resize_model(attrs, (1, 1, 4, 4), sizes=[1, 1, 3, 3])
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(
        np.array([0, 0, 0.2, 0.2, 1, 1, 0.8, 0.8], np.float32), "roi"))
    m = _against_onnxruntime(model, (1, 1, 4, 4), fallback=True)
    assert "tf_crop_and_resize" in m.explain()


class _Interp(torch.nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.kw = kw

    def forward(self, x):
        return F.interpolate(x, **self.kw) * 2


INTERPOLATIONS = [
    (4, dict(mode=mode, align_corners=ac, **size))
    for size in (dict(size=(13, 21)), dict(scale_factor=2), dict(scale_factor=(0.5, 1.7)),
                 dict(scale_factor=1.05))
    for mode, ac in (("nearest", None), ("nearest-exact", None), ("bilinear", False),
                     ("bilinear", True), ("bicubic", False), ("bicubic", True))
] + [
    (3, dict(mode="linear", scale_factor=3, align_corners=False)),
    (3, dict(mode="nearest", size=11)),
    (5, dict(mode="trilinear", scale_factor=2, align_corners=False)),
    (5, dict(mode="nearest", scale_factor=(1, 2, 2))),
]


@pytest.mark.parametrize("rank,kw", INTERPOLATIONS)
def test_interpolate_through_torch_compile_matches_eager(rank, kw):
    torch._dynamo.reset()
    x = torch.randn(*[1, 3, 7, 9, 5][:rank])
    model = _Interp(**kw)
    with torch.no_grad():
        got = torch.compile(model, backend="braze",
                            options={"allow_fallback": False, "strict": True})(x)
        want = model(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


ANTIALIASED = [
    dict(size=(9, 13)), dict(size=(23, 31)), dict(scale_factor=(0.3, 0.45)),
    dict(size=(11, 13), align_corners=True), dict(size=(32, 40)), dict(size=(12, 29)),
]


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("kw", ANTIALIASED)
def test_antialiased_interpolate_matches_eager(mode, kw):
    """F.interpolate(antialias=True) (aten's _upsample_*2d_aa): down, up, mixed and
    identity axes, scale factors and align_corners, as aten's own taps."""
    torch._dynamo.reset()
    x = torch.randn(2, 3, 32, 40)
    model = _Interp(mode=mode, antialias=True, **kw)
    with torch.no_grad():
        got = torch.compile(model, backend="braze",
                            options={"allow_fallback": False, "strict": True})(x)
        want = model(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_antialiased_resize_wider_than_max_taps_runs_on_torch():
    """A downscale whose footprint needs more than MAX_TAPS taps (bicubic 40 -> 5: 35)
    is a host step, with its reason, and still eager's answer."""
    torch._dynamo.reset()
    x = torch.randn(1, 2, 40, 40)
    model = _Interp(mode="bicubic", antialias=True, size=(5, 5))
    with torch.no_grad():
        got = torch.compile(model, backend="braze", options={"strict": True})(x)
        want = model(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(bridge.BrazeError, match="taps per output"):
        torch._dynamo.reset()
        torch.compile(model, backend="braze",
                      options={"allow_fallback": False, "strict": True})(x)


def test_antialiased_taps_structure():
    """aten's taps: weights summing to 1 per output, within [0, n_in); a downscale by 3
    reads 2 * ceil(3) + 1 = 7 taps at most (bilinear), an upscale 3 (bilinear's 2 and one
    of weight 0); the resize is one gather per tap with some weight, per axis."""
    from importers.fx_resize import _aa_linear, aa_taps

    down = aa_taps(30, 10, False, None, _aa_linear, 2)
    up = aa_taps(10, 30, False, None, _aa_linear, 2)
    for taps, width in ((down, 7), (up, 3)):
        assert taps.indices.shape[0] == width
        np.testing.assert_allclose(taps.weights.sum(axis=0), 1.0)
        assert taps.indices.min() >= 0 and taps.indices.max() < taps.n_in
    from torch.fx.experimental.proxy_tensor import make_fx

    from importers.fx import import_fx

    x = torch.randn(1, 1, 30, 30)
    fn = lambda x: F.interpolate(x, size=(10, 10), mode="bilinear", antialias=True)  # noqa: E731
    g = import_fx(make_fx(fn)(x), [x]).graph
    gathers = [n for n in g.nodes if n.op == "gather"]
    assert 2 * 5 <= len(gathers) <= 2 * 7  # per axis: the taps with some weight
    assert not [n for n in g.nodes if n.op == "host"]
