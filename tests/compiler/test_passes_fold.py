"""Affine folding (batch norm into conv/gemm): structure, golden text, numerics, refusals."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.interp import evaluate
from compiler.ir import Graph, TensorType, verify
from compiler.passes.fold import along, fold_affine_into_contractions
from compiler.passes.pipeline import run_passes
from compiler.passes.simplify import remove_dead
from compiler.text import constants, parse_graph, print_graph

RTOL = ATOL = 1e-5  # f32: folding rounds each new weight once


def ops(g: Graph) -> list[str]:
    return [n.op for n in g.nodes if n.op != "const"]


def folded(g: Graph, xs: list) -> Graph:
    """Run the pipeline (verifier after every pass) and check results are unchanged."""
    want = evaluate(g, xs)
    run_passes(g, verify_each=True)
    for got, ref in zip(evaluate(g, xs), want):
        np.testing.assert_allclose(got, ref, rtol=RTOL, atol=ATOL)
    return g


def conv_bn_relu(with_bias: bool, scale_shape=(4, 1, 1), seed=0) -> Graph:
    rng = np.random.default_rng(seed)
    g = Graph()
    x = g.add_input("x", TensorType("f32", (2, 3, 6, 6)))
    w = g.const(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    args = [x, w] + ([g.const(rng.standard_normal(4).astype(np.float32), "b")]
                     if with_bias else [])
    c = g.op("conv", *args, strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1))
    s = g.const(rng.uniform(0.5, 2, scale_shape).astype(np.float32), "scale")
    t = g.const(rng.standard_normal(scale_shape).astype(np.float32), "shift")
    y = g.op("add", g.op("mul", c, s), t)
    g.outputs = [g.op("max", y, g.const(np.float32(0), "zero"))]
    return g


def x_conv(seed=1):
    return [np.random.default_rng(seed).standard_normal((2, 3, 6, 6)).astype(np.float32)]


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("scale_shape", [(4, 1, 1), (1, 4, 1, 1), ()])
def test_batchnorm_folds_into_conv(with_bias, scale_shape):
    g = folded(conv_bn_relu(with_bias, scale_shape), x_conv())
    assert ops(g) == ["conv", "max"]
    conv = next(n for n in g.nodes if n.op == "conv")
    assert len(conv.inputs) == 3 and conv.outputs[0] is g.nodes[-1].inputs[0]


def test_batchnorm_fold_golden():
    before = parse_graph("""
graph main(%x: f32[1,2,3,3]) -> (%y) {
  %w = const() {value=dense<f32[2,2,1,1]: [1.0, 2.0, 3.0, 4.0]>} : f32[2,2,1,1]
  %c = conv(%x, %w) {dilations=[1, 1], group=1, pads=[0, 0, 0, 0], strides=[1, 1]} : f32[1,2,3,3]
  %s = const() {value=dense<f32[2,1,1]: [2.0, 0.5]>} : f32[2,1,1]
  %m = mul(%c, %s) : f32[1,2,3,3]
  %t = const() {value=dense<f32[2,1,1]: [1.0, -1.0]>} : f32[2,1,1]
  %a = add(%m, %t) : f32[1,2,3,3]
  %y = exp(%a) : f32[1,2,3,3]
}""")
    assert fold_affine_into_contractions(before)
    verify(before)
    remove_dead(before)
    assert print_graph(before) == print_graph(parse_graph("""
