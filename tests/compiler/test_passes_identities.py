"""Algebraic identity rules: a golden test per rule, refusals, and hypothesis properties."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler import dtypes
from compiler.interp import evaluate
from compiler.ir import Graph, TensorType, verify
from compiler.passes.identities import lossless, simplify_identities
from compiler.passes.simplify import remove_dead
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


def simplified(text: str) -> tuple[str, Graph]:
    """The graph after one sweep of identities and DCE (verified); results unchanged."""
    g = parse_graph(text)
    verify(g)
    xs = random_inputs(g)
    want = evaluate(g, xs)
    simplify_identities(g)
    verify(g, after="simplify_identities")
    remove_dead(g)
    for got, ref in zip(evaluate(g, xs), want):
        np.testing.assert_array_equal(got, ref)
    return print_graph(g), g


def assert_golden(before: str, after: str) -> None:
    assert simplified(before)[0] == print_graph(parse_graph(after))


ONLY_X = "graph main(%x: {t}) -> (%y) {{\n  %y = exp(%x) : {t}\n}}"


@pytest.mark.parametrize("op,const,first", [
    ("add", "0.0", False), ("add", "0.0", True), ("sub", "0.0", False),
    ("mul", "1.0", False), ("mul", "1.0", True), ("div", "1.0", False),
    ("pow", "1.0", False), ("max", "-inf", False), ("min", "inf", True),
])
def test_neutral_operand(op, const, first):
    args = "%c, %x" if first else "%x, %c"
    assert_golden(f"""
graph main(%x: f32[2,3]) -> (%y) {{
  %c = const() {{value=dense<f32[3]: [{const}, {const}, {const}]>}} : f32[3]
  %n = {op}({args}) : f32[2,3]
  %y = exp(%n) : f32[2,3]
}}""", ONLY_X.format(t="f32[2,3]"))


@pytest.mark.parametrize("op,const", [("bitor", "0"), ("bitxor", "0"), ("max", "-128"),
                                      ("min", "127")])
def test_neutral_operand_integers(op, const):
    assert_golden(f"""
graph main(%x: i8[4]) -> (%y) {{
  %c = const() {{value=dense<i8[]: [{const}]>}} : i8[]
  %n = {op}(%x, %c) : i8[4]
  %y = neg(%n) : i8[4]
}}""", "graph main(%x: i8[4]) -> (%y) {\n  %y = neg(%x) : i8[4]\n}")


@pytest.mark.parametrize("text,reason_op", [
    # the constant broadcasts x to a larger shape: the add must stay
    ("""graph main(%x: f32[3]) -> (%y) {
  %zero = const() {value=dense<f32[2,3]: [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]>} : f32[2,3]
  %y = add(%x, %zero) : f32[2,3]
}""", "add"),
    # 0 - x is not x
    ("""graph main(%x: f32[3]) -> (%y) {
  %zero = const() {value=dense<f32[]: [0.0]>} : f32[]
  %y = sub(%zero, %x) : f32[3]
}""", "sub"),
    # the result is a graph output and x a graph input: each output keeps its own value
    ("""graph main(%x: f32[3]) -> (%y) {
  %one = const() {value=dense<f32[]: [1.0]>} : f32[]
  %y = mul(%x, %one) : f32[3]
}""", "mul"),
])
def test_neutral_operand_refusals(text, reason_op):
    out, _ = simplified(text)
    assert f"= {reason_op}(" in out


def test_involutions_and_select():
    assert_golden("""
graph main(%x: f32[4], %b: bool[4]) -> (%y, %z) {
  %t = const() {value=dense<bool[]: [true]>} : bool[]
  %n1 = neg(%x) : f32[4]
  %n2 = neg(%n1) : f32[4]
  %s = select(%t, %n2, %x) : f32[4]
  %s2 = select(%b, %s, %s) : f32[4]
  %y = exp(%s2) : f32[4]
  %b1 = not(%b) : bool[4]
  %b2 = not(%b1) : bool[4]
  %z = not(%b2) : bool[4]
}""", """
graph main(%x: f32[4], %b: bool[4]) -> (%y, %z) {
  %y = exp(%x) : f32[4]
  %z = not(%b) : bool[4]
}""")


def test_cast_rules():
    assert_golden("""
