"""IR core: text round-trip, verifier, inference errors."""

import numpy as np
import pytest

from compiler.interp import evaluate
from compiler.ir import Graph, IRError, TensorType, clone, verify
from compiler.text import constants, parse_graph, print_graph


def _sample():
    g = Graph()
    x = g.add_input("x", TensorType("f32", (2, 3)))
    b = g.const(np.arange(3, dtype=np.float32), "b")
    w = g.const(np.full((3, 3, 1, 1), 0.5, np.float32), "w")
    big = g.const(np.arange(40, dtype=np.float32).reshape(2, 20), "big")
    t = g.op("add", x, b)
    y = g.op("max", t, g.const(np.float32(0), "zero"))
    r = g.op("reshape", y, shape=(1, 3, 2, 1))
    c = g.op("conv", r, w, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1))
    s = g.op("reduce_sum", big, axes=(1,), keepdims=False)
    h = g.add_node("host", [c], dict(framework="onnx", op_type="TopK", payload=b"\x00x"),
                   name="odd/name:0",
                   out_types=[TensorType("f32", (1, 3, 2, 1)), TensorType("i64", (None,))])
    g.outputs = [c, s, h.outputs[1]]
    return g


def test_text_round_trip():
    g = _sample()
    verify(g)
    text = print_graph(g)
    g2 = parse_graph(text, constants(g))
    verify(g2)
    assert g2 == g
    assert print_graph(g2) == text
    assert print_graph(clone(g)) == text


def test_text_round_trip_of_large_constants_with_odd_names():
    """ONNX initializers may be named "1" or "w:0": their side-table refs are quoted."""
    g = Graph()
    x = g.add_input("x", TensorType("f32", (20,)))
    g.outputs = [g.op("add", x, g.const(np.arange(20, dtype=np.float32), "1"))]
    text = print_graph(g)
    assert '@"1"' in text
    assert parse_graph(text, constants(g)) == g


def test_golden_text():
    g = Graph()
    x = g.add_input("x", TensorType("f32", (4,)))
    g.outputs = [g.op("exp", g.op("neg", x))]
    assert str(g) == (
        "graph main(%x: f32[4]) -> (%exp) {\n"
        "  %neg = neg(%x) : f32[4]\n"
        "  %exp = exp(%neg) : f32[4]\n"
        "}\n"
    )


def test_verifier_catches_use_before_def_and_bad_types():
    g = _sample()
    g.nodes.reverse()
    with pytest.raises(IRError, match="not defined before"):
        verify(g)
    g = _sample()
    g.nodes[3].outputs[0].type = TensorType("f32", (9,))
    with pytest.raises(IRError, match="infers"):
        verify(g, after="bogus")


def test_inference_errors_name_the_node():
    g = Graph()
    a = g.add_input("a", TensorType("f32", (2, 3)))
    b = g.add_input("b", TensorType("f32", (4,)))
    with pytest.raises(IRError, match='add node "n1".*do not broadcast'):
        g.add_node("add", [a, b], name="n1")
    with pytest.raises(IRError, match="unknown op"):
        g.add_node("frobnicate", [a])


def test_interpreter_matches_numpy():
    g = _sample()
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    c, s = evaluate(g, [x], host_eval=lambda n, args: [args[0], np.zeros(3, np.int64)])[:2]
    y = np.maximum(x + np.arange(3, dtype=np.float32), 0).reshape(1, 3, 2, 1)
    expect = np.einsum("oi,nihw->nohw", np.full((3, 3), 0.5, np.float32), y)
    np.testing.assert_allclose(c, expect, rtol=1e-6)
    np.testing.assert_array_equal(s, np.arange(40, dtype=np.float32).reshape(2, 20).sum(1))


# -- readers kept incrementally; remove_dead in one pass ----------------------------------

def _fresh_users(g: Graph) -> dict:
    out: dict = {}
    for n in g.nodes:
        for v in n.inputs:
            out.setdefault(v, []).append(n)
    return {v: sorted(map(id, r)) for v, r in out.items()}


def _kept_users(g: Graph) -> dict:
    return {v: sorted(map(id, r)) for v, r in g.users().items() if r}


def test_users_is_kept_current_by_edits_not_rebuilt():
    g = Graph("g")
    x = g.add_input("x", TensorType("f32", (4,)))
    a = g.op("exp", x)
    b = g.op("add", a, a)  # read twice: counted twice
    g.outputs = [b]
    users = g.users()
    assert len(users[a]) == 2
    c = g.op("neg", x)
    assert g.users() is users and users[x] == [a.producer, c.producer]
    g.set_input(b.producer, 1, c)
    assert _kept_users(g) == _fresh_users(g) and len(users[a]) == 1
    g.replace_all_uses(a, c)
    assert a not in users and _kept_users(g) == _fresh_users(g)
    g.remove_node(a.producer)
    g.toposort()  # `neg` was appended after the add that now reads it
    assert g.users() is users and _kept_users(g) == _fresh_users(g)
    verify(g)


def test_verify_catches_inputs_edited_behind_the_graphs_back():
    g = Graph("g")
    x = g.add_input("x", TensorType("f32", (4,)))
    a = g.op("exp", x)
    b = g.op("neg", a)
    g.outputs = [b]
    g.users()
    b.producer.inputs[0] = x  # not through set_input: the readers map is now stale
    with pytest.raises(IRError, match="readers map is stale"):
        verify(g)


def test_remove_dead_is_one_pass_over_a_long_graph():
    """20,000 nodes, every other one dead: a list-membership test per node (the old
    quadratic version) took seconds here; one pass takes milliseconds."""
    import time

    g = Graph("g")
    x = g.add_input("x", TensorType("f32", (2,)))
    v = x
    for _ in range(10_000):
        g.op("exp", v)  # dead
        v = g.op("neg", v)
    g.outputs = [v]
    start = time.perf_counter()
    assert g.remove_dead() == 10_000
    assert time.perf_counter() - start < 1.0
    assert len(g.nodes) == 10_000 and all(n.op == "neg" for n in g.nodes)
    verify(g)


def test_constant_and_label_helpers():
    g = Graph("g")
    x = g.add_input("x", TensorType("f32", (2,)))
    c = g.const(np.array([1.0, 2.0], np.float32))
    y = g.op("add", x, c)
    h = g.add_node("host", [y], {"framework": "onnx", "domain": "", "op_type": "Foo",
                                 "reason": "no Foo", "payload": b""},
                   out_types=[TensorType("f32", (2,))])
    assert c.is_const and not x.is_const and not y.is_const
    np.testing.assert_array_equal(c.const_value, [1.0, 2.0])
    assert x.const_value is None and y.const_value is None
    assert y.producer.label == "add" and h.label == "Foo"