graph main(%x: f32[1,2,3,3]) -> (%y) {
  %w.scaled = const() {value=dense<f32[2,2,1,1]: [2.0, 4.0, 1.5, 2.0]>} : f32[2,2,1,1]
  %c.bias.0 = const() {value=dense<f32[2]: [1.0, -1.0]>} : f32[2]
  %c = conv(%x, %w.scaled, %c.bias.0) {dilations=[1, 1], group=1, pads=[0, 0, 0, 0], strides=[1, 1]} : f32[1,2,3,3]
  %y = exp(%c) : f32[1,2,3,3]
}"""))


def test_grouped_conv_folds_per_output_channel():
    rng = np.random.default_rng(3)
    g = Graph()
    x = g.add_input("x", TensorType("f32", (1, 4, 5, 5)))
    w = g.const(rng.standard_normal((4, 1, 3, 3)).astype(np.float32), "w")
    c = g.op("conv", x, w, strides=(2, 2), pads=(0, 0, 0, 0), dilations=(1, 1), group=4)
    s = g.const(rng.uniform(-2, 2, (1, 4, 1, 1)).astype(np.float32))
    g.outputs = [g.op("exp", g.op("mul", c, s))]
    folded(g, [rng.standard_normal((1, 4, 5, 5)).astype(np.float32)])
    assert ops(g) == ["conv", "exp"]


def gemm_bn(alpha_scale: bool = False) -> Graph:
    rng = np.random.default_rng(2)
    g = Graph()
    x = g.add_input("x", TensorType("f32", (2, 5)))
    y = g.op("matmul", x, g.const(rng.standard_normal((5, 4)).astype(np.float32), "w"))
    if alpha_scale:
        y = g.op("mul", y, g.const(np.float32(0.5), "alpha"))
    y = g.op("add", y, g.const(rng.standard_normal(4).astype(np.float32), "bias"))
    y = g.op("mul", y, g.const(rng.uniform(0.5, 2, 4).astype(np.float32), "s"))
    g.outputs = [g.op("add", y, g.const(rng.standard_normal(4).astype(np.float32), "t"))]
    return g


@pytest.mark.parametrize("alpha_scale", [False, True])
def test_gemm_bias_then_batchnorm_folds_to_matmul_plus_bias(alpha_scale):
    g = folded(gemm_bn(alpha_scale), [np.random.default_rng(4).standard_normal((2, 5))
                                      .astype(np.float32)])
    assert ops(g) == ["matmul", "add"]


def test_constant_chains_merge():
    g = parse_graph("""
graph main(%x: f32[2,3]) -> (%y) {
  %a = const() {value=dense<f32[3]: [1.0, 2.0, 3.0]>} : f32[3]
  %b = const() {value=dense<f32[]: [0.5]>} : f32[]
  %m1 = mul(%x, %a) : f32[2,3]
  %m2 = mul(%m1, %b) : f32[2,3]
  %s1 = sub(%m2, %a) : f32[2,3]
  %s2 = add(%b, %s1) : f32[2,3]
  %y = exp(%s2) : f32[2,3]
}""")
    folded(g, [np.random.default_rng(5).uniform(-1, 1, (2, 3)).astype(np.float32)])
    assert ops(g) == ["mul", "add", "exp"]
    assert [n.attrs["value"].tolist() for n in g.nodes if n.op == "const"] == [
        [0.5, 1.0, 1.5], [-0.5, -1.5, -2.5]]


def test_integer_chains_merge_exactly():
    g = parse_graph("""