graph main(%x: i16[4], %f: f32[4]) -> (%y, %z) {
  %a = cast(%x) {to="i32"} : i32[4]
  %b = cast(%a) {to="f32"} : f32[4]
  %c = cast(%b) {to="f32"} : f32[4]
  %y = exp(%c) : f32[4]
  %g = cast(%f) {to="i32"} : i32[4]
  %h = cast(%g) {to="f32"} : f32[4]
  %z = exp(%h) : f32[4]
}""", """
graph main(%x: i16[4], %f: f32[4]) -> (%y, %z) {
  %b = cast(%x) {to="f32"} : f32[4]
  %y = exp(%b) : f32[4]
  %g = cast(%f) {to="i32"} : i32[4]
  %h = cast(%g) {to="f32"} : f32[4]
  %z = exp(%h) : f32[4]
}""")


def test_lossless_table():
    assert lossless("i16", "f32") and lossless("u8", "f16") and lossless("f16", "f64")
    assert lossless("bool", "i8") and lossless("u32", "i64") and lossless("bf16", "f32")
    assert not lossless("i64", "f64") and not lossless("i32", "f32")
    assert not lossless("i8", "u64") and not lossless("f32", "i64")
    assert not lossless("f16", "bf16") and not lossless("bf16", "f16")


def test_movement_compositions():
    assert_golden("""
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
}""", """
graph main(%x: f32[2,3]) -> (%y) {
  %r2 = reshape(%x) {shape=[3, 2]} : f32[3,2]
  %y = exp(%r2) : f32[3,2]
}""")


def test_transpose_composition_and_transpose_as_reshape():
    assert_golden("""
graph main(%x: f32[2,3,4], %u: f32[2,1,3]) -> (%y, %z) {
  %t1 = transpose(%x) {perm=[1, 2, 0]} : f32[3,4,2]
  %t2 = transpose(%t1) {perm=[0, 2, 1]} : f32[3,2,4]
  %y = exp(%t2) : f32[3,2,4]
  %t3 = transpose(%u) {perm=[1, 0, 2]} : f32[1,2,3]
  %z = exp(%t3) : f32[1,2,3]
}""", """
graph main(%x: f32[2,3,4], %u: f32[2,1,3]) -> (%y, %z) {
  %t2 = transpose(%x) {perm=[1, 0, 2]} : f32[3,2,4]
  %y = exp(%t2) : f32[3,2,4]
  %t3 = reshape(%u) {shape=[1, 2, 3]} : f32[1,2,3]
  %z = exp(%t3) : f32[1,2,3]
}""")


def test_slice_broadcast_and_noop_movement():
    assert_golden("""
graph main(%x: f32[10], %v: f32[3]) -> (%y, %z) {
  %s1 = slice(%x) {sizes=[4], starts=[1], steps=[2]} : f32[4]
  %s2 = slice(%s1) {sizes=[2], starts=[1], steps=[2]} : f32[2]
  %y = exp(%s2) : f32[2]
  %b0 = broadcast(%v) {shape=[3]} : f32[3]
  %b1 = broadcast(%b0) {shape=[2,3]} : f32[2,3]
  %b2 = broadcast(%b1) {shape=[4,2,3]} : f32[4,2,3]
  %p = pad(%b2) {pads=[0, 0, 0, 0, 0, 0]} : f32[4,2,3]
  %c = concat(%p) {axis=0} : f32[4,2,3]
  %r = reduce_sum(%c) {axes=[]} : f32[4,2,3]
  %full = slice(%r) {sizes=[4, 2, 3], starts=[0, 0, 0], steps=[1, 1, 1]} : f32[4,2,3]
  %z = exp(%full) : f32[4,2,3]
}""", """
graph main(%x: f32[10], %v: f32[3]) -> (%y, %z) {
  %s2 = slice(%x) {sizes=[2], starts=[3], steps=[4]} : f32[2]
  %y = exp(%s2) : f32[2]
  %b2 = broadcast(%v) {shape=[4,2,3]} : f32[4,2,3]
  %z = exp(%b2) : f32[4,2,3]
}""")


def test_reduce_over_unit_axes_is_a_reshape():
    assert_golden("""
