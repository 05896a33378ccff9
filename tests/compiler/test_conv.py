"""braze's channels-last conv (compiler/kernels/conv.py) and pooling: which nodes take
them, and their numbers against torch (float64) for strides, padding, dilation and
tiles that do not divide the shapes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from compiler.codegen import compile_graph, supports
from compiler.codegen.compiled import PACKED
from compiler.kernels import gemm
from compiler.target import host
from compiler.text import parse_graph
from runtime.cpu import CpuStep


@pytest.fixture(autouse=True)
def _winograd_on_small_images(monkeypatch):
    """These tests run Winograd's kernel on small images, which the choice would give the
    direct kernel (fewer than winograd.MIN_TILES tiles): the threshold is 1 here, except
    in test_winograd_needs_enough_tiles, which checks the real one."""
    from compiler.kernels import winograd

    monkeypatch.setattr(winograd, "MIN_TILES", 1)


AVX512 = gemm.Tile(vec=16, nv=2, mr=12)  # the tile the measured choices below were made on


def _conv_graph(x_shape, w, bias, strides, pads, dilations, group=1, layout="NHWC"):
    n, h, wd, cin = x_shape
    cout, _, kh, kw = w.shape
    oh = (h + pads[0] + pads[2] - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (wd + pads[1] + pads[3] - dilations[1] * (kw - 1) - 1) // strides[1] + 1
    b_line = f"  %b = const() {{value=@b}} : f32[{cout}]\n" if bias is not None else ""
    text = f"""
