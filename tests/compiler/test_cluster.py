"""Clustering: GraphCycles, structure on known graphs, properties on random DAGs (hypothesis)."""

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.interp import evaluate
from compiler.ir import Graph, TensorType, verify
from compiler.passes.cluster import (
    CHEAP_REASON,
    VIEW_REASON,
    describe_partition,
    outline,
    partition,
    singletons,
)
from compiler.passes.cycles import GraphCycles
from compiler.text import parse_graph

UNARY = ["neg", "exp", "abs", "sin"]
BINARY = ["add", "mul", "sub", "max"]


def refusing(names):
    """supports(): nodes whose op is in `names` are refused (as if not compilable)."""
    return lambda n: f"{n.op} refused by the test" if n.op in names else None


def run_clusters(g: Graph, clusters, inputs):
    """Outline each cluster and evaluate them in the given order."""
    env = dict(zip(g.inputs, inputs))
    for c in clusters:
        sub = outline(g, c)
        verify(sub)
        assert [v.name for v in sub.inputs] == [v.name for v in c.inputs]
        outs = evaluate(sub, [env[v] for v in c.inputs])
        env.update(zip(c.outputs, outs))
    for n in g.nodes:  # graph outputs that are constants come from no cluster
        if n.op == "const":
            env.setdefault(n.outputs[0], n.attrs["value"])
    return [env[v] for v in g.outputs]


def summary(clusters):
    return [(c.kind, [n.outputs[0].name for n in c.nodes]) for c in clusters]


# -- GraphCycles ---------------------------------------------------------------

def test_graph_cycles_refuses_a_cycle_and_reorders():
    gc = GraphCycles(4)
    assert gc.insert_edge(0, 1) and gc.insert_edge(1, 2)
    assert not gc.insert_edge(2, 0)  # would close 0 -> 1 -> 2 -> 0
    assert gc.insert_edge(3, 0)  # 3 ranked after 0: needs a reorder
    assert gc.rank[3] < gc.rank[0] < gc.rank[1] < gc.rank[2]
    assert gc.reachable(3, 2) and not gc.reachable(2, 3)


def test_graph_cycles_merge_refuses_a_path_through_a_third_node():
    gc = GraphCycles(3)
    for x, y in [(0, 1), (1, 2), (0, 2)]:
        gc.insert_edge(x, y)
    assert not gc.merge(0, 2)  # 0 -> 1 -> 2 would become a cycle through {0, 2}
    assert 2 in gc.succ[0]  # the direct edge is restored
    assert gc.merge(0, 1) and gc.merge(0, 2)
    assert gc.alive == [True, False, False]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7)), max_size=30))
def test_graph_cycles_matches_brute_force(edges):
    gc, kept = GraphCycles(8), set()
    for x, y in edges:
        would_cycle = x == y or _reaches(kept, y, x)
        assert gc.insert_edge(x, y) == (not would_cycle)
        if not would_cycle:
            kept.add((x, y))
        assert all(gc.rank[a] < gc.rank[b] for a, b in kept)
    for a, b in itertools.product(range(8), repeat=2):
        assert gc.reachable(a, b) == _reaches(kept, a, b)


def _reaches(edges, a, b) -> bool:
    seen, stack = {a}, [a]
    while stack:
        n = stack.pop()
        for x, y in edges:
            if x == n and y not in seen:
                seen.add(y)
                stack.append(y)
    return b in seen


# -- known graphs ----------------------------------------------------------------

def test_host_node_splits_around_and_no_cycle():
    # exp -> [sin: host] -> add(exp, sin): exp and add in one cluster would need sin
    # inside too, which is host: the compiled part splits in two.
    g = parse_graph("""
graph main(%x: f32[64,64]) -> (%y) {
  %e = exp(%x) : f32[64,64]
  %s = sin(%e) : f32[64,64]
  %y = add(%e, %s) : f32[64,64]
}""")
    clusters = partition(g, refusing({"sin"}))
    assert summary(clusters) == [("compiled", ["e"]), ("host", ["s"]), ("compiled", ["y"])]
    assert [c.id for c in clusters] == [0, 1, 2]
    text = describe_partition(clusters)
    assert "sin refused by the test" in text and "2 of 3 nodes compiled" in text