graph main(%x: f32[3,1,4]) -> (%y, %z) {
  %r = reduce_max(%x) {axes=[1], keepdims=false} : f32[3,4]
  %y = exp(%r) : f32[3,4]
  %k = reduce_sum(%x) {axes=[1], keepdims=true} : f32[3,1,4]
  %z = exp(%k) : f32[3,1,4]
}""", """
graph main(%x: f32[3,1,4]) -> (%y, %z) {
  %r = reshape(%x) {shape=[3, 4]} : f32[3,4]
  %y = exp(%r) : f32[3,4]
  %z = exp(%x) : f32[3,1,4]
}""")


# -- properties: random chains of identity-shaped ops compute what they did -----

# (op text template, neutral const): each wraps the current value %v{i}
_WRAPPERS = [
    ("add(%v, %c{k})", "0.0"), ("mul(%c{k}, %v)", "1.0"), ("sub(%v, %c{k})", "0.0"),
    ("div(%v, %c{k})", "1.0"), ("max(%v, %c{k})", "-inf"), ("min(%v, %c{k})", "inf"),
    ("neg(%v)", None), ("transpose(%v) {{perm=[1, 0]}}", None),
    ("reshape(%v) {{shape=[{a}, {b}]}}", None), ("cast(%v) {{to=\"f64\"}}", None),
    ("cast(%v) {{to=\"f32\"}}", None), ("exp(%v)", None),
]


@st.composite
def identity_chain(draw):
    a, b = draw(st.sampled_from([(2, 3), (1, 6), (3, 1), (4, 4)]))
    lines, shape, dtype = [], (a, b), "f32"
    for k in range(draw(st.integers(1, 10))):
        text, neutral = draw(st.sampled_from(_WRAPPERS))
        if "transpose" in text:
            shape = shape[::-1]
        if "reshape" in text:
            shape = draw(st.sampled_from([shape, shape[::-1], (1, shape[0] * shape[1])]))
        if "cast" in text:
            dtype = "f64" if "f64" in text else "f32"
        if neutral is not None:
            lines.append(f"  %c{k} = const() {{value=dense<{dtype}[]: [{neutral}]>}} : {dtype}[]")
        op = text.format(k=k, a=shape[0], b=shape[1]).replace("%v", f"%v{k}")
        lines.append(f"  %v{k + 1} = {op} : {dtype}[{shape[0]},{shape[1]}]")
    body = "\n".join(lines)
    return (f"graph main(%v0: f32[{a},{b}]) -> (%out) {{\n{body}\n"
            f"  %out = abs(%v{k + 1}) : {dtype}[{shape[0]},{shape[1]}]\n}}")


@settings(max_examples=120, deadline=None)
@given(identity_chain())
def test_identity_rules_preserve_results(text):
    _, g = simplified(text)  # asserts equal results and a valid graph
    # every neutral operand, no-op and inverse pair is gone after one sweep
    for n in g.nodes:
        assert n.op not in ("add", "sub", "mul", "div", "max", "min"), text
        if n.op == "transpose":
            assert list(n.attrs["perm"]) != [0, 1]
            assert n.inputs[0].producer is None or n.inputs[0].producer.op != "transpose"
        if n.op in ("reshape", "cast"):
            assert n.outputs[0].type != n.inputs[0].type
        if n.op == "neg":
            assert n.inputs[0].producer is None or n.inputs[0].producer.op != "neg"


def test_rules_leave_a_graph_without_identities_alone():
    g = Graph()
    x = g.add_input("x", TensorType("f32", (2, 3)))
    g.outputs = [g.op("exp", g.op("transpose", x, perm=(1, 0)))]
    assert not simplify_identities(g)


def test_division_by_a_power_of_two_becomes_a_multiply_and_others_stay():
    text, g = simplified("""
