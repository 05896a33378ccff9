"""Mark-for-compilation and clustering, after XLA's mark_for_compilation_pass.

1. `mark`: every non-constant node is compilable (None) or not (a sentence: the
   target's `supports(node)`, or a host op's own reason).
2. `partition`: start with one cluster per node; contract edges between
   clusters of the same kind (compiled with compiled, host with host) whenever
   that closes no cycle, then merge unconnected clusters of the same kind under
   the same rule, until nothing changes. Host clusters are grown too: each
   becomes one onnxruntime session (or one eager fx sub-module).
3. `outline`: a cluster becomes a standalone sub-graph. Deciding and outlining
   are separate, so `braze explain` can show a partition it never builds.

Legality ("may these merge") is `_may_merge`: same kind, and GraphCycles
(compiler/passes/cycles.py) finds no path between them except a direct edge;
its ranks make each check a search bounded to the clusters ranked between the
two, not a re-check of the graph. Profitability ("should this be compiled") is
`cheap_refusal`: a compiled cluster of a few cheap elementwise/movement ops,
whose only neighbours are host clusters, costs more at its boundaries (a step,
buffers handed across) than it saves, so it goes to the host with that reason.

Constants are no cluster's members and make no edges: `outline` copies every
constant a cluster reads into its sub-graph (numpy arrays are shared, not
copied). A constant read by two clusters would otherwise tie them together
with an edge and could block merges or force one cluster to export weights to
another; a copy costs nothing at run time and lets codegen pre-pack it.
"""

from __future__ import annotations

import heapq
import logging
from dataclasses import dataclass, field
from typing import Callable

from compiler.ir import Graph, Node, Value
from compiler.ops import Family
from compiler.passes.cycles import GraphCycles

log = logging.getLogger("braze.passes")

Supports = Callable[[Node], "str | None"]

# A compiled cluster made only of elementwise/movement ops that together produce
# fewer elements than this, with host clusters as its only neighbours, is put on
# the host: a kernel launch plus two buffer hand-offs across the boundary cost
# more than the few microseconds the host takes for a few thousand elements.
CHEAP_CLUSTER_ELEMENTS = 4096
CHEAP_FAMILIES = frozenset({Family.ELEMENTWISE, Family.MOVEMENT})
CHEAP_REASON = ("too cheap to compile on its own between host nodes "
                f"(elementwise/movement, < {CHEAP_CLUSTER_ELEMENTS} elements)")
# A reshape moves no data on either side, whatever its size: a cluster of reshapes
# between host nodes goes to the host too, so that the host runs them in one step
# with their neighbours instead of two hand-offs around a compiled step that does
# nothing (a 2-layer GRU exported by torch: 4 steps -> 1, 2.7 -> 2.1 ms a call).
VIEW_OPS = frozenset({"reshape"})
VIEW_REASON = "a reshape between host nodes: the host runs it in the same step, for free"

# Unconnected clusters of one kind are merged with at most this many earlier
# ones (nearest in topological order first): each try is a bounded search, and
# the window keeps a graph with thousands of clusters from quadratic work.
SIBLING_WINDOW = 16


@dataclass
class Cluster:
    """Nodes run as one step: compiled by braze, or run by the host framework.

    `id` is the cluster's position in the executable order; `nodes` are in graph
    order; `inputs` are the non-constant values it reads from outside (order of
    first use), `outputs` the values it produces that are read outside it or are
    graph outputs (node order); `reasons` says, for each node not compiled, why.
    """

    id: int
    compiled: bool
    nodes: list[Node] = field(default_factory=list)
    inputs: list[Value] = field(default_factory=list)
    outputs: list[Value] = field(default_factory=list)
    reasons: dict[Node, str] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return "compiled" if self.compiled else "host"


def host_reason(n: Node) -> str:
    return n.attrs.get("reason") or f"{n.attrs.get('op_type', 'op')} is a host op"


def mark(graph: Graph, supports: Supports) -> dict[Node, str | None]:
    """node -> None (compilable) or the reason it is not; constants are not marked."""
    return {n: (supports(n) if n.op != "host" else host_reason(n))
            for n in graph.nodes if n.op != "const"}