def test_independent_branches_and_chains_merge():
    g = parse_graph("""
graph main(%x: f32[64,64]) -> (%a, %b) {
  %e = exp(%x) : f32[64,64]
  %a = neg(%e) : f32[64,64]
  %b = abs(%x) : f32[64,64]
}""")
    clusters = partition(g, lambda n: None)
    assert summary(clusters) == [("compiled", ["e", "a", "b"])]
    assert [v.name for v in clusters[0].inputs] == ["x"]
    assert [v.name for v in clusters[0].outputs] == ["a", "b"]


def test_host_nodes_group_into_one_cluster_when_acyclic():
    # two host chains separated by nothing compiled: one host cluster (one session)
    g = parse_graph("""
graph main(%x: f32[64,64]) -> (%y) {
  %h1 = sin(%x) : f32[64,64]
  %h2 = sin(%h1) : f32[64,64]
  %h3 = sin(%x) : f32[64,64]
  %e = exp(%h2) : f32[64,64]
  %y = add(%e, %h3) : f32[64,64]
}""")
    clusters = partition(g, refusing({"sin"}))
    assert summary(clusters) == [("host", ["h1", "h2", "h3"]), ("compiled", ["e", "y"])]


def test_host_clusters_stay_apart_when_a_compiled_node_sits_between():
    g = parse_graph("""
graph main(%x: f32[64,64]) -> (%y) {
  %h1 = sin(%x) : f32[64,64]
  %e = exp(%h1) : f32[64,64]
  %y = sin(%e) : f32[64,64]
}""")
    clusters = partition(g, refusing({"sin"}))
    assert summary(clusters) == [("host", ["h1"]), ("compiled", ["e"]), ("host", ["y"])]


def test_lone_cheap_op_between_host_nodes_goes_to_the_host():
    text = """
graph main(%x: f32[4]) -> (%y) {
  %h1 = sin(%x) : f32[4]
  %e = exp(%h1) : f32[4]
  %y = sin(%e) : f32[4]
}"""
    g = parse_graph(text)
    clusters = partition(g, refusing({"sin"}))
    assert summary(clusters) == [("host", ["h1", "e", "y"])]
    assert clusters[0].reasons[g.nodes[1]] == CHEAP_REASON
    # with demotion off (allow_fallback=False), the compilable node stays compiled
    kept = partition(parse_graph(text), refusing({"sin"}), demote_cheap=False)
    assert [c.kind for c in kept] == ["host", "compiled", "host"]


def test_a_reshape_of_any_size_between_host_nodes_goes_to_the_host():
    """A reshape moves nothing: between host nodes it joins them in one host step,
    however many elements it has (an elementwise op that large stays compiled)."""
    text = """
graph main(%x: f32[64,128]) -> (%y) {
  %h1 = sin(%x) : f32[64,128]
  %r = reshape(%h1) {shape=[8192]} : f32[8192]
  %y = sin(%r) : f32[8192]
}"""
    g = parse_graph(text)
    clusters = partition(g, refusing({"sin"}))
    assert summary(clusters) == [("host", ["h1", "r", "y"])]
    assert clusters[0].reasons[g.nodes[1]] == VIEW_REASON
    big = parse_graph(text.replace("reshape(%h1) {shape=[8192]} : f32[8192]",
                                   "exp(%h1) : f32[64,128]").replace("f32[8192]",
                                                                     "f32[64,128]"))
    assert [c.kind for c in partition(big, refusing({"sin"}))] == ["host", "compiled", "host"]
    kept = partition(parse_graph(text), refusing({"sin"}), demote_cheap=False)
    assert [c.kind for c in kept] == ["host", "compiled", "host"]


def test_cheap_op_alone_in_the_graph_stays_compiled():
    g = parse_graph("graph main(%x: f32[4]) -> (%y) {\n  %y = exp(%x) : f32[4]\n}")
    assert [c.kind for c in partition(g, lambda n: None)] == ["compiled"]


