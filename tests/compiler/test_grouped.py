"""braze's grouped and depthwise conv (compiler/kernels/grouped.py): which convs take it,
its numbers against torch (float64) over kernel sizes, strides, dilations, padding,
channel multipliers, group widths and 1-d windows, its fused epilogues, and the layout
pass keeping depthwise chains channels-last."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch

from compiler.codegen import channels_last_refusal, compile_graph, supports
from runtime.cpu import CpuStep
from compiler.kernels import grouped
from compiler.passes.layout import channels_last
from compiler.text import parse_graph

RNG = np.random.default_rng(0)


def _conv_text(x_shape, w_shape, strides, pads, dilations, group, out_shape, bias=True,
               layout="NHWC") -> str:
    dims = lambda s: ",".join(map(str, s))  # noqa: E731
    b_line = f"  %b = const() {{value=@b}} : f32[{w_shape[0]}]\n" if bias else ""
    return f"""
graph c(%x: f32[{dims(x_shape)}]) -> (%y) {{
  %w = const() {{value=@w}} : f32[{dims(w_shape)}]
{b_line}  %y = conv(%x, %w{", %b" if bias else ""}) {{strides={list(strides)}, pads={list(pads)}, dilations={list(dilations)}, group={group}, layout="{layout}"}} : f32[{dims(out_shape)}]
}}
"""


def _out_dim(size, k, stride, lo, hi, dil):
    return (size + lo + hi - dil * (k - 1) - 1) // stride + 1


def _run_2d(x_shape, cout, k, strides, pads, dil, group, bias=True, target="cpu"):
    """braze's NHWC conv (for `target`) and torch's float64 one on the same random data."""
    n, h, w, cin = x_shape
    kh, kw = (k, k) if isinstance(k, int) else k
    oh = _out_dim(h, kh, strides[0], pads[0], pads[2], dil[0])
    ow = _out_dim(w, kw, strides[1], pads[1], pads[3], dil[1])
    wt = RNG.standard_normal((cout, cin // group, kh, kw)).astype(np.float32)
    b = RNG.standard_normal(cout).astype(np.float32) if bias else None
    x = RNG.standard_normal(x_shape).astype(np.float32)
    g = parse_graph(_conv_text(x_shape, wt.shape, strides, pads, dil, group,
                               (n, oh, ow, cout), bias), {"w": wt, "b": b})
    y, = CpuStep(compile_graph(g, target=target)).run([x])
    xt = torch.nn.functional.pad(torch.from_numpy(x).permute(0, 3, 1, 2).double(),
                                 (pads[1], pads[3], pads[0], pads[2]))
    want = torch.nn.functional.conv2d(xt, torch.from_numpy(wt).double(),
                                      None if b is None else torch.from_numpy(b).double(),
                                      stride=strides, dilation=dil, groups=group)
    return y, want.permute(0, 2, 3, 1).numpy(), kh * kw * cin // group


def _close(y, want, k_terms):
    scale = np.sqrt(k_terms) * 4.0  # |x|, |w| of a few units: sums of K products
    np.testing.assert_allclose(y, want, rtol=0, atol=2e-7 * scale * np.abs(want).max() + 1e-6)


# (x NHWC, multiplier, kernel, strides, pads (t, l, b, r), dilations)
DEPTHWISE = [
    ((1, 12, 11, 32), 1, k, (s, s), (k // 2 * d,) * 4, (d, d))
    for k in (3, 5, 7) for s in (1, 2) for d in (1, 2)
] + [
    ((2, 9, 10, 20), 1, 3, (1, 1), (1, 1, 1, 1), (1, 1)),  # a channel tail (20 % 16)
    ((1, 9, 9, 24), 2, 3, (1, 1), (1, 1, 1, 1), (1, 1)),  # multiplier 2
    ((1, 10, 9, 8), 2, 5, (2, 2), (2, 1, 0, 2), (1, 1)),  # multiplier 2, uneven pads
    ((1, 8, 8, 6), 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),  # multiplier 3: scalar lanes
    ((1, 7, 7, 48), 1, 7, (1, 1), (3, 3, 3, 3), (1, 1)),  # all border: no interior
    ((1, 6, 13, 16), 1, (1, 5), (1, 2), (0, 2, 0, 2), (1, 1)),  # a 1x5 window
    ((1, 9, 9, 16), 1, 3, (1, 1), (0, 0, 0, 0), (1, 1)),  # no padding
]


@pytest.mark.parametrize("x_shape,mult,k,strides,pads,dil", DEPTHWISE)
def test_depthwise_matches_torch(x_shape, mult, k, strides, pads, dil):
    cin = x_shape[3]
    y, want, terms = _run_2d(x_shape, cin * mult, k, strides, pads, dil, group=cin)
    _close(y, want, terms)


# (groups, group width): the output and input channels of each group
GROUPED = [(g, width) for g in (2, 4, 8, 32) for width in (4, 8, 16, 24)]


@pytest.mark.parametrize("groups,width", GROUPED)
def test_grouped_matches_torch(groups, width):
    c = groups * width
    y, want, terms = _run_2d((1, 6, 7, c), c, 3, (1, 1), (1, 1, 1, 1), (1, 1), group=groups)
    _close(y, want, terms)


@pytest.mark.parametrize("cin,cout,groups,strides", [(16, 32, 4, (2, 2)), (48, 24, 6, (1, 2))])
def test_grouped_with_unequal_group_widths_matches_torch(cin, cout, groups, strides):
    y, want, terms = _run_2d((1, 9, 8, cin), cout, 3, strides, (1, 0, 1, 2), (1, 1),
                             group=groups, bias=False)
    _close(y, want, terms)


@pytest.mark.parametrize("target", ["cpu:x86-64-v3", "cpu:x86-64-v2"])  # AVX2, SSE4.2: 8, 4 lanes
@pytest.mark.parametrize("cin,cout,groups", [(20, 20, 20), (24, 48, 24), (64, 64, 8),
                                             (48, 48, 2)])
def test_narrower_vector_targets_match_torch(target, cin, cout, groups):
    y, want, terms = _run_2d((1, 7, 9, cin), cout, 3, (1, 1), (1, 1, 1, 1), (1, 1),
                             group=groups, target=target)
    _close(y, want, terms)


@pytest.mark.parametrize("mg,cg,vec,expected", [
    (1, 1, 16, (16, "shuffle")),  # depthwise: one load per tap, the identity shuffle
    (2, 1, 16, (16, "shuffle")),  # multiplier 2: 8 input channels spread to 16 lanes
    (8, 8, 16, (16, "shuffle")),  # two groups of 8 per vector, no lane wasted
    (16, 16, 16, (16, "broadcast")),  # a vector inside one group
    (24, 24, 16, (8, "broadcast")),  # 24 = 3 vectors of 8
    (3, 1, 16, (1, "broadcast")),  # scalars
    (4, 4, 8, (8, "shuffle")),  # a narrower target
    (56, 56, 16, (16, "broadcast")),  # 4 vectors of 16, the last half used: padded
    (120, 120, 16, (16, "broadcast")),  # 8 vectors, 15 of 16 lanes used
    (40, 40, 16, (8, "broadcast")),  # padding would waste 1/6 of the lanes: 5 x 8
])
def test_vector_width_and_mode(mg, cg, vec, expected):
    assert grouped.choose_width(mg, cg, vec) == expected


@pytest.mark.parametrize("mg,cg,vec,expected", [
    (8, 8, 16, (8, "broadcast")),  # RegNet's stride-2 convs: a load per FMA, no shuffle
    (24, 24, 16, (8, "broadcast")),
    (1, 1, 16, (16, "shuffle")),  # depthwise: the identity shuffle costs nothing
    (4, 4, 16, (16, "shuffle")),  # no broadcast at half the width or more
])
def test_unshared_columns_prefer_a_broadcast(mg, cg, vec, expected):
    """Where each input column serves one tap (strided along the row), a shuffle would be
    paid per FMA: a broadcast at down to half the width wins."""
    assert grouped.choose_width(mg, cg, vec, shared=False) == expected


@pytest.mark.parametrize("ow,pad,k,expected", [
    (7, 1, 3, [(0, 7, 1)]),  # one tile: the borders are not lone pixels
    (14, 1, 3, [(0, 7, 1), (7, 7, 1)]),
    (28, 1, 3, [(0, 7, 1), (7, 7, 2), (21, 7, 1)]),  # interior tiles run as a loop
    (56, 1, 3, [(0, 8, 1), (8, 8, 5), (48, 8, 1)]),
    (7, 3, 7, [(0, 7, 1)]),  # all border
])
def test_columns_are_cut_into_even_tiles(ow, pad, k, expected):
    s = grouped.GroupedShape(1, ow, ow, 32, ow, ow, 32, k, k, (1, 1), (pad, pad), (1, 1),
                             4, 16, "shuffle", 16)
    tiles = grouped.column_tiles(s)
    assert tiles == expected
    assert sum(size * repeat for _, size, repeat in tiles) == ow
    assert max(size for _, size, _ in tiles) <= grouped.TILE


@pytest.mark.parametrize("mode,mg,width,registers,columns,expected", [
    ("broadcast", 16, 16, 32, 3, (1, 8)),  # one vector a group: TILE pixels
    ("broadcast", 128, 16, 32, 3, (2, 8)),  # a 3x3 conv: the taps' weights cost loads
    ("broadcast", 128, 16, 32, 5, (2, 8)),
    ("broadcast", 192, 16, 32, 1, (3, 6)),  # a 1x1 conv (SqueezeBERT): 3 vectors, 6 pixels
    ("broadcast", 64, 16, 32, 1, (4, 4)),  # 3 does not divide the group's 4 vectors
    ("broadcast", 192, 8, 16, 1, (2, 4)),  # AVX2's 16 registers
    ("broadcast", 128, 8, 16, 3, (1, 8)),  # a block would hold under TILE accumulators
    ("shuffle", 1, 16, 32, 3, (1, 8)),  # depthwise: vectors hold whole groups
])
def test_register_block(mode, mg, width, registers, columns, expected):
    assert grouped.register_block(mode, mg, width, registers, columns) == expected


def _grouped_node(x_shape, cout, k, group):
    wt = np.zeros((cout, x_shape[3] // group, k, k), np.float32)
    oh, ow = x_shape[1] - k + 1, x_shape[2] - k + 1
    g = parse_graph(_conv_text(x_shape, wt.shape, (1, 1), (0,) * 4, (1, 1), group,
                               (x_shape[0], oh, ow, cout), bias=False), {"w": wt})
    return next(n for n in g.nodes if n.op == "conv")


def test_wide_groups_plan_register_blocks_and_large_weights_run_chunk_by_chunk():
    from compiler.kernels import gemm
    from compiler import target as targets

    tile = gemm.Tile.of(targets.parse("cpu:x86-64-v4"))  # AVX-512: 32 registers
    s = grouped.plan(_grouped_node((1, 14, 14, 896), 896, 3, 7), tile)  # RegNet-X width 128
    assert (s.width, s.mode, s.block, s.tile) == (16, "broadcast", 2, 8)
    assert s.chunk % s.block == 0 and s.chunk_major  # 4 MB of weights: chunk by chunk
    small = grouped.plan(_grouped_node((1, 14, 14, 64), 64, 3, 2), tile)  # 74 KB of weights
    assert small.block == 2 and not small.chunk_major
    dw = grouped.plan(_grouped_node((1, 14, 14, 64), 64, 3, 64), tile)
    assert (dw.block, dw.tile, dw.chunk_major) == (1, grouped.TILE, False)
    regnet = grouped.plan(_grouped_node((1, 9, 9, 360), 360, 3, 3), tile)  # width 120
    assert regnet.padded and (regnet.width, regnet.group_vectors) == (16, 8)
    assert regnet.vectors == 24 and not dw.padded and not s.padded
    w = np.arange(360 * 120 * 9, dtype=np.float32).reshape(360, 120, 3, 3)
    packed = grouped.pack_weight(w, 16, 3).reshape(24, 3, 3, 120, 16)
    assert packed[8, 1, 2, 5, 0] == w[120, 5, 1, 2]  # group 1 starts vector 8
    assert not packed[7, :, :, :, 8:].any()  # the lanes past group 0's 120 channels


# (x NHWC, groups, kernel, strides): groups two or more vectors wide take a register
# block of several vectors (1x1, 3x3, 5x5; strided; a block of 3; a 7-wide row of one
# tile); the 5x5's 3.3 MB of weights run chunk by chunk
WIDE_GROUPS = [
    ((1, 9, 11, 128), 4, 3, (1, 1)),
    ((1, 6, 10, 192), 4, 1, (1, 1)),
    ((2, 9, 9, 256), 2, 3, (2, 2)),
    ((1, 7, 7, 96), 2, 3, (1, 1)),
    ((1, 13, 13, 256), 2, 5, (1, 1)),
    ((1, 9, 10, 112), 2, 3, (1, 1)),  # groups of 56: 4 vectors of 16, the last one half
    ((2, 8, 9, 360), 3, 3, (2, 2)),  # groups of 120, strided: 8 vectors, the last masked
    ((1, 6, 7, 240), 2, 1, (1, 1)),  # a 1x1 over groups of 120
]


@pytest.mark.parametrize("target", ["cpu", "cpu:x86-64-v3", "cpu:x86-64-v2"])
@pytest.mark.parametrize("x_shape,groups,k,strides", WIDE_GROUPS)
def test_wide_groups_match_torch(target, x_shape, groups, k, strides):
    pad = k // 2
    y, want, terms = _run_2d(x_shape, x_shape[3], k, strides, (pad,) * 4, (1, 1),
                             group=groups, target=target)
    _close(y, want, terms)


@pytest.mark.parametrize("x_shape,groups,strides", [
    ((1, 13, 13, 48), 6, (2, 2)),  # group width 8 at stride 2: broadcast on 8 lanes
    ((1, 9, 9, 96), 4, (1, 2)),  # group width 24, strided along the row only
    ((1, 7, 7, 64), 8, (1, 1)),  # group width 8, a 7-wide row: one tile
])
def test_grouped_tiles_and_strides_match_torch(x_shape, groups, strides):
    y, want, terms = _run_2d(x_shape, x_shape[3], 3, strides, (1, 1, 1, 1), (1, 1),
                             group=groups)
    _close(y, want, terms)


def test_which_convs_take_the_grouped_kernel():
    wt = RNG.standard_normal((8, 1, 3, 3)).astype(np.float32)
    g = parse_graph(_conv_text((1, 5, 5, 8), wt.shape, (1, 1), (1,) * 4, (1, 1), 8,
                               (1, 5, 5, 8), bias=False), {"w": wt})
    node = next(n for n in g.nodes if n.op == "conv")
    assert grouped.refusal(node) is None and supports(node) is None
    cg = compile_graph(g)
    assert [k.kind for k in cg.kernels] == ["contraction"]
    assert "llvm.fmuladd.v16f32" in cg.llvm_ir  # vectorized over channels
    dense = parse_graph(_conv_text((1, 5, 5, 8), (8, 8, 3, 3), (1, 1), (1,) * 4, (1, 1), 1,
                                   (1, 5, 5, 8), bias=False),
                        {"w": RNG.standard_normal((8, 8, 3, 3)).astype(np.float32)})
    assert "group 1" in grouped.refusal(next(n for n in dense.nodes if n.op == "conv"))


def test_one_dimensional_grouped_conv_compiles_channels_last():
    cin, groups, cout, length = 12, 4, 24, 17
    wt = RNG.standard_normal((cout, cin // groups, 5)).astype(np.float32)
    b = RNG.standard_normal(cout).astype(np.float32)
    g = parse_graph(f"""