class _Partition:
    """Clusters being grown: cluster k starts as {nodes[k]}; merged ones point at a rep."""

    def __init__(self, graph: Graph, marks: dict[Node, str | None]):
        self.nodes = [n for n in graph.nodes if n.op != "const"]
        self.index = {n: i for i, n in enumerate(self.nodes)}
        self.reasons = {n: why for n, why in marks.items() if why is not None}
        self.compiled = [marks[n] is None for n in self.nodes]
        self.members = [[i] for i in range(len(self.nodes))]
        self.rep = list(range(len(self.nodes)))
        self.cycles = GraphCycles(len(self.nodes))
        for i, n in enumerate(self.nodes):
            for p in self.producers(i):
                self.cycles.insert_edge(p, i)

    def producers(self, i: int) -> set[int]:
        node = self.nodes[i]
        return {self.index[v.producer] for v in node.inputs
                if v.producer is not None and not v.is_const}

    def find(self, i: int) -> int:
        while self.rep[i] != i:
            self.rep[i] = self.rep[self.rep[i]]
            i = self.rep[i]
        return i

    def live(self) -> list[int]:
        return [c for c in range(len(self.nodes)) if self.rep[c] == c]

    def may_merge(self, a: int, b: int) -> bool:
        """Legality: same kind, and merging closes no cycle (then it is done)."""
        if a == b or self.compiled[a] != self.compiled[b]:
            return False
        if not self.cycles.merge(a, b):
            log.debug("clusters of %s and %s not merged: another path joins them, so "
                      "merging would close a cycle", self.nodes[a], self.nodes[b])
            return False
        self.rep[b] = a
        self.members[a] += self.members[b]
        self.members[b] = []
        return True

    def contract_edges(self, compiled: bool | None = None) -> bool:
        """Contract every producer -> consumer edge between clusters of one kind."""
        changed = False
        for i in range(len(self.nodes)):
            for p in sorted(self.producers(i)):
                a, b = self.find(p), self.find(i)
                if compiled is None or self.compiled[a] == compiled:
                    changed |= self.may_merge(a, b)
        return changed

    def merge_siblings(self) -> bool:
        """Merge clusters with no edge between them into an earlier one of their kind."""
        changed = False
        order = sorted(self.live(), key=self.cycles.rank.__getitem__)
        for k, c in enumerate(order):
            earlier = [e for e in reversed(order[:k]) if self.rep[e] == e]
            if any(self.may_merge(e, c) for e in earlier[:SIBLING_WINDOW]):
                changed = True
        return changed

    def demote_cheap(self) -> None:
        """Profitability: cheap compiled clusters surrounded by host ones go to the host."""
        for c in self.live():
            reason = cheap_refusal(self, c) if self.compiled[c] else None
            if reason is not None:
                self.compiled[c] = False
                for i in self.members[c]:
                    self.reasons[self.nodes[i]] = reason


def cheap_refusal(part: _Partition, c: int) -> str | None:
    """Why compiled cluster c is not worth its boundary, or None if it is."""
    nodes = [part.nodes[i] for i in part.members[c]]
    if any(n.opdef.family not in CHEAP_FAMILIES for n in nodes):
        return None
    views = all(n.op in VIEW_OPS for n in nodes)
    if not views and sum(o.type.size for n in nodes for o in n.outputs) >= CHEAP_CLUSTER_ELEMENTS:
        return None
    neighbours = part.cycles.succ[c] | part.cycles.pred[c]
    if not neighbours or any(part.compiled[m] for m in neighbours):
        return None
    return VIEW_REASON if views else CHEAP_REASON


def partition(graph: Graph, supports: Supports, *, demote_cheap: bool = True) -> list[Cluster]:
    """Maximal acyclic clusters in an executable order (see the module docstring).

    demote_cheap=False keeps every compilable node compiled (for allow_fallback=False,
    where "too cheap" must not read as a refusal).
    """
    part = _Partition(graph, mark(graph, supports))
    while part.contract_edges(compiled=True):
        pass
    if demote_cheap:
        part.demote_cheap()
    while part.contract_edges() | part.merge_siblings():
        pass
    return _clusters(graph, part)