graph main(%x: i32[4]) -> (%y) {
  %a = const() {value=dense<i32[]: [2147483647]>} : i32[]
  %b = const() {value=dense<i32[]: [3]>} : i32[]
  %s = add(%x, %a) : i32[4]
  %t = add(%s, %b) : i32[4]
  %y = neg(%t) : i32[4]
}""")
    xs = [np.array([-3, 0, 5, 2147483640], np.int32)]
    want = evaluate(g, xs)
    run_passes(g, verify_each=True)
    assert ops(g) == ["add", "neg"]
    np.testing.assert_array_equal(evaluate(g, xs)[0], want[0])


def test_fold_refuses_shared_intermediate():
    g = conv_bn_relu(True)
    conv_out = next(n for n in g.nodes if n.op == "conv").outputs[0]
    g.outputs.append(conv_out)  # the unfolded conv result is needed too
    folded(g, x_conv())
    assert ops(g) == ["conv", "mul", "add", "max"]


@pytest.mark.parametrize("shape", [(4, 6, 1), (1, 1, 6, 6), (2, 4, 1, 1)])
def test_fold_refuses_constants_not_per_channel(shape):
    # varies along a spatial axis / along the batch axis: not a per-channel affine
    g = conv_bn_relu(True, scale_shape=shape)
    folded(g, x_conv())
    assert "mul" in ops(g)


def test_fold_refuses_non_finite_scale():
    g = conv_bn_relu(True)
    scale = next(n for n in g.nodes if n.op == "const" and n.outputs[0].name == "scale")
    arr = scale.attrs["value"].copy()
    arr[0] = np.inf
    arr.setflags(write=False)
    scale.attrs["value"] = arr
    run_passes(g, verify_each=True)
    assert "mul" in ops(g)


def test_fold_refuses_non_constant_weight():
    g = Graph()
    x = g.add_input("x", TensorType("f32", (1, 2, 4)))
    w = g.add_input("w", TensorType("f32", (3, 2, 1)))
    c = g.op("conv", x, w, strides=(1,), pads=(0, 0), dilations=(1,))
    g.outputs = [g.op("mul", c, g.const(np.ones((3, 1), np.float32) * 2))]
    assert not fold_affine_into_contractions(g)


def test_along_reasons():
    assert along(np.ones((3, 1, 1)), (2, 3, 4, 4), 1).shape == (3,)
    assert along(np.float32(2), (2, 3), -1).tolist() == [2.0, 2.0, 2.0]
    assert "varies along more than" in along(np.ones((3, 4, 1)), (2, 3, 4, 4), 1)
    assert "larger shape" in along(np.ones((2, 3, 1, 1)), (1, 3, 4, 4), 1)
    assert "higher rank" in along(np.ones((1, 1, 3, 1, 1)), (2, 3, 4, 4), 1)


def test_large_weights_keep_their_side_table():
    g = conv_bn_relu(True)
    run_passes(g, verify_each=True)
    text, table = print_graph(g), constants(g)
    assert parse_graph(text, table) == g


def test_scalar_constants_stay_scalars():
    g = parse_graph("""
graph main(%x: f32[]) -> (%y) {
  %one = const() {value=dense<f32[]: [1.0]>} : f32[]
  %two = const() {value=dense<f32[]: [2.0]>} : f32[]
  %s = sub(%x, %one) : f32[]
  %a = add(%s, %two) : f32[]
  %y = exp(%a) : f32[]
}""")
    folded(g, [np.array(0.25, np.float32)])
    assert ops(g) == ["add", "exp"] and g.nodes[0].attrs["value"].shape == ()


# -- property: random affine chains after a contraction compute what they did --

# per-channel constant shapes first, then two that vary along another axis
_CONV_SHAPES = [(), (4, 1), (1, 4, 1), (1, 1), (4, 5), (1, 5)]
_MM_SHAPES = [(), (4,), (1, 4), (1, 1), (3, 1), (3, 4)]
_PER_CHANNEL = 4


@st.composite
def affine_chain(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    g = Graph()
    if draw(st.booleans()):
        x = g.add_input("x", TensorType("f32", (2, 3, 5)))
        w = g.const(rng.standard_normal((4, 3, 1)).astype(np.float32), "w")
        y, shapes = g.op("conv", x, w, strides=(1,), pads=(0, 0), dilations=(1,)), _CONV_SHAPES
    else:
        x = g.add_input("x", TensorType("f32", (3, 6)))
        w = g.const(rng.standard_normal((6, 4)).astype(np.float32), "w")
        y, shapes = g.op("matmul", x, w), _MM_SHAPES
    if draw(st.booleans()):
        shapes = shapes[:_PER_CHANNEL]
    for _ in range(draw(st.integers(1, 6))):
        c = g.const(rng.uniform(0.5, 2, draw(st.sampled_from(shapes))).astype(np.float32))
        op = draw(st.sampled_from(["mul", "add", "sub"]))
        y = g.op(op, *((c, y) if op != "sub" and draw(st.booleans()) else (y, c)))
    g.outputs = [g.op("exp", y)]
    return g, [rng.uniform(-1, 1, g.inputs[0].shape).astype(np.float32)], shapes


@settings(max_examples=80, deadline=None)
@given(affine_chain())
def test_affine_folding_preserves_results(case):
    g, xs, shapes = case
    before = len(ops(g))
    folded(g, xs)  # checks results (rtol 1e-5) and runs the verifier after every pass
    assert len(ops(g)) <= before
    if len(shapes) == _PER_CHANNEL:  # only per-channel constants: the chain folds away
        assert ops(g) in (["conv", "exp"], ["matmul", "exp"], ["matmul", "add", "exp"],
                          ["matmul", "sub", "exp"])


def test_merge_refuses_an_overflowing_constant():
    g = parse_graph("""