graph c(%x: f32[2,{cin},{length}]) -> (%y) {{
  %w = const() {{value=@w}} : f32[{cout},{cin // groups},5]
  %b = const() {{value=@b}} : f32[{cout}]
  %y = conv(%x, %w, %b) {{strides=[2], pads=[2, 1], dilations=[1], group={groups}}} : f32[2,{cout},8]
}}
""", {"w": wt, "b": b})
    assert channels_last(g, channels_last_refusal)
    conv = next(n for n in g.nodes if n.op == "conv")
    assert conv.attrs["layout"] == "NHWC" and conv.inputs[0].shape == (2, length, cin)
    x = RNG.standard_normal((2, cin, length)).astype(np.float32)
    y, = CpuStep(compile_graph(g)).run([x])
    xt = torch.nn.functional.pad(torch.from_numpy(x).double(), (2, 1))
    want = torch.nn.functional.conv1d(xt, torch.from_numpy(wt).double(),
                                      torch.from_numpy(b).double(), stride=2, groups=groups)
    _close(y, want.numpy(), 5 * cin // groups)


# -- through ONNX: epilogues, layout, whole blocks -----------------------------------

class _DepthwiseAct(torch.nn.Module):
    """A 1x1 conv, then a depthwise conv, batch norm (folded into the conv), an activation
    and maybe the residual (the 1x1 conv's result: a channels-last value, as inside a
    network)."""

    def __init__(self, c, act, k=3, stride=1, residual=False):
        super().__init__()
        self.pre = torch.nn.Conv2d(c, c, 1)
        self.conv = torch.nn.Conv2d(c, c, k, stride, k // 2, groups=c, bias=False)
        self.bn = torch.nn.BatchNorm2d(c)
        self.act, self.residual = act, residual
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        h = self.pre(x)
        y = self.act(self.bn(self.conv(h)))
        return y + h if self.residual else y


def _compile_torch(module, x, allow_fallback=False):
    import bridge

    buf = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter's
        torch.onnx.export(module.eval(), (torch.from_numpy(x),), buf, input_names=["x"],
                          output_names=["y"], opset_version=17, dynamo=False)
    return bridge.compile_onnx(buf.getvalue(), allow_fallback=allow_fallback)


def _kernels(compiled, x):
    """The kernels braze compiled for input x (compiling happens on the first call)."""
    compiled(x)
    spec = next(iter(compiled._specs.values()))
    return [k for p in spec.parts if p.compiled is not None for k in p.compiled.kernels]


ACTIVATIONS = {
    "relu": torch.nn.ReLU(), "relu6": torch.nn.ReLU6(), "hardswish": torch.nn.Hardswish(),
    "hardsigmoid": torch.nn.Hardsigmoid(), "silu": torch.nn.SiLU(), "gelu": torch.nn.GELU(),
}


@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
@pytest.mark.parametrize("c,residual", [(32, False), (40, True)])
def test_depthwise_epilogue_runs_in_the_conv_kernel(act, c, residual):
    torch.manual_seed(0)
    module = _DepthwiseAct(c, ACTIVATIONS[act], residual=residual)
    x = RNG.standard_normal((1, c, 10, 9)).astype(np.float32)
    compiled = _compile_torch(module, x)
    kernels = _kernels(compiled, x)
    dw = [k for k in kernels if k.contraction is not None and k.contraction.attrs["group"] > 1]
    assert len(dw) == 1 and dw[0].contraction.attrs["group"] == c
    assert dw[0].root is not dw[0].contraction.outputs[0]  # the epilogue is inside
    assert ("add" in [n.op for n in dw[0].nodes][-1:]) == residual
    others = [n.op for k in kernels if k.contraction is None for n in k.nodes]
    assert set(others) <= {"transpose"}  # the layout at the edges; no elementwise pass
    with torch.no_grad():
        want = module(torch.from_numpy(x)).numpy()
    got = compiled(x)[0]
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())


def test_silu_epilogue_is_vector_math_on_the_registers():
    torch.manual_seed(0)
    module = _DepthwiseAct(32, torch.nn.SiLU())
    x = RNG.standard_normal((1, 32, 8, 8)).astype(np.float32)
    compiled = _compile_torch(module, x)
    compiled(x)
    spec = next(iter(compiled._specs.values()))
    ir_text = next(p.compiled for p in spec.parts if p.compiled is not None).llvm_ir
    assert "llvm.rint.v16f32" in ir_text  # exp on 16 lanes at once, not a scalar loop


class _InvertedResidual(torch.nn.Module):
    """MobileNetV2's block: expand 1x1, depthwise 3x3, project 1x1, residual."""

    def __init__(self, c=16, expand=6, stride=1):
        super().__init__()
        h = c * expand
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(c, h, 1, bias=False), torch.nn.BatchNorm2d(h), torch.nn.ReLU6(),
            torch.nn.Conv2d(h, h, 3, stride, 1, groups=h, bias=False), torch.nn.BatchNorm2d(h),
            torch.nn.ReLU6(), torch.nn.Conv2d(h, c, 1, bias=False), torch.nn.BatchNorm2d(c))

    def forward(self, x):
        return x + self.body(x)


def test_inverted_residual_block_is_one_channels_last_cluster():
    torch.manual_seed(0)
    module = _InvertedResidual()
    x = RNG.standard_normal((1, 16, 14, 14)).astype(np.float32)
    compiled = _compile_torch(module, x)
    assert "host" not in compiled.explain().split("\n")[0]
    kernels = _kernels(compiled, x)
    assert sum(k.contraction is not None for k in kernels) == 3  # 3 convs, epilogues inside
    assert sum(n.op == "transpose" for k in kernels for n in k.nodes) == 2  # in and out only
    with torch.no_grad():
        want = module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(compiled(x)[0], want, rtol=2e-5, atol=2e-5 * np.abs(want).max())


# group width 8; 32 (a register block of 2); 56 (groups padded to 4 vectors)
@pytest.mark.parametrize("c,groups", [(64, 8), (64, 2), (112, 2)])
def test_grouped_resnext_block_matches_torch(c, groups):
    torch.manual_seed(0)
    module = torch.nn.Sequential(
        torch.nn.Conv2d(c, c, 1), torch.nn.ReLU(),
        torch.nn.Conv2d(c, c, 3, 2, 1, groups=groups), torch.nn.BatchNorm2d(c),
        torch.nn.ReLU(), torch.nn.Conv2d(c, 32, 1))
    with torch.no_grad():
        module[3].running_mean.uniform_(-0.5, 0.5)
        module[3].bias.uniform_(-0.5, 0.5)
    x = RNG.standard_normal((1, c, 12, 12)).astype(np.float32)
    compiled = _compile_torch(module, x)
    with torch.no_grad():
        want = module.eval()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(compiled(x)[0], want, rtol=2e-5, atol=2e-5 * np.abs(want).max())


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mobilenet_v2", "efficientnet_b0"])
def test_torchvision_mobile_nets_compile_whole(name):
    import torchvision

    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None)
    for m in model.modules():  # calibrate batch norm on random data (no denormals)
        if isinstance(m, torch.nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None
    with torch.no_grad():
        model.train()(torch.randn(4, 3, 128, 128))
    x = RNG.standard_normal((1, 3, 128, 128)).astype(np.float32)
    compiled = _compile_torch(model.eval(), x)  # allow_fallback=False: every node compiled
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    got = compiled(x)[0]
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


# -- a squeeze-and-excitation block's global pool, channels-last ---------------------

POOLS = """
graph p(%x: f32[2,9,7,40]) -> (%mean, %peak, %soft) {
  %s = reduce_sum(%x) {axes=[1, 2], keepdims=true} : f32[2,1,1,40]
  %k = const() {value=dense<f32[]: [63.0]>} : f32[]
  %mean = div(%s, %k) : f32[2,1,1,40]
  %peak = reduce_max(%x) {axes=[1], keepdims=false} : f32[2,7,40]
  %m = reduce_max(%x) {axes=[3], keepdims=true} : f32[2,9,7,1]
  %soft = sub(%x, %m) : f32[2,9,7,40]
}
"""


def test_global_pool_over_channels_last_runs_by_columns():
    from compiler.codegen.kernel_facts import by_columns

    cg = CpuStep(compile_graph(parse_graph(POOLS)))
    columns = {k.root.name: by_columns(k) for k in cg.kernels if k.kind == "row"}
    assert columns == {"mean": True, "peak": True, "soft": False}  # the last dim reduced
    x = RNG.standard_normal((2, 9, 7, 40)).astype(np.float32)
    mean, peak, soft = cg.run([x])
    xt = torch.from_numpy(x).double()
    np.testing.assert_allclose(mean, xt.mean(dim=(1, 2), keepdim=True).numpy(), rtol=1e-6,
                               atol=1e-7)
    np.testing.assert_array_equal(peak, xt.amax(dim=1).float().numpy())
    np.testing.assert_array_equal(soft, (xt - xt.amax(dim=3, keepdim=True)).float().numpy())


@pytest.mark.parametrize("target", ["cpu:x86-64-v4", "cpu:x86-64-v3", "cpu:x86-64-v2",
                                    "cpu:neoverse-n1"])
@pytest.mark.parametrize("cin,groups,k", [(896, 7, 3), (768, 4, 1)])
def test_register_blocks_do_not_spill(target, cin, groups, k):
    """A wide group's register block (accumulators, weight vectors, splatted columns)
    fits the target's registers: no stack spill or reload in any inner loop."""
    from compiler import target as targets
    from compiler.codegen import asm, llvm_cpu

    h = 10
    wt = np.zeros((cin, cin // groups, k, k), np.float32)
    g = parse_graph(_conv_text((1, h, h, cin), wt.shape, (1, 1), (k // 2,) * 4, (1, 1),
                               groups, (1, h, h, cin), bias=False), {"w": wt})
    loops = asm.loop_spills(llvm_cpu.emit_assembly(compile_graph(g, target=target).llvm_ir,
                                                   targets.parse(target)))
    assert loops, "no inner loop that multiplies found"
    assert {name: s for name, (_, s) in loops.items() if s} == {}
