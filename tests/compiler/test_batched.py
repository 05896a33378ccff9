"""The run-time-packed float32 GEMM (compiler/kernels/batched.py): which matmuls take it,
that a transposed operand is read through its transpose (never written), its fused
epilogues, and its numbers against numpy at float64 (batched, broadcast, ragged)."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.codegen import compile_graph
from runtime.cpu import CpuStep
from compiler.kernels import batched
from compiler.text import parse_graph


def _dims(s) -> str:
    return ",".join(map(str, s))


def _qk(b, h, t, s, d, extra: str = "", out: str = "%y", more_inputs: str = ""):
    """y = q @ transpose(k) (+ extra lines), q: [b,h,t,d], k: [b,h,s,d]."""
    return parse_graph(f"""
graph qk(%q: f32[{_dims((b, h, t, d))}], %k: f32[{_dims((b, h, s, d))}]{more_inputs}) -> ({out}) {{
  %kt = transpose(%k) {{perm=[0,1,3,2]}} : f32[{_dims((b, h, d, s))}]
  %y = matmul(%q, %kt) : f32[{_dims((b, h, t, s))}]
{extra}
}}
""")


def _tol(k, *arrays) -> float:
    """float32 products summed over k: error grows like sqrt(k) ulps of the scale."""
    return 4e-7 * np.sqrt(k) * np.prod([np.abs(a).max() for a in arrays])


def test_transposed_keys_are_folded_into_the_gemm_kernel():
    cg = compile_graph(_qk(1, 2, 20, 20, 32))
    assert [k.kind for k in cg.kernels] == ["contraction"]
    assert [n.op for n in cg.kernels[0].nodes] == ["transpose", "matmul"]
    assert not any(getattr(s, "name", None) == "kt" for s in cg.slots)  # K^T never written
    assert "llvm.fma.v16f32" in cg.llvm_ir and "@\"malloc\"" in cg.llvm_ir


def test_refusals_name_the_reason():
    g = parse_graph("""
graph mm(%a: f32[4,8], %w: f32[8,16], %i: i32[4,8], %j: i32[8,16]) -> (%y, %z) {
  %y = matmul(%a, %w) : f32[4,16]
  %z = matmul(%i, %j) : i32[4,16]
}
""")
    f32, i32 = (n for n in g.nodes if n.op == "matmul")
    assert batched.refusal(f32) is None
    assert "float32 only" in batched.refusal(i32)
    w = parse_graph("""
graph mm(%a: f32[4,8]) -> (%y) {
  %w = const() {value=@w} : f32[8,16]
  %y = matmul(%a, %w) : f32[4,16]
}
""", {"w": np.ones((8, 16), np.float32)})
    assert "compile-time-packed" in batched.refusal(w.nodes[-1])


@pytest.mark.parametrize("b,h,t,s,d", [
    (1, 2, 7, 7, 32), (2, 3, 13, 29, 80), (1, 12, 128, 128, 64), (1, 1, 1, 1, 64),
    (1, 2, 300, 300, 64), (1, 1, 5, 33, 1),
])
def test_q_kt_matches_numpy(b, h, t, s, d):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((b, h, t, d)).astype(np.float32)
    k = rng.standard_normal((b, h, s, d)).astype(np.float32)
    y, = CpuStep(compile_graph(_qk(b, h, t, s, d))).run([q, k])
    want = q.astype(np.float64) @ k.transpose(0, 1, 3, 2)
    np.testing.assert_allclose(y, want, rtol=0, atol=_tol(d, q, k))


@pytest.mark.parametrize("a_shape,w_shape", [
    ((2, 3, 17, 40), (2, 3, 40, 33)),  # batched, ragged tiles
    ((1, 3, 17, 40), (2, 1, 40, 33)),  # both broadcast
    ((2, 5, 9, 64), (64, 70)),  # a runtime weight: A's batch dims fold into M
    ((30, 1024), (1024, 64)),  # a Linear whose weight is an input
    ((4, 12, 1), (1, 1, 12)),
])
def test_runtime_operands_match_numpy(a_shape, w_shape):
    rng = np.random.default_rng(1)
    a = rng.standard_normal(a_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    out = np.broadcast_shapes(a_shape[:-2], w_shape[:-2]) + (a_shape[-2], w_shape[-1])
    g = parse_graph(f"""
