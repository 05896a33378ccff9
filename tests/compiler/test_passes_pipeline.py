"""The pass pipeline: fixed point, verifier after each pass, errors that name the pass."""

import logging

import numpy as np
import pytest

from compiler.interp import evaluate
from compiler.ir import Graph, TensorType
from compiler.passes.pipeline import DEFAULT, MAX_ROUNDS, Entry, PassError, run_passes
from compiler.passes.simplify import fold_constants
from compiler.text import parse_graph

MIXED = """
graph main(%x: f32[1,2,4,4]) -> (%y) {
  %shape = const() {value=dense<i64[2]: [2, 16]>} : i64[2]
  %one = const() {value=dense<i64[]: [1]>} : i64[]
  %shape2 = add(%shape, %one) : i64[2]
  %w0 = const() {value=dense<f32[2,2,1,1]: [1.0, 2.0, 3.0, 4.0]>} : f32[2,2,1,1]
  %w = transpose(%w0) {perm=[0, 1, 3, 2]} : f32[2,2,1,1]
  %c = conv(%x, %w) {dilations=[1, 1], group=1, pads=[0, 0, 0, 0], strides=[1, 1]} : f32[1,2,4,4]
  %s = const() {value=dense<f32[2,1,1]: [2.0, 0.5]>} : f32[2,1,1]
  %m = mul(%c, %s) : f32[1,2,4,4]
  %m2 = mul(%c, %s) : f32[1,2,4,4]
  %t = const() {value=dense<f32[1,2,1,1]: [1.0, -1.0]>} : f32[1,2,1,1]
  %a = sub(%m, %t) : f32[1,2,4,4]
  %one_f = const() {value=dense<f32[]: [1.0]>} : f32[]
  %a1 = mul(%a, %one_f) : f32[1,2,4,4]
  %r = reshape(%a1) {shape=[2, 16]} : f32[2,16]
  %r2 = reshape(%r) {shape=[1, 2, 4, 4]} : f32[1,2,4,4]
  %y = max(%r2, %one_f) : f32[1,2,4,4]
}"""


def test_default_pipeline_reaches_a_fixed_point():
    g = parse_graph(MIXED)
    xs = [np.random.default_rng(0).standard_normal((1, 2, 4, 4)).astype(np.float32)]
    want = evaluate(g, xs)[0]
    assert run_passes(g, verify_each=True)
    assert [n.op for n in g.nodes if n.op != "const"] == ["conv", "max"]
    np.testing.assert_allclose(evaluate(g, xs)[0], want, rtol=1e-6)
    assert not run_passes(g, verify_each=True)  # a second run finds nothing to do


def test_every_entry_has_a_reason():
    assert all(isinstance(e, Entry) and len(e.why) > 20 for e in DEFAULT)
    assert len({e.name for e in DEFAULT}) == len(DEFAULT)


def _breaks_types(graph: Graph) -> bool:
    """A faulty pass: swaps an exp for a cast to i32 without fixing its output type."""
    for n in graph.nodes:
        if n.op == "exp":
            n.op, n.attrs = "cast", {"to": "i32"}
            return True
    return False


def _raises(graph: Graph) -> bool:
    raise KeyError("boom")


def _graph() -> Graph:
    g = Graph()
    g.outputs = [g.op("exp", g.add_input("x", TensorType("f32", (3,))))]
    return g


def test_verify_each_names_the_faulty_pass_and_those_before_it():
    passes = [Entry(fold_constants, "first"), Entry(_breaks_types, "the faulty one")]
    with pytest.raises(PassError, match=r"pass _breaks_types failed in round 1 "
                                        r"\(run before it this round: fold_constants\)"):
        run_passes(_graph(), passes, verify_each=True)


def test_without_verify_each_the_exit_check_still_catches_it():
    with pytest.raises(PassError, match="left an invalid graph.*after pass _breaks_types"):
        run_passes(_graph(), [Entry(_breaks_types, "the faulty one")])


def test_a_crashing_pass_is_named():
    with pytest.raises(PassError, match="pass _raises failed in round 1 .*nothing.*boom"):
        run_passes(_graph(), [Entry(_raises, "crashes")])


def test_invalid_input_graph_is_refused_on_entry():
    g = _graph()
    g.outputs[0].producer.op = "neg"
    g.outputs[0].producer.attrs = {"bogus": 1}
    with pytest.raises(PassError, match="given to the pass pipeline is invalid"):
        run_passes(g)


def test_a_pass_that_never_settles_is_bounded_and_logged(caplog):
    calls = []

    def restless(graph: Graph) -> bool:
        calls.append(1)
        return True

    with caplog.at_level(logging.WARNING, logger="braze.passes"):
        assert run_passes(_graph(), [Entry(restless, "always claims a change")])
    assert len(calls) == MAX_ROUNDS
    assert "did not settle" in caplog.text and "restless" in caplog.text
