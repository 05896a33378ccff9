"""The channels-last layout pass (compiler/passes/layout.py): conv chains become NHWC
with transposes only at the chain's edges, and compute the same."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.codegen import channels_last_refusal
from compiler.interp import evaluate
from compiler.ir import verify
from compiler.passes.layout import channels_last
from compiler.text import parse_graph

RNG = np.random.default_rng(0)
W1 = RNG.standard_normal((8, 4, 3, 3)).astype(np.float32)
W2 = RNG.standard_normal((8, 8, 1, 1)).astype(np.float32)
BIAS = RNG.standard_normal((1, 8, 1, 1)).astype(np.float32)

BLOCK = """
graph block(%x: f32[1,4,6,6]) -> (%y) {
  %w1 = const() {value=@w1} : f32[8,4,3,3]
  %w2 = const() {value=@w2} : f32[8,8,1,1]
  %bias = const() {value=@bias} : f32[1,8,1,1]
  %zero = const() {value=dense<f32[]: [0.0]>} : f32[]
  %c1 = conv(%x, %w1) {strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1], group=1} : f32[1,8,6,6]
  %r1 = max(%c1, %zero) : f32[1,8,6,6]
  %c2 = conv(%r1, %w2) {strides=[1, 1], pads=[0, 0, 0, 0], dilations=[1, 1], group=1} : f32[1,8,6,6]
  %b2 = add(%c2, %bias) : f32[1,8,6,6]
  %s = add(%b2, %r1) : f32[1,8,6,6]
  %p = max_pool(%s) {kernel=[2, 2], strides=[2, 2], pads=[0, 0, 0, 0], dilations=[1, 1]} : f32[1,8,3,3]
  %m = reduce_sum(%p) {axes=[2, 3], keepdims=true} : f32[1,8,1,1]
  %y = reshape(%m) {shape=[1, 8]} : f32[1,8]
}
"""


def _block():
    return parse_graph(BLOCK, {"w1": W1, "w2": W2, "bias": BIAS})


def test_a_resnet_block_has_one_transpose_in_and_none_out():
    g = _block()
    assert channels_last(g, channels_last_refusal)
    verify(g)
    ops = [n.op for n in g.nodes if n.op != "const"]
    assert ops.count("transpose") == 1  # the input; the pooled output leaves as a reshape
    assert all(n.attrs["layout"] == "NHWC" for n in g.nodes
               if n.op in ("conv", "max_pool"))
    bias = next(n for n in g.nodes if n.op == "add" and n.inputs[1].producer.op == "const")
    assert bias.inputs[1].shape == (1, 1, 1, 8)  # the bias constant moved to NHWC too


def test_numbers_are_unchanged():
    x = RNG.standard_normal((1, 4, 6, 6)).astype(np.float32)
    want = evaluate(_block(), [x])[0]
    g = _block()
    channels_last(g, channels_last_refusal)
    np.testing.assert_allclose(evaluate(g, [x])[0], want, rtol=1e-5, atol=1e-5)


def test_ineligible_convs_stay_nchw_and_nothing_moves():
    g = _block()
    assert not channels_last(g, lambda node: "not for this target")
    assert not any(n.op == "transpose" for n in g.nodes)


def test_values_read_in_nchw_keep_a_transpose_back():
    g = parse_graph("""
graph two(%x: f32[1,4,5,5]) -> (%y, %z) {
  %w1 = const() {value=@w1} : f32[8,4,3,3]
  %c = conv(%x, %w1) {strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1], group=1} : f32[1,8,5,5]
  %y = neg(%c) : f32[1,8,5,5]
  %z = reshape(%c) {shape=[8, 25]} : f32[8,25]
}
""", {"w1": W1})
    x = RNG.standard_normal((1, 4, 5, 5)).astype(np.float32)
    want = evaluate(g, [x])
    channels_last(g, channels_last_refusal)
    verify(g)
    for a, b in zip(evaluate(g, [x]), want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_few_channel_convs_read_a_padded_copy():
    """The stem (3 channels): the input is padded ahead of time, the conv has no pads, so
    its kernel reads whole window rows (conv.py's wide rows)."""
    w = RNG.standard_normal((8, 3, 3, 3)).astype(np.float32)
    g = parse_graph("""
graph stem(%x: f32[1,3,8,8]) -> (%y) {
  %w = const() {value=@w} : f32[8,3,3,3]
  %y = conv(%x, %w) {strides=[2, 2], pads=[1, 1, 1, 1], dilations=[1, 1], group=1} : f32[1,8,4,4]
}
""", {"w": w})
    x = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)
    want = evaluate(g, [x])[0]
    channels_last(g, channels_last_refusal)
    conv = next(n for n in g.nodes if n.op == "conv")
    assert conv.inputs[0].producer.op == "pad" and not any(conv.attrs["pads"])
    np.testing.assert_allclose(evaluate(g, [x])[0], want, rtol=1e-5, atol=1e-5)