graph c(%x: f32[{n},{h},{wd},{cin}]) -> (%y) {{
  %w = const() {{value=@w}} : f32[{cout},{cin // group},{kh},{kw}]
{b_line}  %y = conv(%x, %w{", %b" if bias is not None else ""}) {{strides={list(strides)}, pads={list(pads)}, dilations={list(dilations)}, group={group}, layout="{layout}"}} : f32[{n},{oh},{ow},{cout}]
}}
"""
    return parse_graph(text, {"w": w, "b": bias})


def _torch_conv(x, w, bias, strides, pads, dilations):
    xt = torch.from_numpy(x).permute(0, 3, 1, 2).double()
    xt = torch.nn.functional.pad(xt, (pads[1], pads[3], pads[0], pads[2]))
    y = torch.nn.functional.conv2d(xt, torch.from_numpy(w).double(),
                                   None if bias is None else torch.from_numpy(bias).double(),
                                   stride=strides, dilation=dilations)
    return y.permute(0, 2, 3, 1).numpy()


CASES = [
    # (x NHWC, cout, kernel, strides, pads (t, l, b, r), dilations, bias)
    ((1, 9, 9, 3), 5, 3, (1, 1), (1, 1, 1, 1), (1, 1), True),
    ((2, 7, 6, 4), 40, 3, (2, 2), (1, 1, 1, 1), (1, 1), True),  # a column tail (40 % 32)
    ((1, 10, 10, 16), 32, 1, (1, 1), (0, 0, 0, 0), (1, 1), False),  # 1x1: a plain GEMM
    ((1, 11, 11, 8), 33, 5, (2, 2), (2, 2, 2, 2), (2, 2), True),  # dilated
    ((1, 8, 9, 6), 64, 3, (1, 2), (0, 1, 2, 0), (1, 1), True),  # uneven pads, strides
    ((1, 7, 7, 64), 64, 3, (1, 1), (1, 1, 1, 1), (1, 1), True),  # ResNet's 7x7 tail: 49 rows
    ((1, 32, 32, 3), 16, 7, (2, 2), (3, 3, 3, 3), (1, 1), True),  # the stem's shape, smaller
    ((1, 38, 38, 3), 16, 7, (2, 2), (0, 0, 0, 0), (1, 1), True),  # pre-padded: wide rows
]


@pytest.mark.parametrize("x_shape,cout,k,strides,pads,dil,has_bias", CASES)
def test_conv_numbers_match_torch(x_shape, cout, k, strides, pads, dil, has_bias):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((cout, x_shape[3], k, k)).astype(np.float32)
    bias = rng.standard_normal(cout).astype(np.float32) if has_bias else None
    x = rng.standard_normal(x_shape).astype(np.float32)
    y, = CpuStep(compile_graph(_conv_graph(x_shape, w, bias, strides, pads, dil))).run([x])
    want = _torch_conv(x, w, bias, strides, pads, dil)
    scale = np.sqrt(x_shape[3] * k * k) * 4.0  # |x|, |w| of a few units: sums of K products
    np.testing.assert_allclose(y, want, rtol=0, atol=2e-7 * scale * np.abs(want).max() + 1e-6)


def test_conv_is_one_kernel_on_packed_constants():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    cg = CpuStep(compile_graph(_conv_graph((1, 5, 5, 4), w, b, (1, 1), (1, 1, 1, 1), (1, 1))))
    assert [k.kind for k in cg.kernels] == ["contraction"]
    assert sum(isinstance(s, tuple) and s[0] == PACKED for s in cg.slots) == 2  # w and b
    assert "braze.conv.zeros" in cg.llvm_ir


def test_what_braze_does_not_compile_says_why():
    rng = np.random.default_rng(0)
    g = _conv_graph((1, 5, 5, 4), rng.standard_normal((8, 2, 3, 3)).astype(np.float32), None,
                    (1, 1), (1, 1, 1, 1), (1, 1), group=2)
    conv = next(n for n in g.nodes if n.op == "conv")
    assert supports(conv) is None  # grouped convs compile (compiler/kernels/grouped.py)
    grouped = parse_graph("""
graph c(%x: f32[1,5,5,4], %w: f32[8,2,3,3]) -> (%y) {
  %y = conv(%x, %w) {strides=[1, 1], pads=[0, 0, 0, 0], dilations=[1, 1], group=2, layout="NHWC"} : f32[1,3,3,8]
}
""")
    node = next(n for n in grouped.nodes if n.op == "conv")
    assert "%w is not a constant" in supports(node)
    nchw = parse_graph("""
graph c(%x: f32[1,4,5,5], %w: f32[8,4,3,3]) -> (%y) {
  %y = conv(%x, %w) {strides=[1, 1], pads=[0, 0, 0, 0], dilations=[1, 1], group=1} : f32[1,8,3,3]
}
""")
    node = next(n for n in nchw.nodes if n.op == "conv")
    assert "not a constant" in supports(node)


@pytest.mark.parametrize("op,pads,include", [
    ("max_pool", (1, 1, 1, 1), False), ("max_pool", (0, 0, 0, 0), False),
    ("avg_pool", (1, 1, 1, 1), False), ("avg_pool", (1, 0, 1, 0), True),
])
def test_channels_last_pooling_matches_torch(op, pads, include):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 9, 8, 20)).astype(np.float32)
    oh = (9 + pads[0] + pads[2] - 3) // 2 + 1
    ow = (8 + pads[1] + pads[3] - 3) // 2 + 1
    extra = f", count_include_pad={str(include).lower()}" if op == "avg_pool" else ""
    g = parse_graph(f"""
graph p(%x: f32[2,9,8,20]) -> (%y) {{
  %y = {op}(%x) {{kernel=[3, 3], strides=[2, 2], pads={list(pads)}, dilations=[1, 1], layout="NHWC"{extra}}} : f32[2,{oh},{ow},20]
}}
""")
    assert supports(next(n for n in g.nodes if n.op == op)) is None
    y, = CpuStep(compile_graph(g)).run([x])
    xt = torch.from_numpy(x).permute(0, 3, 1, 2).double()
    fill = -np.inf if op == "max_pool" else 0.0
    xp = torch.nn.functional.pad(xt, (pads[1], pads[3], pads[0], pads[2]), value=fill)
    if op == "max_pool":
        want = torch.nn.functional.max_pool2d(xp, 3, 2)
    elif include:
        want = torch.nn.functional.avg_pool2d(xp, 3, 2)
    else:
        ones = torch.nn.functional.pad(torch.ones_like(xt), (pads[1], pads[3], pads[0], pads[2]))
        want = (torch.nn.functional.avg_pool2d(xp, 3, 2, divisor_override=1)
                / torch.nn.functional.avg_pool2d(ones, 3, 2, divisor_override=1))
    np.testing.assert_allclose(y, want.permute(0, 2, 3, 1).numpy(), rtol=1e-6, atol=1e-6)


def _residual_block(x_shape, w: np.ndarray, pads):
    """conv(x, w) + skip, then ReLU: a ResNet block's tail, NHWC, stride 1."""
    dims = lambda s: ",".join(map(str, s))  # noqa: E731
    y_shape = (x_shape[0], x_shape[1] + pads[0] + pads[2] - w.shape[2] + 1,
               x_shape[2] + pads[1] + pads[3] - w.shape[3] + 1, w.shape[0])
    return parse_graph(f"""
graph block(%x: f32[{dims(x_shape)}], %skip: f32[{dims(y_shape)}]) -> (%y) {{
  %w = const() {{value=@w}} : f32[{dims(w.shape)}]
  %zero = const() {{value=dense<f32[]: [0.0]>}} : f32[]
  %c = conv(%x, %w) {{strides=[1, 1], pads={list(pads)}, dilations=[1, 1], group=1, layout="NHWC"}} : f32[{dims(y_shape)}]
  %s = add(%c, %skip) : f32[{dims(y_shape)}]
  %y = max(%s, %zero) : f32[{dims(y_shape)}]
}}
""", {"w": w}), y_shape


def _check_residual_block(cg, rng, x_shape, y_shape, w, pads):
    x = rng.standard_normal(x_shape).astype(np.float32)
    skip = rng.standard_normal(y_shape).astype(np.float32)
    y, = cg.run([x, skip])
    want = np.maximum(_torch_conv(x, w, None, (1, 1), pads, (1, 1)) + skip, 0)
    np.testing.assert_allclose(y, want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_bias_residual_and_relu_run_in_the_conv_kernel():
    """A ResNet block's tail, conv + residual add + ReLU, is one kernel: the epilogue runs
    on each tile in cache, and the raw conv result never gets a buffer."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((40, 6, 3, 3)).astype(np.float32)
    g, y_shape = _residual_block((1, 5, 5, 6), w, (1, 1, 1, 1))
    cg = CpuStep(compile_graph(g))
    assert [k.kind for k in cg.kernels] == ["contraction"]
    assert [n.op for n in cg.kernels[0].nodes] == ["conv", "add", "max"]
    _check_residual_block(cg, rng, (1, 5, 5, 6), y_shape, w, (1, 1, 1, 1))


def test_register_epilogue_and_row_major_tiles():
    """Residual add + ReLU on whole panels run on the accumulator vectors (no in-place
    pass after the store), and a small weight takes row-block-major tiles."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((64, 16, 1, 1)).astype(np.float32)
    g, y_shape = _residual_block((1, 6, 6, 16), w, (0, 0, 0, 0))
    cg = CpuStep(compile_graph(g))
    assert "llvm.maximum.v16f32" in cg.llvm_ir and "llvm.prefetch" in cg.llvm_ir
    assert gemm.row_major(AVX512, 16, 64, 36) and not gemm.row_major(AVX512, 4608, 512, 49)
    # a 1 MB weight: panel-major when A fits in L2 (batch 1), rows when it does not
    assert not gemm.row_major(AVX512, 1024, 256, 196) and gemm.row_major(AVX512, 1024, 256, 1568)
    _check_residual_block(cg, rng, (1, 6, 6, 16), y_shape, w, (0, 0, 0, 0))


@pytest.mark.parametrize("m,rtol", [(2, 2e-6), (4, 2e-5)])
@pytest.mark.parametrize("x_shape,cout,pads", [
    ((1, 8, 8, 16), 32, (1, 1, 1, 1)),  # whole tiles
    ((2, 9, 11, 32), 64, (1, 1, 1, 1)),  # uneven sides: the last tiles hang over the image
    ((1, 10, 9, 16), 32, (0, 1, 2, 0)),  # uneven padding
    ((1, 7, 7, 64), 64, (1, 1, 1, 1)),  # ResNet's 7x7 maps
    ((1, 7, 13, 256), 32, (1, 1, 1, 1)),  # the scratch takes fewer tiles per block
])
def test_winograd_3x3_matches_torch(x_shape, cout, pads, m, rtol, monkeypatch):
    """3x3 stride-1 convs with enough channels run on F(2x2, 3x3) or F(4x4, 3x3); the
    transforms add rounding (F(2x2)'s matrices hold 0, +-1, +-1/2 only; F(4x4)'s hold
    entries from 1/8 to 8: see test_winograd_error_against_float64 for its bound)."""
    from compiler.kernels import winograd

    monkeypatch.setattr(winograd, "SCRATCH_BYTES", 1 << 17)  # 5 F(4x4) tiles of 256 ch
    monkeypatch.setattr(winograd, "tile_size", lambda s: m)
    rng = np.random.default_rng(5)
    w = rng.standard_normal((cout, x_shape[3], 3, 3)).astype(np.float32)
    bias = rng.standard_normal(cout).astype(np.float32)
    g = _conv_graph(x_shape, w, bias, (1, 1), pads, (1, 1))
    node = next(n for n in g.nodes if n.op == "conv")
    tile = gemm.Tile.of(host())
    assert winograd.refusal(node, tile) is None and winograd.plan(node, tile).m == m
    x = rng.standard_normal(x_shape).astype(np.float32)
    y, = CpuStep(compile_graph(g)).run([x])
    want = _torch_conv(x, w, bias, (1, 1), pads, (1, 1))
    np.testing.assert_allclose(y, want, rtol=0, atol=rtol * np.abs(want).max())


@pytest.mark.parametrize("spec", ["cpu", "cpu:x86-64-v3"])
def test_winograd_blocks_past_the_register_tile_match_torch(spec, monkeypatch):
    """Where U is larger than L2 (here 8 MiB), a block holds more tiles than the
    micro-kernel's MR rows and runs them as several row chunks per panel (as even as can
    be, those of one size in a loop): on AVX-512 (MR 12) and AVX2 (MR 6) alike, the numbers are a
    direct conv's."""
    from compiler import target as targets
    from compiler.kernels import winograd

    monkeypatch.setattr(winograd, "tile_size", lambda s: 2)
    rng = np.random.default_rng(9)
    x_shape, cout = (1, 14, 16, 128), 1024  # 56 tiles of 2x2: 4 blocks of 14
    w = rng.standard_normal((cout, x_shape[3], 3, 3)).astype(np.float32)
    bias = rng.standard_normal(cout).astype(np.float32)
    g = _conv_graph(x_shape, w, bias, (1, 1), (1, 1, 1, 1), (1, 1))
    node = next(n for n in g.nodes if n.op == "conv")
    tile = gemm.Tile.of(targets.parse(spec))
    shape = winograd.plan(node, tile)
    assert shape.weight_bytes > tile.l2_bytes
    assert shape.rows == 14 > tile.mr and shape.blocks == 4
    chunks = winograd._chunks(shape.rows, tile.mr)
    assert sum(n * c for n, c in chunks) == 14 and all(n <= tile.mr for n, _ in chunks)
    assert winograd._chunks(13, 6) == [(5, 1), (4, 2)]  # as even as can be
    assert winograd._chunks(16, 6) == [(6, 1), (5, 2)] and winograd._chunks(12, 6) == [(6, 2)]
    x = rng.standard_normal(x_shape).astype(np.float32)
    cg = CpuStep(compile_graph(g, target=spec))
    # each chunk asks for its share of the next slice of U into L2 (winograd._next_slice)
    parts = sum(c for _, c in chunks)
    assert f"udiv i64" in cg.llvm_ir and f", {parts}\n" in cg.llvm_ir
    assert ", i32 0, i32 2, i32 1)" in cg.llvm_ir
    y, = cg.run([x])
    want = _torch_conv(x, w, bias, (1, 1), (1, 1, 1, 1), (1, 1))
    np.testing.assert_allclose(y, want, rtol=0, atol=2e-6 * np.abs(want).max())


# RMS error over torch's float32 conv's (oneDNN's direct conv: what eager gives) at most,
# against float64. Measured on both shapes: direct 0.6-0.9x (its taps summed in blocks,
# summation.py), F(2x2) 0.8-1.0x, F(4x4) 1.1-1.5x; before blocked sums and the points
# 0, +-3/4, +-3/2, F(4x4) was 2.9-3.1x (Lavin & Gray's points: 4.3-4.8x).
WINOGRAD_RMS_RATIO = {"direct_conv": 1.0, "winograd F(2x2)": 1.2, "winograd F(4x4)": 1.8}
# Max error over torch's at most (a max is noisier).
WINOGRAD_MAX_RATIO = 3.0


@pytest.mark.parametrize("shape,cout", [((1, 28, 28, 64), 64), ((1, 12, 12, 256), 32)])
def test_winograd_error_against_float64(shape, cout, monkeypatch):
    """A Winograd conv's relative error against a float64 conv, over torch's float32
    conv's on the same data (ReLU-like input, He-scaled weights): F(2x2) about torch's,
    F(4x4) within 2x with its points 0, +-3/4, +-3/2 (winograd.TRANSFORMS) and its
    per-position sums in blocks of winograd.SUM_BLOCK[4] channels."""
    from compiler.kernels import winograd

    rng = np.random.default_rng(11)
    w = (rng.standard_normal((cout, shape[3], 3, 3)) * np.sqrt(2 / (9 * shape[3])))
    w = w.astype(np.float32)
    x = np.maximum(rng.standard_normal(shape), 0).astype(np.float32)
    want = _torch_conv(x, w, None, (1, 1), (1, 1, 1, 1), (1, 1))
    eager = torch.nn.functional.conv2d(torch.from_numpy(x).permute(0, 3, 1, 2),
                                       torch.from_numpy(w), padding=1)

    def errors(got):  # (rms, max) relative errors
        d = got - want
        return (np.sqrt((d ** 2).mean() / (want ** 2).mean()),
                np.abs(d).max() / np.abs(want).max())

    def braze(kernel):
        step = CpuStep(compile_graph(_conv_graph(shape, w, None, (1, 1), (1, 1, 1, 1),
                                                 (1, 1))))
        assert step.kernels[0].impl.label == kernel
        return errors(step.run([x])[0])

    rms, most = errors(eager.permute(0, 2, 3, 1).numpy())
    assert 0 < rms < 1e-6 and most < 3e-6
    got = {}
    for m in (2, 4):
        monkeypatch.setattr(winograd, "tile_size", lambda s, m=m: m)
        got[f"winograd F({m}x{m})"] = braze(f"winograd F({m}x{m})")
    monkeypatch.setattr(winograd, "refusal", lambda node, tile: "direct for comparison")
    got["direct_conv"] = braze("direct_conv")
    for kernel, (r, mx) in got.items():
        assert r <= WINOGRAD_RMS_RATIO[kernel] * rms, (kernel, r, rms)
        assert mx <= WINOGRAD_MAX_RATIO * most, (kernel, mx, most)


class _NumpyOps:
    add, sub = staticmethod(np.add), staticmethod(np.subtract)

    @staticmethod
    def axpy(c, x, y):
        return c * x + y

    @staticmethod
    def mul(c, x):
        return c * x


@pytest.mark.parametrize("m", [2, 4])
def test_winograd_transforms(m):
    """The factored 1-d transforms are the matrices, and the matrices compute a 3-tap
    correlation: A^T [(G g G^T) . (B^T d B)] A = d correlated with g (m x m outputs)."""
    from compiler.kernels import winograd

    t = winograd.TRANSFORMS[m]
    eye = list(np.eye(t.alpha))
    np.testing.assert_array_equal(np.array(t.bt(_NumpyOps, eye)), t.BT)
    np.testing.assert_array_equal(np.array(t.at(_NumpyOps, eye)), t.AT)
    rng = np.random.default_rng(m)
    d, g = rng.standard_normal((t.alpha, t.alpha)), rng.standard_normal((3, 3))
    y = t.AT @ ((t.G @ g @ t.G.T) * (t.BT @ d @ t.BT.T)) @ t.AT.T
    want = [[(d[i:i + 3, j:j + 3] * g).sum() for j in range(m)] for i in range(m)]
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)


def test_winograd_tile_size():
    """F(4x4) on ResNet-50's 56x56 and 28x28 maps, and at batch 8 on all four; F(2x2)
    at batch 1 where the transformed weight is large and the tiles few."""
    from compiler.kernels import winograd

    rng = np.random.default_rng(8)
    picked = {}
    for n, h, c in [(1, 56, 64), (1, 28, 128), (1, 14, 256), (1, 7, 512), (8, 14, 256),
                    (8, 7, 512)]:
        w = rng.standard_normal((c, c, 3, 3)).astype(np.float32)
        g = _conv_graph((n, h, h, c), w, None, (1, 1), (1, 1, 1, 1), (1, 1))
        picked[n, h] = winograd.plan(next(x for x in g.nodes if x.op == "conv"), AVX512).m
    assert picked == {(1, 56): 4, (1, 28): 4, (1, 14): 2, (1, 7): 2, (8, 14): 4, (8, 7): 4}


def test_winograd_says_why_not():
    from compiler.kernels import winograd

    rng = np.random.default_rng(6)
    for shape, k, strides, why in [((1, 9, 9, 16), 32, (2, 2), "stride-1"),
                                   ((1, 9, 9, 8), 32, (1, 1), "multiple of 16"),
                                   ((1, 5, 5, 16), 32, (1, 1), "too few")]:
        w = rng.standard_normal((k, shape[3], 3, 3)).astype(np.float32)
        g = _conv_graph(shape, w, None, strides, (1, 1, 1, 1), (1, 1))
        assert why in winograd.refusal(next(n for n in g.nodes if n.op == "conv"), AVX512)


def test_winograd_needs_enough_tiles(monkeypatch):
    """Fewer than MIN_TILES 2x2 output tiles (all images together) run direct: ResNet-50's
    7x7 512-channel convs at batch 1 (16 tiles), not at batch 8 (128) nor at 14x14 (49)."""
    from compiler.kernels import winograd

    monkeypatch.setattr(winograd, "MIN_TILES", 32)
    rng = np.random.default_rng(9)
    for n, side, c, why in [(1, 7, 512, "16 2x2 output tiles"), (8, 7, 512, None),
                            (1, 14, 256, None), (1, 11, 64, None), (1, 10, 64, "25 2x2")]:
        w = rng.standard_normal((c, c, 3, 3)).astype(np.float32)
        g = _conv_graph((n, side, side, c), w, None, (1, 1), (1, 1, 1, 1), (1, 1))
        got = winograd.refusal(next(x for x in g.nodes if x.op == "conv"), AVX512)
        assert got is None if why is None else why in got, (n, side, got)


def test_winograd_epilogues_on_registers_and_in_place():
    """ReLU after a Winograd conv runs on the output vectors; an epilogue with an op that
    has no vector form (exp) runs in place after each store."""
    rng = np.random.default_rng(7)
    w = rng.standard_normal((32, 16, 3, 3)).astype(np.float32)
    x = rng.standard_normal((1, 8, 8, 16)).astype(np.float32)
    for op, ref in (("max", lambda c: np.maximum(c, 0)), ("exp", np.exp)):
        second = ", %zero" if op == "max" else ""
        g = parse_graph(f"""
graph e(%x: f32[1,8,8,16]) -> (%y) {{
  %w = const() {{value=@w}} : f32[32,16,3,3]
  %zero = const() {{value=dense<f32[]: [0.0]>}} : f32[]
  %c = conv(%x, %w) {{strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1], group=1, layout="NHWC"}} : f32[1,8,8,32]
  %s = mul(%c, %zero) : f32[1,8,8,32]
  %t = add(%c, %s) : f32[1,8,8,32]
  %y = {op}(%t{second}) : f32[1,8,8,32]
}}
""", {"w": w})
        cg = CpuStep(compile_graph(g))
        assert [kk.kind for kk in cg.kernels] == ["contraction"]
        y, = cg.run([x])
        want = ref(_torch_conv(x, w, None, (1, 1), (1, 1, 1, 1), (1, 1)))
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=2e-6 * np.abs(want).max())


@pytest.mark.parametrize("spec", ["cpu", "cpu:x86-64-v3", "cpu:x86-64-v2"])
@pytest.mark.parametrize("cout", [144, 40, 38])
def test_winograd_with_channels_past_the_last_panel(cout, spec):
    """Winograd where NR does not divide Cout (144 = 4.5 AVX-512 panels, R(2+1)D's; 40;
    38, not whole vectors on any target): the last panel's GEMMs run on U's zero
    columns, its stores stop at Cout. Residual add + ReLU run on the output vectors (a
    mask for the vector across Cout), exp in place after each store; every target runs
    here and matches torch."""
    from compiler.kernels import choice

    rng = np.random.default_rng(cout)
    cin = 16
    w = rng.standard_normal((cout, cin, 3, 3)).astype(np.float32)
    g, y_shape = _residual_block((1, 12, 10, cin), w, (1, 1, 1, 1))
    cg = CpuStep(compile_graph(g, target=spec))
    assert [k.impl.name for k in cg.kernels] == [choice.WINOGRAD]
    _check_residual_block(cg, rng, (1, 12, 10, cin), y_shape, w, (1, 1, 1, 1))
    bias = rng.standard_normal(cout).astype(np.float32)
    g = parse_graph(f"""
graph e(%x: f32[2,9,11,{cin}]) -> (%y) {{
  %w = const() {{value=@w}} : f32[{cout},{cin},3,3]
  %b = const() {{value=@b}} : f32[{cout}]
  %c = conv(%x, %w, %b) {{strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1], group=1, layout="NHWC"}} : f32[2,9,11,{cout}]
  %y = exp(%c) : f32[2,9,11,{cout}]
}}
""", {"w": w * 0.1, "b": bias})
    cg = CpuStep(compile_graph(g, target=spec))
    assert [k.impl.name for k in cg.kernels] == [choice.WINOGRAD]
    x = rng.standard_normal((2, 9, 11, cin)).astype(np.float32)
    y, = cg.run([x])
    want = np.exp(_torch_conv(x, w * 0.1, bias, (1, 1), (1, 1, 1, 1), (1, 1)))
    np.testing.assert_allclose(y, want, rtol=2e-5, atol=0)


@pytest.mark.parametrize("x_shape,strides", [((1, 5, 5, 1024), (1, 1)),
                                             ((2, 6, 6, 512), (2, 2))])
def test_pointwise_conv_rows_4k_apart_match_torch(x_shape, strides):
    """1x1 convs whose pixels are 4 KiB apart (1024 channels, or 512 at stride 2) read
    each row block from a padded copy where AVX-512's 12 rows outnumber L1's ways
    (x86-64-v4 on a named CPU's 8-way 32 KiB L1D), in place on a 12-way one; the numbers
    are the direct conv's either way."""
    import dataclasses

    from compiler.target import parse

    rng = np.random.default_rng(9)
    cout = 64
    w = rng.standard_normal((cout, x_shape[3], 1, 1)).astype(np.float32)
    bias = rng.standard_normal(cout).astype(np.float32)
    g = _conv_graph(x_shape, w, bias, strides, (0, 0, 0, 0), (1, 1))
    x = rng.standard_normal(x_shape).astype(np.float32)
    want = _torch_conv(x, w, bias, strides, (0, 0, 0, 0), (1, 1))
    v4 = parse("cpu:x86-64-v4")
    for target, copied in ((v4, True), (dataclasses.replace(v4, l1d_bytes=48 << 10), False)):
        cg = CpuStep(compile_graph(g, target=target))
        assert (f"alloca float, i64 {12 * (x_shape[3] + gemm.ROW_PAD)}" in cg.llvm_ir) == copied
        y, = cg.run([x])
        np.testing.assert_allclose(y, want, rtol=0, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("spec", ["cpu", "cpu:x86-64-v3", "cpu:x86-64-v2"])
@pytest.mark.parametrize("cout", [72, 38])
def test_epilogue_on_registers_where_channels_are_not_whole_vectors(cout, spec):
    """With Cout not a multiple of the vector (72 = 4.5 AVX-512 vectors, 38 = 4.75 AVX2
    ones, 9.5 SSE ones), residual add + ReLU still run on the accumulator vectors: the vector holding
    the last channels reads the residual through a mask (every read in bounds, the last
    row of the tensor too), and no scalar pass over the stored tile is left (one ran the
    whole conv at half speed). Every target runs here and matches torch."""
    rng = np.random.default_rng(8)
    w = rng.standard_normal((cout, 16, 1, 1)).astype(np.float32)
    g, y_shape = _residual_block((1, 7, 9, 16), w, (0, 0, 0, 0))
    cg = CpuStep(compile_graph(g, target=spec))
    vec = 16 if spec == "cpu" and host().vec == 16 else {"cpu:x86-64-v3": 8}.get(spec, 4)
    assert ("llvm.masked.load" in cg.llvm_ir) == bool(cout % vec)
    assert f"llvm.maximum.v{vec}f32" in cg.llvm_ir
    assert "llvm.maximum.f32" not in cg.llvm_ir  # the scalar pass over the stored tile
    _check_residual_block(cg, rng, (1, 7, 9, 16), y_shape, w, (0, 0, 0, 0))


@pytest.mark.parametrize("cout", [104, 40, 208])
def test_narrowed_last_panel_conv_with_residual_matches_torch(cout):
    """A 1x1 and a 3x3 conv whose last channel panel runs the narrowed tile (gemm.Tile
    .narrowed: 104 = 3 x 32 + 8), with the residual-and-ReLU epilogue."""
    rng = np.random.default_rng(7)
    for kernel, pads in ((1, (0, 0, 0, 0)), (3, (1, 1, 1, 1))):
        w = rng.standard_normal((cout, 24, kernel, kernel)).astype(np.float32)
        g, y_shape = _residual_block((1, 9, 7, 24), w, pads)
        cg = CpuStep(compile_graph(g))
        _check_residual_block(cg, rng, (1, 9, 7, 24), y_shape, w, pads)
