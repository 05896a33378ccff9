"""Reshapes moved aside (compiler/passes/sink.py): structure after the pass pipeline, the
same numbers as before it, the refusals, and the fused kernels it buys."""

import numpy as np
import pytest

from compiler.codegen import compile_graph
from compiler.interp import evaluate
from compiler.ir import verify
from compiler.passes.fuse import plan
from compiler.passes.pipeline import run_passes
from compiler.text import parse_graph
from runtime.cpu import CpuStep

RNG = np.random.default_rng(3)
W = RNG.standard_normal((8, 12)).astype(np.float32)
B = RNG.standard_normal(12).astype(np.float32)

# torch's Linear + GELU-ish epilogue on a [1, 4, 5, 8] activation, as dynamo gives it
LINEAR_4D = """
graph g(%x: f32[1,4,5,8]) -> (%y) {
  %w = const() {value=@w} : f32[8,12]
  %b = const() {value=@b} : f32[12]
  %half = const() {value=dense<f32[]: [0.5]>} : f32[]
  %v = reshape(%x) {shape=[20, 8]} : f32[20,8]
  %m = matmul(%v, %w) : f32[20,12]
  %a = add(%m, %b) : f32[20,12]
  %r = reshape(%a) {shape=[1, 4, 5, 12]} : f32[1,4,5,12]
  %t = tanh(%r) : f32[1,4,5,12]
  %y = mul(%t, %half) : f32[1,4,5,12]
}
"""


def _after_passes(text: str, consts: dict):
    g = parse_graph(text, consts)
    xs = [RNG.standard_normal(v.shape).astype(np.float32) for v in g.inputs]
    want = evaluate(g, xs)
    run_passes(g)
    verify(g)
    for got, ref in zip(evaluate(g, xs), want):
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)
    return g, xs, want