# A ShuffleNet v2 unit seen by the importer: a conv's channels split in two (slice),
# a 1x1 conv on one half, the halves concatenated and shuffled (reshape to groups,
# swap, reshape back), then split again for the next unit's conv.
W3 = RNG.standard_normal((4, 4, 1, 1)).astype(np.float32)
SHUFFLE = """
graph unit(%x: f32[1,4,6,6]) -> (%y, %p) {
  %w1 = const() {value=@w1} : f32[8,4,3,3]
  %w3 = const() {value=@w3} : f32[4,4,1,1]
  %c = conv(%x, %w1) {strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1], group=1} : f32[1,8,6,6]
  %a = slice(%c) {starts=[0, 0, 0, 0], steps=[1, 1, 1, 1], sizes=[1, 4, 6, 6]} : f32[1,4,6,6]
  %b = slice(%c) {starts=[0, 4, 0, 0], steps=[1, 1, 1, 1], sizes=[1, 4, 6, 6]} : f32[1,4,6,6]
  %fb = conv(%b, %w3) {strides=[1, 1], pads=[0, 0, 0, 0], dilations=[1, 1], group=1} : f32[1,4,6,6]
  %cat = concat(%a, %fb) {axis=1} : f32[1,8,6,6]
  %g = reshape(%cat) {shape=[1, 2, 4, 6, 6]} : f32[1,2,4,6,6]
  %t = transpose(%g) {perm=[0, 2, 1, 3, 4]} : f32[1,4,2,6,6]
  %s = reshape(%t) {shape=[1, 8, 6, 6]} : f32[1,8,6,6]
  %p = slice(%s) {starts=[0, 0, 0, 0], steps=[1, 1, 1, 1], sizes=[1, 4, 6, 6]} : f32[1,4,6,6]
  %q = slice(%s) {starts=[0, 4, 0, 0], steps=[1, 1, 1, 1], sizes=[1, 4, 6, 6]} : f32[1,4,6,6]
  %y = conv(%q, %w3) {strides=[1, 1], pads=[0, 0, 0, 0], dilations=[1, 1], group=1} : f32[1,4,6,6]
}
"""


def _shuffle():
    return parse_graph(SHUFFLE, {"w1": W1, "w3": W3})


def test_channel_split_concat_and_shuffle_stay_channels_last():
    g = _shuffle()
    assert channels_last(g, channels_last_refusal)
    verify(g)
    # one transpose in, one per output (the graph's edges), and the shuffle's own swap
    # of its two channel dims: no layout change around the movement ops
    perms = sorted(tuple(n.attrs["perm"]) for n in g.nodes if n.op == "transpose")
    assert perms == [(0, 1, 2, 4, 3), (0, 2, 3, 1), (0, 3, 1, 2), (0, 3, 1, 2)]
    cat = next(n for n in g.nodes if n.op == "concat")
    assert cat.attrs["axis"] == 3  # over NHWC's channels
    shuffle = next(n for n in g.nodes if n.op == "reshape" and len(n.outputs[0].shape) == 5)
    assert shuffle.outputs[0].shape == (1, 6, 6, 2, 4)


