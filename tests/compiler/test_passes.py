"""Graph passes: golden IR text for each rule, numeric equivalence, verifier after each."""

import numpy as np
import pytest

from compiler.interp import evaluate
from compiler.ir import Graph, TensorType, verify
from compiler.passes.fold import fold_affine_into_contractions
from compiler.passes.pipeline import run_passes
from compiler.passes.simplify import (
    eliminate_common_subexpressions,
    fold_constants,
    simplify_identities,
)
from compiler.text import parse_graph, print_graph


def _run(text: str, passes) -> str:
    g = parse_graph(text)
    verify(g)
    for p in passes:
        p(g)
        verify(g, after=p.__name__)
    g.remove_dead()
    return print_graph(g)


def test_fold_constants_folds_shape_chain():
    out = _run("""
graph main(%x: f32[2,3]) -> (%y) {
  %a = const() {value=dense<i64[2]: [3, 2]>} : i64[2]
  %b = const() {value=dense<i64[2]: [1, 1]>} : i64[2]
  %s = add(%a, %b) : i64[2]
  %y = neg(%x) : f32[2,3]
}
""", [fold_constants])
    assert "add" not in out


def test_identities_golden():
    out = _run("""
graph main(%x: f32[2,3]) -> (%y) {
  %one = const() {value=dense<f32[]: [1.0]>} : f32[]
  %zero = const() {value=dense<f32[3]: [0.0, 0.0, 0.0]>} : f32[3]
  %m = mul(%x, %one) : f32[2,3]
  %a = add(%m, %zero) : f32[2,3]
  %t1 = transpose(%a) {perm=[1, 0]} : f32[3,2]
  %t2 = transpose(%t1) {perm=[1, 0]} : f32[2,3]
  %r1 = reshape(%t2) {shape=[6]} : f32[6]
  %r2 = reshape(%r1) {shape=[3, 2]} : f32[3,2]
  %y = exp(%r2) : f32[3,2]
}
""", [simplify_identities])
    assert out == (
        "graph main(%x: f32[2,3]) -> (%y) {\n"
        "  %r2 = reshape(%x) {shape=[3, 2]} : f32[3,2]\n"
        "  %y = exp(%r2) : f32[3,2]\n"
        "}\n")


def test_identity_keeps_broadcasting_add():
    text = """
graph main(%x: f32[3]) -> (%y) {
  %zero = const() {value=dense<f32[2,3]: [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]>} : f32[2,3]
  %y = add(%x, %zero) : f32[2,3]
}
"""
    assert "add" in _run(text, [simplify_identities])


def test_cse_merges_duplicates():
    out = _run("""
graph main(%x: f32[4]) -> (%y) {
  %a = exp(%x) : f32[4]
  %b = exp(%x) : f32[4]
  %y = add(%a, %b) : f32[4]
}
""", [eliminate_common_subexpressions])
    assert out.count("exp(") == 1 and "add(%a, %a)" in out


def _conv_bn_relu(with_bias: bool):
    rng = np.random.default_rng(0)
    g = Graph()
    x = g.add_input("x", TensorType("f32", (1, 3, 6, 6)))
    w = g.const(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    args = [x, w] + ([g.const(rng.standard_normal(4).astype(np.float32), "b")]
                     if with_bias else [])
    c = g.op("conv", *args, strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1))
    s = g.const(rng.uniform(0.5, 2, (4, 1, 1)).astype(np.float32), "scale")
    t = g.const(rng.standard_normal((4, 1, 1)).astype(np.float32), "shift")
    y = g.op("add", g.op("mul", c, s), t)
    g.outputs = [g.op("max", y, g.const(np.float32(0), "zero"))]
    return g


@pytest.mark.parametrize("with_bias", [False, True])
def test_batchnorm_folds_into_conv(with_bias):
    g = _conv_bn_relu(with_bias)
    x = np.random.default_rng(1).standard_normal((1, 3, 6, 6)).astype(np.float32)
    ref = evaluate(g, [x])[0]
    run_passes(g, verify_each=True)
    ops = [n.op for n in g.nodes if n.op != "const"]
    assert ops == ["conv", "max"]
    np.testing.assert_allclose(evaluate(g, [x])[0], ref, rtol=1e-5, atol=1e-5)


def test_gemm_bias_then_batchnorm_folds():
    rng = np.random.default_rng(2)
    g = Graph()
    x = g.add_input("x", TensorType("f32", (2, 5)))
    y = g.op("matmul", x, g.const(rng.standard_normal((5, 4)).astype(np.float32), "w"))
    y = g.op("add", y, g.const(rng.standard_normal(4).astype(np.float32), "bias"))
    y = g.op("mul", y, g.const(rng.uniform(0.5, 2, 4).astype(np.float32), "s"))
    g.outputs = [g.op("add", y, g.const(rng.standard_normal(4).astype(np.float32), "t"))]
    xv = rng.standard_normal((2, 5)).astype(np.float32)
    ref = evaluate(g, [xv])[0]
    assert fold_affine_into_contractions(g)
    run_passes(g, verify_each=True)
    assert [n.op for n in g.nodes if n.op != "const"] == ["matmul", "add"]
    np.testing.assert_allclose(evaluate(g, [xv])[0], ref, rtol=1e-5, atol=1e-5)


def test_fold_refuses_shared_intermediate():
    g = _conv_bn_relu(True)
    conv_out = next(n for n in g.nodes if n.op == "conv").outputs[0]
    g.outputs.append(conv_out)  # the unfolded conv result is needed too
    run_passes(g, verify_each=True)
    assert sum(n.op == "mul" for n in g.nodes) == 1
