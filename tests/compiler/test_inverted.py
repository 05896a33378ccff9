"""An inverted residual block's expand and depthwise convs as one kernel
(compiler/kernels/inverted.py): which pairs fuse (one kernel, no buffer for the expanded
value), when they do not, and its numbers against torch (float64) over strides, window
sizes, epilogues, odd sizes and threads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from compiler.codegen import compile_graph
from compiler.kernels import inverted
from compiler.passes.fuse import plan
from compiler.text import parse_graph
from runtime.cpu import CpuStep

RNG = np.random.default_rng(0)


def _epilogue(act: str, src: str, dst: str, shape: str) -> str:
    """IR lines computing %dst = act(%src) (ReLU6 as max/min, SiLU as x * sigmoid(x),
    "scale" a per-channel multiply, "none" nothing)."""
    if act == "none":  # the expand conv without an epilogue: its raw result is E
        return f"  %{dst} = mul(%{src}, %one) : f32[{shape}]\n" if dst == "y" else ""
    if act == "scale":
        return f"  %{dst} = mul(%{src}, %sc) : f32[{shape}]\n"
    if act == "relu6":
        return (f"  %{dst}_m = max(%{src}, %zero) : f32[{shape}]\n"
                f"  %{dst} = min(%{dst}_m, %six) : f32[{shape}]\n")
    return (f"  %{dst}_s = sigmoid(%{src}) : f32[{shape}]\n"
            f"  %{dst} = mul(%{src}, %{dst}_s) : f32[{shape}]\n")


def _block(h, w, cin, cexp, k, stride, act, extra_reader=False, n=1):
    """IR text of x -> act(conv1x1(x) + b1) = e -> act(depthwise(e) + b2) = y, NHWC, batch
    n; with `extra_reader`, e is also a graph output."""
    p = k // 2
    oh, ow = (h + 2 * p - k) // stride + 1, (w + 2 * p - k) // stride + 1
    es, ys = f"{n},{h},{w},{cexp}", f"{n},{oh},{ow},{cexp}"
    outs = "%y, %e" if extra_reader else "%y"
    return f"""