graph g(%x: f32[16]) -> (%y, %z) {
  %c = const() {value=dense<f32[]: [0.25]>} : f32[]
  %s = const() {value=dense<f32[]: [6.0]>} : f32[]
  %y = div(%x, %c) : f32[16]
  %z = div(%x, %s) : f32[16]
}""")
    ops = [n.op for n in g.nodes if n.op != "const"]
    assert ops == ["mul", "div"], text  # 1/6 is not exact: x / 6 stays a division
    mul = next(n for n in g.nodes if n.op == "mul")
    assert float(mul.inputs[1].const_value) == 4.0
    x = np.array([3.0, 1e-38, 3e38, -7.5, np.inf, np.nan], np.float32)
    np.testing.assert_array_equal(x * np.float32(4.0), x / np.float32(0.25))


def test_pow_by_a_small_integer_becomes_multiplies_and_others_stay():
    g = parse_graph("""
graph g(%x: f32[64]) -> (%a, %b, %c, %d, %e) {
  %two = const() {value=dense<f32[]: [2.0]>} : f32[]
  %three = const() {value=dense<f32[]: [3.0]>} : f32[]
  %four = const() {value=dense<f32[]: [4.0]>} : f32[]
  %minus = const() {value=dense<f32[]: [-1.0]>} : f32[]
  %half = const() {value=dense<f32[]: [0.5]>} : f32[]
  %a = pow(%x, %two) : f32[64]
  %b = pow(%x, %three) : f32[64]
  %c = pow(%x, %four) : f32[64]
  %d = pow(%x, %minus) : f32[64]
  %e = pow(%x, %half) : f32[64]
}""")
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-3, 3, 56), [0.0, -0.0, 1e-20, -1e12, np.inf, -np.inf,
                                                   np.nan, 7.0]]).astype(np.float32)
    want = evaluate(g, [x])
    assert simplify_identities(g)
    remove_dead(g)
    verify(g)
    ops = sorted(n.op for n in g.nodes if n.op != "const")
    # a: 1 mul, b: 2, c: 2 (the square reused), d: a division, e: pow stays (x ** 0.5
    # differs from sqrt at -0 and -inf)
    assert ops == ["div", "mul", "mul", "mul", "mul", "mul", "pow"], ops
    for got, ref in zip(evaluate(g, [x]), want):
        np.testing.assert_allclose(got, ref, rtol=2.5e-7, atol=0, equal_nan=True)
    np.testing.assert_array_equal(evaluate(g, [x])[0], want[0])  # x * x is exact


def test_erf_of_a_quotient_multiplies_by_the_reciprocal():
    g = parse_graph("""