def test_channel_shuffle_numbers_are_unchanged():
    x = RNG.standard_normal((1, 4, 6, 6)).astype(np.float32)
    want = evaluate(_shuffle(), [x])
    g = _shuffle()
    channels_last(g, channels_last_refusal)
    for a, b in zip(evaluate(g, [x]), want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_a_reshape_that_moves_spatial_dims_keeps_its_transpose():
    g = parse_graph("""
graph flat(%x: f32[1,4,6,6]) -> (%y) {
  %w1 = const() {value=@w1} : f32[8,4,3,3]
  %c = conv(%x, %w1) {strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1], group=1} : f32[1,8,6,6]
  %y = reshape(%c) {shape=[1, 8, 36, 1]} : f32[1,8,36,1]
}
""", {"w1": W1})
    x = RNG.standard_normal((1, 4, 6, 6)).astype(np.float32)
    want = evaluate(g, [x])[0]
    channels_last(g, channels_last_refusal)
    reshape = next(n for n in g.nodes if n.op == "reshape")
    assert reshape.inputs[0].producer.op == "transpose"  # read in NCHW, as written
    np.testing.assert_allclose(evaluate(g, [x])[0], want, rtol=1e-5, atol=1e-5)


# A MetaFormer (PoolFormer) token mixer as the ONNX importer sees it, batch 2: a conv, a
# 1-group GroupNorm (the sample flattened into one row: mean, variance, normalize, then
# back to N,C,H,W and the per-channel affine), the pool-minus-input mixer, a 1x1 conv.
WG = RNG.standard_normal((1, 8, 1, 1)).astype(np.float32)
GROUP_NORM = """
graph mixer(%x: f32[2,4,6,6]) -> (%y) {
  %w1 = const() {value=@w1} : f32[8,4,3,3]
  %w2 = const() {value=@w2} : f32[8,8,1,1]
  %gamma = const() {value=@wg} : f32[1,8,1,1]
  %n = const() {value=dense<f32[]: [288.0]>} : f32[]
  %eps = const() {value=dense<f32[]: [1e-05]>} : f32[]
  %c = conv(%x, %w1) {strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1], group=1} : f32[2,8,6,6]
  %r = reshape(%c) {shape=[2, GROUPS, ROW]} : f32[2,GROUPS,ROW]
  %s = reduce_sum(%r) {axes=[2], keepdims=true} : f32[2,GROUPS,1]
  %mean = div(%s, %n) : f32[2,GROUPS,1]
  %d = sub(%r, %mean) : f32[2,GROUPS,ROW]
  %d2 = mul(%d, %d) : f32[2,GROUPS,ROW]
  %v = reduce_sum(%d2) {axes=[2], keepdims=true} : f32[2,GROUPS,1]
  %var = div(%v, %n) : f32[2,GROUPS,1]
  %ve = add(%var, %eps) : f32[2,GROUPS,1]
  %sd = sqrt(%ve) : f32[2,GROUPS,1]
  %rstd = reciprocal(%sd) : f32[2,GROUPS,1]
  %z = mul(%d, %rstd) : f32[2,GROUPS,ROW]
  %back = reshape(%z) {shape=[2, 8, 6, 6]} : f32[2,8,6,6]
  %g = mul(%back, %gamma) : f32[2,8,6,6]
  %p = avg_pool(%g) {kernel=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1], count_include_pad=false} : f32[2,8,6,6]
  %m = sub(%p, %g) : f32[2,8,6,6]
  %y = conv(%m, %w2) {strides=[1, 1], pads=[0, 0, 0, 0], dilations=[1, 1], group=1} : f32[2,8,6,6]
}
"""


def _group_norm(groups: int):
    text = GROUP_NORM.replace("GROUPS", str(groups)).replace("ROW", str(288 // groups))
    if groups != 1:
        text = text.replace("[288.0]", f"[{288 // groups}.0]")
    return parse_graph(text, {"w1": W1, "w2": W2, "wg": WG})


def test_a_one_group_norm_between_convs_stays_channels_last():
    """Its rows hold a whole sample, in any order: the statistics reduce the channels-last
    values' rows, the normalized values keep the channels-last shape, and nothing but the
    graph's input and output is transposed."""
    g = _group_norm(1)
    assert channels_last(g, channels_last_refusal)
    verify(g)
    perms = sorted(tuple(n.attrs["perm"]) for n in g.nodes if n.op == "transpose")
    assert perms == [(0, 2, 3, 1), (0, 3, 1, 2)]
    assert all(n.attrs["layout"] == "NHWC" for n in g.nodes if n.op in ("conv", "avg_pool"))
    for red in (n for n in g.nodes if n.op == "reduce_sum"):
        row = red.inputs[0]
        assert row.shape == (2, 1, 288) and row.producer.op in ("reshape", "mul")
    affine = next(n for n in g.nodes if n.op == "mul" and n.inputs[1].producer.op == "const")
    assert affine.outputs[0].shape == (2, 6, 6, 8)
    # the norm's last step writes the channels-last shape itself, not a row then a copy
    z = affine.inputs[0].producer
    assert z.op == "mul" and z.outputs[0].shape == (2, 6, 6, 8)
    assert [u.shape for u in z.inputs] == [(2, 6, 6, 8), (2, 1, 1, 1)]


def test_a_one_group_norm_computes_the_same():
    x = RNG.standard_normal((2, 4, 6, 6)).astype(np.float32)
    want = evaluate(_group_norm(1), [x])[0]
    g = _group_norm(1)
    channels_last(g, channels_last_refusal)
    np.testing.assert_allclose(evaluate(g, [x])[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("groups", [2, 4])
def test_a_norm_over_channel_groups_runs_channels_last(groups):
    """Several groups: a group's elements are every G-th run of channels in N,H,W,C, not
    a row. The statistics reduce the spatial dims per channel, then each group's
    channels; the normalizing ops run on N,H,W,C with each group's statistics repeated
    over its channels; nothing but the graph's edges is transposed."""
    x = RNG.standard_normal((2, 4, 6, 6)).astype(np.float32)
    want = evaluate(_group_norm(groups), [x])[0]
    g = _group_norm(groups)
    channels_last(g, channels_last_refusal)
    verify(g)
    perms = sorted(tuple(n.attrs["perm"]) for n in g.nodes if n.op == "transpose")
    assert perms == [(0, 2, 3, 1), (0, 3, 1, 2)]
    sums = [n for n in g.nodes if n.op == "reduce_sum"]
    assert [tuple(n.attrs["axes"]) for n in sums] == [(1, 2), (2,), (1, 2), (2,)]
    assert sums[1].outputs[0].shape == (2, groups, 1)
    np.testing.assert_allclose(evaluate(g, [x])[0], want, rtol=1e-4, atol=1e-4)


def test_a_pad_between_convs_moves_with_the_layout():
    """A reflect pad between convs (an image-to-image net's): padded channels-last, its
    pads moved to N,H,W,C's dims, with no transpose around it."""
    g = parse_graph("""
graph refl(%x: f32[1,4,6,6]) -> (%y) {
  %w1 = const() {value=@w1} : f32[8,4,3,3]
  %w2 = const() {value=@w2} : f32[8,8,1,1]
  %c = conv(%x, %w1) {strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1], group=1} : f32[1,8,6,6]
  %p = pad(%c) {pads=[0, 0, 1, 2, 0, 0, 3, 0], mode="reflect"} : f32[1,8,10,8]
  %y = conv(%p, %w2) {strides=[1, 1], pads=[0, 0, 0, 0], dilations=[1, 1], group=1} : f32[1,8,10,8]
}
""", {"w1": W1, "w2": W2})
    x = RNG.standard_normal((1, 4, 6, 6)).astype(np.float32)
    want = evaluate(g, [x])[0]
    assert channels_last(g, channels_last_refusal)
    verify(g)
    perms = sorted(tuple(n.attrs["perm"]) for n in g.nodes if n.op == "transpose")
    assert perms == [(0, 2, 3, 1), (0, 3, 1, 2)]
    pad = next(n for n in g.nodes if n.op == "pad" and n.attrs["mode"] == "reflect")
    assert tuple(pad.attrs["pads"]) == (0, 1, 2, 0, 0, 3, 0, 0)
    np.testing.assert_allclose(evaluate(g, [x])[0], want, rtol=1e-5, atol=1e-5)
