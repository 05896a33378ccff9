"""Clustering: structure on a known graph; properties on random DAGs (hypothesis)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.interp import evaluate
from compiler.ir import Graph, TensorType, verify
from compiler.passes.cluster import describe_partition, outline, partition

UNARY = ["neg", "exp", "abs", "sin"]
BINARY = ["add", "mul", "sub", "max"]


def _host_marked(names):
    """supports(): nodes whose op is in `names` are refused (as if not compilable)."""
    return lambda n: f"{n.op} refused by the test" if n.op in names else None


def _run_clusters(g: Graph, clusters, inputs):
    env = dict(zip(g.inputs, inputs))
    for c in clusters:
        sub = outline(g, c)
        verify(sub)
        outs = evaluate(sub, [env[v] for v in c.inputs])
        env.update(zip(c.outputs, outs))
    return [env[v] for v in g.outputs]


def test_host_node_splits_around_and_no_cycle():
    # x -> exp -> [sin: host] -> add(exp, sin): exp and add must not share a cluster
    # unless sin joins too (it cannot: host), so the compiled part splits in two.
    g = Graph()
    x = g.add_input("x", TensorType("f32", (64, 64)))
    e = g.op("exp", x)
    s = g.op("sin", e)
    g.outputs = [g.op("add", e, s)]
    clusters = partition(g, _host_marked({"sin"}))
    kinds = [(c.kind, [n.op for n in c.nodes]) for c in clusters]
    assert kinds == [("compiled", ["exp"]), ("host", ["sin"]), ("compiled", ["add"])]
    text = describe_partition(clusters)
    assert "sin refused by the test" in text and "2 of 3 nodes compiled" in text


def test_independent_branches_merge():
    g = Graph()
    x = g.add_input("x", TensorType("f32", (64, 64)))
    a, b = g.op("exp", x), g.op("neg", x)
    g.outputs = [a, b]
    assert len(partition(g, lambda n: None)) == 1


def test_lone_cheap_op_between_host_clusters_stays_on_host():
    g = Graph()
    x = g.add_input("x", TensorType("f32", (4,)))
    h1 = g.op("sin", x)
    e = g.op("exp", h1)
    g.outputs = [g.op("sin", e)]
    clusters = partition(g, _host_marked({"sin"}))
    assert [c.kind for c in clusters] == ["host"]
    assert "too cheap" in clusters[0].reasons[e.producer]


@st.composite
def random_dag(draw):
    g = Graph()
    vals = [g.add_input(f"in{i}", TensorType("f32", (3, 4))) for i in range(2)]
    for _ in range(draw(st.integers(1, 14))):
        if draw(st.booleans()):
            v = g.op(draw(st.sampled_from(UNARY)), draw(st.sampled_from(vals)))
        else:
            v = g.op(draw(st.sampled_from(BINARY)), draw(st.sampled_from(vals)),
                     draw(st.sampled_from(vals)))
        vals.append(v)
    k = draw(st.integers(1, 3))
    g.outputs = vals[-k:]
    refused = draw(st.sets(st.sampled_from(UNARY + BINARY)))
    return g, refused


@settings(max_examples=150, deadline=None)
@given(random_dag())
def test_partition_properties(case):
    g, refused = case
    clusters = partition(g, _host_marked(refused))
    placed = [n for c in clusters for n in c.nodes]
    assert sorted(map(id, placed)) == sorted(id(n) for n in g.nodes if n.op != "const")
    # executable order: every cluster input is a graph input or an earlier cluster's output
    available = set(g.inputs)
    for c in clusters:
        assert all(v in available for v in c.inputs), "cluster reads a value not yet computed"
        available.update(c.outputs)
        assert all((n.op in refused) != c.compiled or c.reasons.get(n, "").startswith("too")
                   for n in c.nodes)
    xs = [np.random.default_rng(i).uniform(-1, 1, (3, 4)).astype(np.float32) for i in range(2)]
    for got, want in zip(_run_clusters(g, clusters, xs), evaluate(g, xs)):
        np.testing.assert_array_equal(got, want)