def _clusters(graph: Graph, part: _Partition) -> list[Cluster]:
    order = _topological(part)
    clusters = []
    owner: dict[Value, int] = {}
    for k, c in enumerate(order):
        cl = Cluster(k, part.compiled[c], [part.nodes[i] for i in sorted(part.members[c])])
        cl.reasons = {n: part.reasons[n] for n in cl.nodes if n in part.reasons}
        owner.update((o, k) for n in cl.nodes for o in n.outputs)
        clusters.append(cl)
    set_boundaries(graph, clusters, owner)
    return clusters


def _topological(part: _Partition) -> list[int]:
    """Live clusters in dependency order; ties broken by their first node (deterministic)."""
    live = part.live()
    waiting = {c: len(part.cycles.pred[c]) for c in live}
    ready = [(min(part.members[c]), c) for c in live if waiting[c] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, c = heapq.heappop(ready)
        order.append(c)
        for s in part.cycles.succ[c]:
            waiting[s] -= 1
            if waiting[s] == 0:
                heapq.heappush(ready, (min(part.members[s]), s))
    assert len(order) == len(live), "cluster graph has a cycle"
    return order


def set_boundaries(graph: Graph, clusters: list[Cluster], owner: dict[Value, int]) -> None:
    """Each cluster's inputs (non-constant values from outside) and outputs (read outside)."""
    read_outside = set(graph.outputs)
    for c in clusters:
        seen = set()
        for n in c.nodes:
            for v in n.inputs:
                if owner.get(v) == c.id:
                    continue
                read_outside.add(v)
                is_const = v.is_const
                if not is_const and v not in seen:
                    seen.add(v)
                    c.inputs.append(v)
    for c in clusters:
        c.outputs = [o for n in c.nodes for o in n.outputs if o in read_outside]


def singletons(graph: Graph, compiled: bool = False) -> list[Cluster]:
    """One cluster per non-constant node, in graph order: the finest partition."""
    clusters, owner = [], {}
    for n in graph.nodes:
        if n.op == "const":
            continue
        c = Cluster(len(clusters), compiled, [n])
        if not compiled:
            c.reasons[n] = host_reason(n) if n.op == "host" else "split from its cluster"
        clusters.append(c)
        owner.update((o, c.id) for o in n.outputs)
    set_boundaries(graph, clusters, owner)
    return clusters


def outline(graph: Graph, cluster: Cluster) -> Graph:
    """The cluster as a standalone graph: crossing values as inputs, constants copied in."""
    g = Graph(f"cluster{cluster.id}")
    vmap: dict[Value, Value] = {v: g.add_input(v.name, v.type) for v in cluster.inputs}
    for n in cluster.nodes:
        for v in n.inputs:
            if v not in vmap and v.is_const:
                vmap[v] = g.add_node("const", [], v.producer.attrs, out_names=[v.name]).output
        m = g.add_node(n.op, [vmap[v] for v in n.inputs], n.attrs, name=n.name,
                       out_names=[o.name for o in n.outputs],
                       out_types=[o.type for o in n.outputs])
        vmap.update(zip(n.outputs, m.outputs))
    g.outputs = [vmap[v] for v in cluster.outputs]
    return g


def _label(n: Node) -> str:
    return n.label


def describe_partition(clusters: list[Cluster]) -> str:
    """Clusters with their node counts and ops, then every node not compiled and why
    (`braze explain`)."""
    lines = []
    for c in clusters:
        ops: dict[str, int] = {}
        for n in c.nodes:
            ops[_label(n)] = ops.get(_label(n), 0) + 1
        summary = ", ".join(f"{k} x{v}" if v > 1 else k for k, v in ops.items())
        lines.append(f"cluster {c.id} ({c.kind}, {len(c.nodes)} nodes, "
                     f"{len(c.inputs)} in, {len(c.outputs)} out): {summary}")
    not_compiled = [(c, n) for c in clusters if not c.compiled for n in c.nodes]
    total = sum(len(c.nodes) for c in clusters)
    lines.append(f"{total - len(not_compiled)} of {total} nodes compiled by braze")
    if not_compiled:
        lines.append("not compiled:")
    for c, n in not_compiled:
        lines.append(f"  {_label(n)} {n.name or n.outputs[0].name!r} (cluster {c.id}): "
                     f"{c.reasons[n]}")
    return "\n".join(lines) + "\n"
