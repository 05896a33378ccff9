"""Constant folding, dead code and CSE: golden IR text, numeric equivalence, verifier."""

import numpy as np
import pytest

from compiler import dtypes
from compiler.interp import evaluate
from compiler.ir import Graph, TensorType, verify
from compiler.passes import simplify
from compiler.passes.simplify import eliminate_common_subexpressions, fold_constants, remove_dead
from compiler.text import parse_graph, print_graph


def random_inputs(g: Graph, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    out = []
    for v in g.inputs:
        if v.dtype in dtypes.FLOATS:
            out.append(rng.uniform(-2, 2, v.shape).astype(dtypes.to_numpy(v.dtype)))
        elif v.dtype == "bool":
            out.append(rng.random(v.shape) < 0.5)
        else:
            out.append(rng.integers(-5, 6, v.shape).astype(dtypes.to_numpy(v.dtype)))
    return out


def golden(before: str, passes, after: str) -> Graph:
    """Run `passes` (then DCE) on `before`; the result must print as `after` and compute
    what `before` computes; the verifier runs after every pass."""
    g = parse_graph(before)
    verify(g)
    xs = random_inputs(g)
    want = evaluate(g, xs)
    for p in passes:
        p(g)
        verify(g, after=p.__name__)
    remove_dead(g)
    assert print_graph(g) == print_graph(parse_graph(after))
    for got, ref in zip(evaluate(g, xs), want):
        np.testing.assert_array_equal(got, ref)
    return g


def test_fold_constants_shape_chain_keeps_value_names():
    golden("""
graph main(%x: f32[2,3]) -> (%y, %s) {
  %a = const() {value=dense<i64[2]: [3, 2]>} : i64[2]
  %b = const() {value=dense<i64[2]: [1, 1]>} : i64[2]
  %s = add(%a, %b) : i64[2]
  %y = neg(%x) : f32[2,3]
}""", [fold_constants], """
graph main(%x: f32[2,3]) -> (%y, %s) {
  %s = const() {value=dense<i64[2]: [4, 3]>} : i64[2]
  %y = neg(%x) : f32[2,3]
}""")


def test_fold_constants_transposes_a_weight():
    g = Graph()
    x = g.add_input("x", TensorType("f32", (2, 8)))
    w = g.const(np.arange(64, dtype=np.float32).reshape(8, 8) + 0.5, "w")
    g.outputs = [g.op("matmul", x, g.op("transpose", w, perm=(1, 0)))]
    xs = random_inputs(g)
    want = evaluate(g, xs)
    assert fold_constants(g)
    remove_dead(g)
    verify(g)
    assert [n.op for n in g.nodes] == ["const", "matmul"]
    np.testing.assert_array_equal(evaluate(g, xs)[0], want[0])


def test_fold_constants_reorders_a_weight_of_any_size_but_computes_nothing_that_large(
        monkeypatch):
    """Above FOLD_MAX_ELEMENTS only a transpose or reshape of a constant folds (it
    reorders elements the model holds already: VGG's 25088 x 4096 W^T)."""
    monkeypatch.setattr(simplify, "FOLD_MAX_ELEMENTS", 16)
    g = Graph()
    x = g.add_input("x", TensorType("f32", (2, 8)))
    w = g.const(np.arange(64, dtype=np.float32).reshape(8, 8), "w")
    t = g.op("transpose", w, perm=(1, 0))
    neg = g.op("neg", w)
    assert simplify.fold_refusal(t.producer) is None
    assert "FOLD_MAX_ELEMENTS" in simplify.fold_refusal(neg.producer)
    g.outputs = [g.op("matmul", x, t), neg]
    xs = random_inputs(g)
    want = evaluate(g, xs)
    assert fold_constants(g)
    remove_dead(g)
    verify(g)
    assert sorted(n.op for n in g.nodes if n.op != "const") == ["matmul", "neg"]
    for got, ref in zip(evaluate(g, xs), want):
        np.testing.assert_array_equal(got, ref)


def test_fold_constants_refuses_growth():
    g = Graph()
    big = g.op("broadcast", g.const(np.float32(1.5)), shape=(128, 128))
    g.outputs = [big]
    assert simplify.fold_refusal(big.producer).startswith("its result (16384 elements)")
    assert not fold_constants(g)


def test_a_contraction_weight_may_outgrow_its_inputs():
    # ONNX models that build weights with ConstantOfShape: a scalar broadcast to a conv's
    # kernel is folded, so the kernel can pack it (a bare broadcast elsewhere is not)
    g = Graph()
    x = g.add_input("x", TensorType("f32", (1, 16, 8, 8)))
    w = g.op("broadcast", g.const(np.float32(0.5)), shape=(64, 16, 3, 3))
    y = g.op("conv", x, w, strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), group=1)
    g.outputs = [y]
    assert simplify.fold_refusal(w.producer) is not None
    assert fold_constants(g)
    conv = next(n for n in g.nodes if n.op == "conv")
    assert conv.inputs[1].is_const and conv.inputs[1].const_value.shape == (64, 16, 3, 3)


def test_fold_constants_leaves_failing_evaluation_for_run_time():
    g = Graph()
    data = g.const(np.arange(4, dtype=np.float32))
    g.outputs = [g.op("gather", data, g.const(np.array([7], np.int64)), axis=0)]
    assert not fold_constants(g)
    assert g.nodes[-1].op == "gather"