graph mm(%a: f32[{_dims(a_shape)}], %w: f32[{_dims(w_shape)}]) -> (%y) {{
  %y = matmul(%a, %w) : f32[{_dims(out)}]
}}
""")
    cg = CpuStep(compile_graph(g))
    assert "llvm.fma.v16f32" in cg.llvm_ir
    y, = cg.run([a, w])
    np.testing.assert_allclose(y, a.astype(np.float64) @ w, rtol=0,
                               atol=_tol(a_shape[-1], a, w))


@pytest.mark.parametrize("t", [7, 64])
def test_epilogue_scale_mask_residual_is_fused(t):
    """scores * scale + additive mask + residual: one kernel, the epilogue on its tiles."""
    d = 32
    extra = f"""  %c = const() {{value=dense<f32[]: [0.125]>}} : f32[]
  %s = mul(%y, %c) : f32[1,2,{t},{t}]
  %m = add(%s, %mask) : f32[1,2,{t},{t}]
  %z = add(%m, %res) : f32[1,2,{t},{t}]"""
    more = f", %mask: f32[{t},{t}], %res: f32[1,2,{t},{t}]"
    g = _qk(1, 2, t, t, d, extra, out="%z", more_inputs=more)
    cg = CpuStep(compile_graph(g))
    assert [k.kind for k in cg.kernels] == ["contraction"]
    rng = np.random.default_rng(2)
    q, k = (rng.standard_normal((1, 2, t, d)).astype(np.float32) for _ in range(2))
    mask = np.triu(np.full((t, t), -1e4, np.float32), 1)
    res = rng.standard_normal((1, 2, t, t)).astype(np.float32)
    z, = cg.run([q, k, mask, res])
    want = (q.astype(np.float64) @ k.transpose(0, 1, 3, 2)) * 0.125 + mask + res
    np.testing.assert_allclose(z, want, rtol=1e-6, atol=_tol(d, q, k))


def test_two_threads_match_one():
    rng = np.random.default_rng(3)
    q, k = (rng.standard_normal((2, 4, 50, 64)).astype(np.float32) for _ in range(2))
    one, = CpuStep(compile_graph(_qk(2, 4, 50, 50, 64)), threads=1).run([q, k])
    two, = CpuStep(compile_graph(_qk(2, 4, 50, 50, 64)), threads=2).run([q, k])
    np.testing.assert_array_equal(one, two)


def test_stacked_linears_with_input_weights():
    """Two Linear layers whose weights are graph inputs (torch.compile without freezing):
    transposed weights, bias and ReLU epilogues, the second reading the first's result."""
    g = parse_graph("""
graph mlp(%x: f32[5,48], %w1: f32[40,48], %b1: f32[40], %w2: f32[24,40], %b2: f32[24]) -> (%y) {
  %w1t = transpose(%w1) {perm=[1,0]} : f32[48,40]
  %h0 = matmul(%x, %w1t) : f32[5,40]
  %h1 = add(%h0, %b1) : f32[5,40]
  %zero = const() {value=dense<f32[]: [0.0]>} : f32[]
  %h = max(%h1, %zero) : f32[5,40]
  %w2t = transpose(%w2) {perm=[1,0]} : f32[40,24]
  %y0 = matmul(%h, %w2t) : f32[5,24]
  %y = add(%y0, %b2) : f32[5,24]
}
""")
    rng = np.random.default_rng(4)
    x, w1, b1, w2, b2 = (rng.standard_normal(s).astype(np.float32)
                         for s in [(5, 48), (40, 48), (40,), (24, 40), (24,)])
    cg = CpuStep(compile_graph(g))
    assert [k.kind for k in cg.kernels] == ["contraction", "contraction"]
    y, = cg.run([x, w1, b1, w2, b2])
    h = np.maximum(x.astype(np.float64) @ w1.T + b1, 0)
    np.testing.assert_allclose(y, h @ w2.T + b2, rtol=1e-5, atol=1e-5)


def test_empty_depth_is_refused_and_gives_zeros():
    g = parse_graph("""
graph mm(%a: f32[3,0], %w: f32[0,4]) -> (%y) {
  %y = matmul(%a, %w) : f32[3,4]
}
""")
    assert "empty operand" in batched.refusal(g.nodes[-1])
    y, = CpuStep(compile_graph(g)).run([np.zeros((3, 0), np.float32), np.zeros((0, 4), np.float32)])
    np.testing.assert_array_equal(y, np.zeros((3, 4), np.float32))


def test_a_reduction_under_a_folded_operand_gets_its_own_kernel():
    """Swin V2's cosine attention: K is normalized (a sum over its rows) right under the
    transpose the GEMM reads through. The elementwise part (div) is still computed while
    packing; the sum is a row kernel of its own (the emitter could not inline it: it
    raised 'no float emitter for reduce_sum')."""
    g = parse_graph("""
graph qk(%q: f32[2,16,8], %k: f32[2,12,8]) -> (%y) {
  %kk = mul(%k, %k) : f32[2,12,8]
  %ss = reduce_sum(%kk) {axes=[2], keepdims=true} : f32[2,12,1]
  %nn = sqrt(%ss) : f32[2,12,1]
  %nb = broadcast(%nn) {shape=[2,12,8]} : f32[2,12,8]
  %kn = div(%k, %nb) : f32[2,12,8]
  %kt = transpose(%kn) {perm=[0,2,1]} : f32[2,8,12]
  %y = matmul(%q, %kt) : f32[2,16,12]
}
""")
    cg = compile_graph(g)
    kinds = {k.kind: [n.op for n in k.nodes] for k in cg.kernels}
    assert "reduce_sum" not in kinds["contraction"] and "div" in kinds["contraction"]
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 16, 8), np.float32), rng.standard_normal((2, 12, 8),
                                                                             np.float32)
    (y,) = CpuStep(cg)([q, k])
    kn = k / np.sqrt((k * k).sum(-1, keepdims=True))
    np.testing.assert_allclose(y, q @ kn.transpose(0, 2, 1), rtol=1e-5, atol=1e-5)
