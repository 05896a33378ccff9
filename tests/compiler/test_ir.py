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