graph blk(%x: f32[{n},{h},{w},{cin}]) -> ({outs}) {{
  %zero = const() {{value=dense<f32[]: [0.0]>}} : f32[]
  %six = const() {{value=dense<f32[]: [6.0]>}} : f32[]
  %one = const() {{value=dense<f32[]: [1.0]>}} : f32[]
  %sc = const() {{value=@sc}} : f32[{cexp}]
  %w1 = const() {{value=@w1}} : f32[{cexp},{cin},1,1]
  %b1 = const() {{value=@b1}} : f32[{cexp}]
  %w2 = const() {{value=@w2}} : f32[{cexp},1,{k},{k}]
  %b2 = const() {{value=@b2}} : f32[{cexp}]
  %c = conv(%x, %w1, %b1) {{strides=[1,1], pads=[0,0,0,0], dilations=[1,1], group=1, layout="NHWC"}} : f32[{es}]
{_epilogue(act, "c", "e", es)}  %d = conv(%{"c" if act == "none" else "e"}, %w2, %b2) {{strides=[{stride},{stride}], pads=[{p},{p},{p},{p}], dilations=[1,1], group={cexp}, layout="NHWC"}} : f32[{ys}]
{_epilogue(act, "d", "y", ys)}}}
"""


def _arrays(cin, cexp, k):
    return {"w1": RNG.standard_normal((cexp, cin, 1, 1)).astype(np.float32) / np.sqrt(cin),
            "b1": RNG.standard_normal(cexp).astype(np.float32),
            "w2": RNG.standard_normal((cexp, 1, k, k)).astype(np.float32) / k,
            "b2": RNG.standard_normal(cexp).astype(np.float32),
            "sc": RNG.uniform(0.5, 1.5, cexp).astype(np.float32)}


def _torch(x, arrays, k, stride, act):
    f = torch.nn.functional
    a = {n: torch.from_numpy(v).double() for n, v in arrays.items()}
    act_fn = {"relu6": lambda t: t.clamp(0, 6), "silu": f.silu, "none": lambda t: t,
              "scale": lambda t: t * a["sc"].reshape(1, -1, 1, 1)}[act]
    e = act_fn(f.conv2d(torch.from_numpy(x).permute(0, 3, 1, 2).double(), a["w1"], a["b1"]))
    y = act_fn(f.conv2d(e, a["w2"], a["b2"], stride=stride, padding=k // 2,
                        groups=a["w2"].shape[0]))
    return y.permute(0, 2, 3, 1).numpy()


@pytest.fixture
def always_fuse(monkeypatch):
    """Fuse whatever the size (the rule's size threshold is for speed, not legality)."""
    monkeypatch.setattr(inverted, "MIN_EXPANDED_L2_FRACTION", 0.0)


def test_the_pair_is_one_kernel_and_the_expanded_value_has_no_buffer(always_fuse):
    g = parse_graph(_block(9, 8, 8, 48, 3, 1, "relu6"), _arrays(8, 48, 3))
    p = plan(g)
    e = next(v for n in g.nodes for v in n.outputs if v.name == "e")
    assert e not in p.materialized
    convs = [k for k in p.kernels if k.contraction is not None]
    assert len(convs) == 1 and convs[0].expand is not None
    assert convs[0].expand.root is e and convs[0].contraction.attrs["group"] == 48
    assert "expand %e" in p.explain()


def test_an_expanded_value_read_elsewhere_keeps_its_buffer(always_fuse):
    g = parse_graph(_block(9, 8, 8, 48, 3, 1, "relu6", extra_reader=True), _arrays(8, 48, 3))
    p = plan(g)
    assert sum(k.contraction is not None for k in p.kernels) == 2
    assert all(k.expand is None for k in p.kernels)


def test_a_small_expanded_value_stays_two_kernels():
    """Below MIN_EXPANDED_L2_FRACTION of L2, fusion measured no faster: not fused."""
    g = parse_graph(_block(9, 8, 8, 48, 3, 1, "relu6"), _arrays(8, 48, 3))
    assert all(k.expand is None for k in plan(g).kernels)


# (batch, h, w, cin, cexp, kernel, stride, activation, threads)
CASES = [(1, *case) for case in [
    (12, 11, 8, 48, 3, 1, "relu6", 1),
    (13, 11, 16, 96, 3, 2, "relu6", 1),
    (10, 10, 16, 96, 3, 2, "relu6", 2),  # even size, stride 2: no bottom padding row
    (11, 9, 8, 40, 5, 1, "silu", 1),  # a channel tail (40 % 16) and 5x5
    (15, 13, 24, 72, 5, 2, "silu", 2),
    (7, 7, 12, 20, 3, 1, "silu", 2),  # Cexp below one panel
    (1, 5, 8, 32, 3, 1, "relu6", 1),  # one row: every window hangs over the padding
]] + [
    (3, 9, 7, 8, 32, 3, 1, "relu6", 1),  # a thread's rows run on from image to image
    (2, 11, 10, 16, 48, 5, 2, "silu", 2),
    (1, 8, 9, 8, 32, 3, 2, "scale", 1),  # a per-channel operand in both epilogues
    (1, 9, 8, 8, 32, 3, 1, "none", 1),  # no epilogue on the expand conv
]


@pytest.mark.parametrize("n,h,w,cin,cexp,k,stride,act,threads", CASES)
def test_fused_block_matches_torch(always_fuse, n, h, w, cin, cexp, k, stride, act, threads):
    arrays = _arrays(cin, cexp, k)
    g = parse_graph(_block(h, w, cin, cexp, k, stride, act, n=n), arrays)
    program = compile_graph(g)
    assert any(k_.expand is not None for k_ in program.plan.kernels)
    x = RNG.standard_normal((n, h, w, cin)).astype(np.float32)
    y, = CpuStep(program, threads=threads).run([x])
    want = _torch(x, arrays, k, stride, act)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