def test_the_matmul_reads_the_activation_and_the_epilogue_fuses():
    g, xs, want = _after_passes(LINEAR_4D, {"w": W, "b": B})
    ops = [n.op for n in g.nodes if n.op != "const"]
    assert "reshape" not in ops, ops
    matmul = next(n for n in g.nodes if n.op == "matmul")
    assert matmul.inputs[0] is g.inputs[0] and matmul.outputs[0].shape == (1, 4, 5, 12)
    (k,) = plan(g).kernels  # one GEMM with bias, tanh and scale on its registers
    assert k.contraction is matmul and k.impl.name == "gemm"
    got = CpuStep(compile_graph(g), threads=2).run(xs)[0]
    np.testing.assert_allclose(got, want[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("text, why", [
    # the reshape changes the last dim: rows are not merely merged
    ("""
graph g(%x: f32[4,6]) -> (%y) {
  %w = const() {value=@w} : f32[8,12]
  %v = reshape(%x) {shape=[3, 8]} : f32[3,8]
  %y = matmul(%v, %w) : f32[3,12]
}""", "last dim"),
    # a full-shape operand of the elementwise op: broadcasting would differ
    ("""
graph g(%x: f32[20,12], %z: f32[4,5,12]) -> (%y) {
  %r = reshape(%x) {shape=[4, 5, 12]} : f32[4,5,12]
  %y = add(%r, %z) : f32[4,5,12]
}""", "add"),
])
def test_reshapes_that_do_more_than_merge_rows_stay(text, why):
    g, _, _ = _after_passes(text, {"w": W})
    assert any(n.op == "reshape" for n in g.nodes), why


def test_a_reshape_with_other_readers_is_not_duplicated():
    g, _, _ = _after_passes("""
graph g(%x: f32[20,12]) -> (%y, %r) {
  %r = reshape(%x) {shape=[4, 5, 12]} : f32[4,5,12]
  %y = exp(%r) : f32[4,5,12]
}""", {})
    assert [n.op for n in g.nodes].count("reshape") == 1


# Swin's window mask: scores viewed per window, a constant added, viewed back
WINDOW_MASK = """
graph g(%s: f32[6,2,4,4]) -> (%y) {
  %m = const() {value=@m} : f32[1,2,1,4,4]
  %r = reshape(%s) {shape=[3, 2, 2, 4, 4]} : f32[3,2,2,4,4]
  %a = add(%r, %m) : f32[3,2,2,4,4]
  %b = reshape(%a) {shape=[6, 2, 4, 4]} : f32[6,2,4,4]
  %y = exp(%b) : f32[6,2,4,4]
}"""


def test_a_mask_added_per_window_becomes_a_mask_of_the_scores():
    """Swin: scores [B*nW, h, N, N] viewed as [B, nW, h, N, N] + mask[1, nW, 1, N, N], then
    viewed back: the mask is repeated per window row block and added to the scores."""
    mask = RNG.standard_normal((1, 2, 1, 4, 4)).astype(np.float32)
    g, _, _ = _after_passes(WINDOW_MASK, {"m": mask})
    ops = [n.op for n in g.nodes if n.op != "const"]
    assert ops == ["add", "exp"], ops
    add = next(n for n in g.nodes if n.op == "add")
    assert add.inputs[0] is g.inputs[0] and add.inputs[1].shape == (6, 1, 4, 4)


@pytest.mark.parametrize("limit, folded", [(96, True), (95, False)])
def test_the_split_mask_bound_counts_what_is_written(monkeypatch, limit, folded):
    """The repeated mask is [6, 1, 4, 4] = 96 elements (its window dim becomes the scores'
    first dim; its head dim stays 1): the bound is on that, not on mask size x rows (Swin's
    first stage, 64 windows of 49 x 49, was refused: 64 x 153664 counted, 153664 written)."""
    from compiler.passes import sink
    monkeypatch.setattr(sink, "SPLIT_CONSTANT_ELEMENTS", limit)
    mask = RNG.standard_normal((1, 2, 1, 4, 4)).astype(np.float32)
    g, _, _ = _after_passes(WINDOW_MASK, {"m": mask})
    ops = [n.op for n in g.nodes if n.op != "const"]
    assert (ops == ["add", "exp"]) == folded, ops


def test_a_bias_added_before_the_reshaped_product_fuses_too():
    """The ONNX export of a Linear on [B, nW, N, C] writes Add(bias, reshape(MatMul)): add
    lets its operands trade places, so the bias still lands in the GEMM's epilogue."""
    text = """
graph g(%x: f32[1,4,5,8]) -> (%y) {
  %w = const() {value=@w} : f32[8,12]
  %b = const() {value=@b} : f32[12]
  %m = matmul(%x, %w) : f32[1,4,5,12]
  %r = reshape(%m) {shape=[20, 12]} : f32[20,12]
  %y = add(%b, %r) : f32[20,12]
}"""
    g, xs, want = _after_passes(text, {"w": W, "b": B})
    kernels = plan(g).kernels
    # the GEMM with the bias on its registers; the graph output's reshape is its own copy
    assert [[n.op for n in k.nodes] for k in kernels] == [["matmul", "add"], ["reshape"]]
    got = CpuStep(compile_graph(g), threads=1).run(xs)[0]
    np.testing.assert_allclose(got, want[0], rtol=1e-5, atol=1e-5)


# GPT-2's Conv1D and ViT's out-projection: a 2-d GEMM viewed back to [B, T, N], then the
# residual stream added
RESIDUAL = """
graph g(%x: f32[20,8], %res: f32[1,20,12]) -> (%y) {
  %w = const() {value=@w} : f32[8,12]
  %b = const() {value=@b} : f32[12]
  %m = matmul(%x, %w) : f32[20,12]
  %a = add(%m, %b) : f32[20,12]
  %r = reshape(%a) {shape=[1, 20, 12]} : f32[1,20,12]
  %s = add(%res, %r) : f32[1,20,12]
  %y = tanh(%s) : f32[1,20,12]
}"""


def test_a_residual_add_after_a_reshaped_projection_joins_its_epilogue():
    """The GEMM's epilogue adds the residual, read in its own buffer through the reshape
    (no copy of it, no loop kernel for the add), and the tanh after the reshape too;
    the cluster's output, the reshaped result, is the one copy left."""
    g, xs, want = _after_passes(RESIDUAL, {"w": W, "b": B})
    gemm_k, out_k = plan(g).kernels  # before: GEMM, loop kernel (reshape add tanh)
    assert gemm_k.contraction.op == "matmul" and gemm_k.impl.name == "gemm"
    assert sorted(n.op for n in gemm_k.nodes) == ["add", "add", "matmul", "reshape", "tanh"]
    assert [n.op for n in out_k.nodes] == ["reshape"]
    got = CpuStep(compile_graph(g), threads=2).run(xs)[0]
    np.testing.assert_allclose(got, want[0], rtol=1e-5, atol=1e-5)


def test_two_reshaped_products_added_settle():
    """Both operands reshaped matmul results: the add moves before the reshape, the two
    reshapes compose away and it reads both products; the pass ends (the rule never
    moves a reshape onto a product and back)."""
    g, _, _ = _after_passes("""
graph g(%x: f32[20,8]) -> (%y) {
  %w = const() {value=@w} : f32[8,12]
  %v = const() {value=@v} : f32[8,12]
  %m1 = matmul(%x, %w) : f32[20,12]
  %m2 = matmul(%x, %v) : f32[20,12]
  %r1 = reshape(%m1) {shape=[4, 5, 12]} : f32[4,5,12]
  %r2 = reshape(%m2) {shape=[4, 5, 12]} : f32[4,5,12]
  %y = add(%r1, %r2) : f32[4,5,12]
}""", {"w": W, "v": 2 * W})
    add = next(n for n in g.nodes if n.op == "add")
    assert [u.producer.op for u in add.inputs] == ["matmul", "matmul"]
    assert [n.op for n in g.nodes if n.op != "const"] == ["matmul", "matmul", "add",
                                                          "reshape"]