def test_constants_are_copied_into_each_cluster_not_shared():
    g = parse_graph("""
graph main(%x: f32[64,64]) -> (%y, %k) {
  %k = const() {value=dense<f32[]: [2.0]>} : f32[]
  %a = mul(%x, %k) : f32[64,64]
  %h = sin(%a) : f32[64,64]
  %y = add(%h, %k) : f32[64,64]
}""")
    clusters = partition(g, refusing({"sin"}))
    assert summary(clusters) == [("compiled", ["a"]), ("host", ["h"]), ("compiled", ["y"])]
    assert all("k" not in [v.name for v in c.inputs] for c in clusters)
    for c in (clusters[0], clusters[2]):
        sub = outline(g, c)
        assert [n.op for n in sub.nodes][0] == "const" and sub.nodes[0].outputs[0].name == "k"
    x = np.ones((64, 64), np.float32)
    for got, want in zip(run_clusters(g, clusters, [x]), evaluate(g, [x])):
        np.testing.assert_array_equal(got, want)


def test_partition_is_deterministic():
    text = """
graph main(%x: f32[64,64]) -> (%y) {
  %a = exp(%x) : f32[64,64]
  %b = sin(%x) : f32[64,64]
  %c = neg(%b) : f32[64,64]
  %d = sin(%a) : f32[64,64]
  %y = add(%c, %d) : f32[64,64]
}"""
    first = summary(partition(parse_graph(text), refusing({"sin"})))
    for _ in range(3):
        assert summary(partition(parse_graph(text), refusing({"sin"}))) == first


def test_singletons_cover_every_node():
    g = parse_graph("""
graph main(%x: f32[4]) -> (%y) {
  %a = exp(%x) : f32[4]
  %y = neg(%a) : f32[4]
}""")
    parts = singletons(g)
    assert summary(parts) == [("host", ["a"]), ("host", ["y"])]
    assert [v.name for v in parts[0].outputs] == ["a"] and parts[1].inputs[0].name == "a"


# -- random DAGs -------------------------------------------------------------------

@st.composite
def random_dag(draw):
    g = Graph()
    vals = [g.add_input(f"in{i}", TensorType("f32", (3, 4))) for i in range(2)]
    vals.append(g.const(np.float32(0.5), "half"))
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
    return g, refused, draw(st.booleans())


def _depends(clusters) -> dict[int, set[int]]:
    producer = {o: c.id for c in clusters for o in c.outputs}
    return {c.id: {producer[v] for v in c.inputs if v in producer} for c in clusters}


def _paths(deps) -> set[tuple[int, int]]:
    """(a, b) for every path a ~> b of length >= 2 between clusters."""
    reach = {c: set(ps) for c, ps in deps.items()}
    changed = True
    while changed:
        changed = False
        for c in reach:
            more = set().union(*(reach[p] for p in reach[c])) - reach[c]
            if more:
                reach[c] |= more
                changed = True
    return {(a, b) for b in deps for p in deps[b] for a in reach[p]}


@settings(max_examples=150, deadline=None)
@given(random_dag())
def test_partition_properties(case):
    g, refused, demote = case
    clusters = partition(g, refusing(refused), demote_cheap=demote)
    placed = [n for c in clusters for n in c.nodes]
    assert sorted(map(id, placed)) == sorted(id(n) for n in g.nodes if n.op != "const")
    # executable order (so the cluster graph is acyclic): inputs come from earlier clusters
    available = set(g.inputs)
    for c in clusters:
        assert all(v in available for v in c.inputs), "cluster reads a value not yet computed"
        available.update(c.outputs)
        for n in c.nodes:
            refused_here = n.op in refused
            assert refused_here != c.compiled or (demote and c.reasons[n] == CHEAP_REASON)
    # maximal: no two clusters of one kind could merge without closing a cycle
    indirect = _paths(_depends(clusters))
    for a, b in itertools.combinations(clusters, 2):
        if a.compiled == b.compiled:
            assert (a.id, b.id) in indirect or (b.id, a.id) in indirect, summary(clusters)
    xs = [np.random.default_rng(i).uniform(-1, 1, (3, 4)).astype(np.float32) for i in range(2)]
    for got, want in zip(run_clusters(g, clusters, xs), evaluate(g, xs)):
        np.testing.assert_array_equal(got, want)