def test_dead_code_removed():
    golden("""
graph main(%x: f32[4]) -> (%y) {
  %unused = exp(%x) : f32[4]
  %unused2 = neg(%unused) : f32[4]
  %y = abs(%x) : f32[4]
}""", [remove_dead], """
graph main(%x: f32[4]) -> (%y) {
  %y = abs(%x) : f32[4]
}""")


def test_cse_merges_ops_and_equal_constants():
    golden("""
graph main(%x: f32[4]) -> (%y) {
  %c1 = const() {value=dense<f32[]: [2.0]>} : f32[]
  %c2 = const() {value=dense<f32[]: [2.0]>} : f32[]
  %a = mul(%x, %c1) : f32[4]
  %b = mul(%x, %c2) : f32[4]
  %y = add(%a, %b) : f32[4]
}""", [eliminate_common_subexpressions], """
graph main(%x: f32[4]) -> (%y) {
  %c1 = const() {value=dense<f32[]: [2.0]>} : f32[]
  %a = mul(%x, %c1) : f32[4]
  %y = add(%a, %a) : f32[4]
}""")


@pytest.mark.parametrize("c1,c2", [
    ("dense<f32[]: [0.0]>", "dense<f32[]: [-0.0]>"),   # equal by ==, different values
    ("dense<f32[]: [1.0]>", "dense<f64[]: [1.0]>"),    # same number, different dtype
    ("dense<i32[]: [1]>", "dense<i64[]: [1]>"),
])
def test_cse_keeps_constants_that_differ(c1, c2):
    g = parse_graph(f"""
graph main() -> (%a, %b) {{
  %a = const() {{value={c1}}} : {c1[6:c1.index(":")]}
  %b = const() {{value={c2}}} : {c2[6:c2.index(":")]}
}}""")
    assert not eliminate_common_subexpressions(g)


def test_cse_merges_nan_constants_and_nan_attributes():
    g = parse_graph("""
graph main(%x: f32[2]) -> (%y) {
  %n1 = const() {value=dense<f32[]: [nan]>} : f32[]
  %n2 = const() {value=dense<f32[]: [nan]>} : f32[]
  %p1 = pad(%x) {pads=[1, 0], value=nan} : f32[3]
  %p2 = pad(%x) {pads=[1, 0], value=nan} : f32[3]
  %a = max(%p1, %n1) : f32[3]
  %b = max(%p2, %n2) : f32[3]
  %y = add(%a, %b) : f32[3]
}""")
    assert eliminate_common_subexpressions(g)
    remove_dead(g)
    verify(g)
    assert [n.op for n in g.nodes] == ["const", "pad", "max", "add"]


def test_cse_skips_host_nodes_and_keeps_two_graph_outputs_apart():
    g = parse_graph("""
graph main(%x: f32[2]) -> (%a, %b, %h1, %h2) {
  %a = exp(%x) : f32[2]
  %b = exp(%x) : f32[2]
  %h1 = host(%x) {framework="onnx", op_type="RandomNormalLike"} : f32[2]
  %h2 = host(%x) {framework="onnx", op_type="RandomNormalLike"} : f32[2]
}""")
    assert not eliminate_common_subexpressions(g)
    assert len(g.nodes) == 4


def _large_const_graph(w1: np.ndarray, w2: np.ndarray) -> Graph:
    """Two matmuls reading two weight constants of more than CSE_CONST_ELEMENTS elements,
    as a torch.fx graph of a model sharing its layers' weights has them after folding."""
    return parse_graph("""
graph main(%x: f32[3,96]) -> (%y) {
  %w1 = const() {value=@w1} : f32[96,64]
  %w2 = const() {value=@w2} : f32[96,64]
  %a = matmul(%x, %w1) : f32[3,64]
  %b = matmul(%x, %w2) : f32[3,64]
  %y = add(%a, %b) : f32[3,64]
}""", {"w1": w1, "w2": w2})


def test_cse_merges_large_constants_with_equal_bytes():
    """Equal weights made by separate folds (distinct arrays) become one constant, so
    they are packed and read once; the result is the same."""
    w = np.random.default_rng(0).standard_normal((64, 96)).astype(np.float32)
    assert w.size > simplify.CSE_CONST_ELEMENTS
    g = _large_const_graph(np.ascontiguousarray(w.T), np.ascontiguousarray(w.T))
    xs = random_inputs(g)
    want = evaluate(g, xs)
    assert eliminate_common_subexpressions(g)
    remove_dead(g)
    verify(g)
    assert [n.op for n in g.nodes].count("const") == 1
    np.testing.assert_array_equal(evaluate(g, xs)[0], want[0])


@pytest.mark.parametrize("where", [0, 1, 4321, -1])
def test_cse_keeps_large_constants_that_differ_anywhere(where):
    """Weights equal in every sampled element but one byte apart elsewhere (or at a
    sampled place) stay two constants."""
    w1 = np.random.default_rng(1).standard_normal((96, 64)).astype(np.float32)
    w2 = w1.copy()
    w2.reshape(-1)[where] = np.nextafter(w2.reshape(-1)[where], np.float32(np.inf))
    g = _large_const_graph(w1, w2)
    assert not eliminate_common_subexpressions(g)
    neg = w1.copy()
    neg.reshape(-1)[7] = 0.0
    pos = neg.copy()
    neg.reshape(-1)[7] = -0.0  # equal by ==, not by bytes
    assert not eliminate_common_subexpressions(_large_const_graph(neg, pos))