graph g(%x: f32[256], %w: f32[256]) -> (%y, %z, %q) {
  %s = const() {value=dense<f32[]: [1.4142135]>} : f32[]
  %t = const() {value=dense<f32[]: [3.0]>} : f32[]
  %d = div(%x, %s) : f32[256]
  %y = erf(%d) : f32[256]
  %q = div(%w, %t) : f32[256]
  %z = erf(%q) : f32[256]
}""")
    rng = np.random.default_rng(1)
    xs = [rng.uniform(-5, 5, 256).astype(np.float32) for _ in range(2)]
    want = evaluate(g, xs)
    assert simplify_identities(g)
    remove_dead(g)
    verify(g)
    # the GELU's quotient becomes a multiply; the other is a graph output, so it stays
    assert sorted(n.op for n in g.nodes if n.op != "const") == ["div", "erf", "erf", "mul"]
    for got, ref in zip(evaluate(g, xs), want):
        np.testing.assert_allclose(got, ref, rtol=3e-7, atol=1e-7)


@pytest.mark.parametrize("a_shape,w_shape,rewritten", [
    ((1, 5, 8), (1, 8, 6), True),       # aten's einsum projection: a unit batch dim
    ((2, 3, 5, 8), (1, 1, 8, 6), True),
    ((5, 8), (1, 8, 6), False),         # the weight's unit dim adds a dim to the product
    ((2, 5, 8), (2, 8, 6), False),      # a real batch of weights
])
def test_unit_batch_weight_becomes_2d(a_shape, w_shape, rewritten):
    """A matmul's constant right operand with unit batch dims becomes its 2-d matrix
    (the packed GEMM's form), where that leaves the product's shape as it was; the same
    numbers either way."""
    from compiler.kernels import choice

    rng = np.random.default_rng(0)
    w = rng.standard_normal(w_shape).astype(np.float32)
    out = np.broadcast_shapes(a_shape[:-2], w_shape[:-2]) + (a_shape[-2], w_shape[-1])
    dims = lambda s: ",".join(map(str, s))  # noqa: E731
    g = parse_graph(f"""
graph mm(%a: f32[{dims(a_shape)}]) -> (%y) {{
  %w = const() {{value=@w}} : f32[{dims(w_shape)}]
  %y = matmul(%a, %w) : f32[{dims(out)}]
}}
""", {"w": w})
    a = rng.standard_normal(a_shape).astype(np.float32)
    want = evaluate(g, [a])[0]
    assert simplify_identities(g) == rewritten
    remove_dead(g)
    verify(g)
    mm = next(n for n in g.nodes if n.op == "matmul")
    assert (mm.inputs[1].shape == w_shape[-2:]) == rewritten
    assert (choice.choose(mm).name == choice.GEMM) == rewritten
    np.testing.assert_allclose(evaluate(g, [a])[0], want, rtol=1e-6, atol=1e-6)


def _chain_graph(steps: int, width: int, start: int = 0) -> tuple[Graph, list]:
    """A loop writing row t of a (steps, width) buffer at step t (t >= start), each write
    a gather from concat(buffer, row) (importers/scans.scatter_nd_ir's form):
    out[t] = x[t] * h, then h = h + out[t]."""
    g = Graph("rows")
    x = g.add_input("x", TensorType("f32", (steps, width)))
    h = g.add_input("h", TensorType("f32", (width,)))
    total = steps * width
    buf = g.const(np.zeros(total, np.float32), "zeros")
    for t in range(start, steps):
        row = g.op("reshape", g.op("slice", x, starts=(t, 0), steps=(1, 1), sizes=(1, width)),
                   shape=(width,))
        out = g.op("mul", row, h)
        h = g.op("add", h, out)
        source = np.arange(total, dtype=np.int64)
        source[t * width:(t + 1) * width] = total + np.arange(width)
        both = g.op("concat", g.op("reshape", buf, shape=(total,)), out, axis=0)
        buf = g.op("reshape", g.op("gather", both, g.const(source, "source"), axis=0),
                   shape=(steps, width))
    g.outputs = [buf]
    return g, g.nodes


@pytest.mark.parametrize("start", [0, 3])  # every row written; the first 3 left zero
def test_a_chain_of_constant_row_writes_becomes_one_concat(start):
    steps, width = 12, 16
    g, _ = _chain_graph(steps, width, start)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((steps, width)).astype(np.float32),
          rng.standard_normal(width).astype(np.float32)]
    want = evaluate(g, xs)
    for _ in range(3):
        simplify_identities(g)
    remove_dead(g)
    verify(g)
    assert not any(n.op == "gather" for n in g.nodes)
    concats = [n for n in g.nodes if n.op == "concat"]
    assert len(concats) == 1  # the rows (and the zeros left), side by side
    assert len(concats[0].inputs) == steps - start + (1 if start else 0)
    np.testing.assert_array_equal(evaluate(g, xs)[0], want[0])


@pytest.mark.parametrize("index,stays", [
    (np.random.default_rng(0).permutation(64), True),  # runs of 1: a gather is cheaper
    (np.concatenate([np.arange(32, 64), np.arange(0, 32)]), False),  # two runs: a concat
    (np.concatenate([np.arange(0, 63), [64]]), True),  # out of range: the gather faults
    (np.arange(-64, 0), False),  # negative indices count from the end: x itself
])
def test_constant_gathers_slice_only_long_runs_in_range(index, stays):
    g = Graph("g")
    x = g.add_input("x", TensorType("f32", (64,)))
    y = g.op("exp", g.op("gather", x, g.const(index.astype(np.int64)), axis=0))
    g.outputs = [y]
    xs = [np.random.default_rng(1).standard_normal(64).astype(np.float32)]
    want = None if index.max() >= 64 else evaluate(g, xs)[0]
    simplify_identities(g)
    remove_dead(g)
    assert any(n.op == "gather" for n in g.nodes) == stays
    if want is not None:
        np.testing.assert_array_equal(evaluate(g, xs)[0], want)


def _strided_write(rows: int, width: int, kept: int, lead: int = 0) -> tuple[Graph, list]:
    """torch's x.view(rows, width)[:, lead:lead + kept] *= m after functionalization: an
    as_strided_scatter of the product into x's storage, a gather from concat(x, update)
    (importers/fx_misc.py) whose index switches source twice per row."""
    g = Graph("strided")
    x = g.add_input("x", TensorType("f32", (rows * width,)))
    m = g.add_input("m", TensorType("f32", (kept,)))
    view = g.op("slice", g.op("reshape", x, shape=(rows, width)), starts=(0, lead),
                steps=(1, 1), sizes=(rows, kept))
    update = g.op("reshape", g.op("mul", view, m), shape=(rows * kept,))
    source = np.arange(rows * width, dtype=np.int64).reshape(rows, width)
    source[:, lead:lead + kept] = rows * width + np.arange(rows * kept).reshape(rows, kept)
    both = g.op("concat", x, update, axis=0)
    g.outputs = [g.op("exp", g.op("gather", both, g.const(source.reshape(-1), "source"),
                                  axis=0))]
    rng = np.random.default_rng(2)
    return g, [rng.standard_normal(rows * width).astype(np.float32),
               rng.standard_normal(kept).astype(np.float32)]


@pytest.mark.parametrize("rows,width,kept,lead", [
    (1536, 255, 128, 0),  # Funnel's relative shift: 3072 runs, two per row
    (700, 40, 24, 8),  # a stretch kept on each side
    (600, 16, 15, 1),  # short rows
])
def test_a_strided_write_becomes_one_concat_of_rows(rows, width, kept, lead):
    g, xs = _strided_write(rows, width, kept, lead)
    want = evaluate(g, xs)[0]
    simplify_identities(g)
    remove_dead(g)
    verify(g)
    assert not any(n.op == "gather" for n in g.nodes)
    cat = next(n for n in g.nodes if n.op == "concat" and n.attrs["axis"] == 1)
    assert [u.shape for u in cat.inputs] == [s for s in [(rows, lead), (rows, kept),
                                                         (rows, width - lead - kept)] if s[1]]
    np.testing.assert_array_equal(evaluate(g, xs)[0], want)


def test_an_index_without_a_row_pattern_stays_a_gather():
    """Runs of 16 whose sources move by uneven steps from row to row: no 2-d view."""
    starts = np.random.default_rng(3).permutation(2000)[:1600] * 8
    index = (starts[:, None] + np.arange(16)).reshape(-1)
    g = Graph("g")
    x = g.add_input("x", TensorType("f32", (16016,)))
    g.outputs = [g.op("gather", x, g.const(index.astype(np.int64)), axis=0)]
    simplify_identities(g)
    assert any(n.op == "gather" for n in g.nodes)


def test_a_short_gather_of_one_run_stays():
    """Fewer elements than one run needs to be worth a slice, and no break between runs
    to look for rows at."""
    g = Graph("g")
    x = g.add_input("x", TensorType("f32", (8,)))
    g.outputs = [g.op("gather", x, g.const(np.arange(2, 5, dtype=np.int64)), axis=0)]
    simplify_identities(g)
    assert any(n.op == "gather" for n in g.nodes)