graph main(%x: f32[3]) -> (%y) {
  %big = const() {value=dense<f32[]: [1e+30]>} : f32[]
  %a = mul(%x, %big) : f32[3]
  %b = mul(%a, %big) : f32[3]
  %y = exp(%b) : f32[3]
}""")
    folded(g, [np.zeros(3, np.float32)])  # 0 * 1e30 * 1e30 is 0; 0 * inf would be NaN
    assert ops(g) == ["mul", "mul", "exp"]


def _padded_window(op: str, mode="constant", value=0.0, pads=(0, 0, 0, 1, 0, 0, 1, 2),
                   **attrs) -> Graph:
    """pad(x) then a stride-2 3x3 conv (or pool) with pads of its own: a TensorFlow
    export's SAME padding, F.pad before a conv."""
    rng = np.random.default_rng(3)
    g = Graph()
    x = g.add_input("x", TensorType("f32", (2, 3, 7, 7)))
    p = g.op("pad", x, pads=pads, mode=mode, value=value)
    if op == "conv":
        w = g.const(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
        y = g.op("conv", p, w, strides=(2, 2), pads=(1, 0, 0, 1), dilations=(1, 1))
    else:
        y = g.op(op, p, kernel=(3, 3), strides=(2, 2), pads=(1, 0, 0, 1), dilations=(1, 1),
                 **attrs)
    g.outputs = [y]
    return g


def _x7():
    return [np.random.default_rng(4).standard_normal((2, 3, 7, 7)).astype(np.float32)]


@pytest.mark.parametrize("op,attrs", [("conv", {}), ("avg_pool", {"count_include_pad": True})])
def test_a_zero_pad_folds_into_the_window_after_it(op, attrs):
    g = folded(_padded_window(op, **attrs), _x7())
    assert ops(g) == [op]
    window = next(n for n in g.nodes if n.op == op)
    # (top, left, bottom, right) + the pad's (H begin, W begin, H end, W end)
    assert tuple(window.attrs["pads"]) == (1 + 0, 0 + 1, 0 + 1, 1 + 2)


@pytest.mark.parametrize("op,kw,why", [
    ("conv", {"mode": "reflect"}, "reflect pad"),
    ("conv", {"value": 1.0}, "pad by 1.0"),
    ("conv", {"pads": (1, 0, 0, 1, 0, 0, 1, 2)}, "a pad of the batch"),
    ("avg_pool", {"count_include_pad": False}, "count"),
    ("max_pool", {}, "not by zeros"),
])
def test_other_pads_stay(op, kw, why):
    """What the window's own pads cannot say: other modes or values, pads of other dims,
    an average that leaves padding out of its count, a max pool's -inf."""
    pads = kw.pop("pads", (0, 0, 0, 1, 0, 0, 1, 2))
    if op == "max_pool":
        kw["value"] = -np.inf
    g = folded(_padded_window(op, pads=pads, **kw), _x7())
    assert "pad" in ops(g), why
