"""Mark-for-compilation and clustering, after XLA's mark_for_compilation_pass.

1. `mark`: each node is compilable or not; a refusal carries a sentence (from the
   target's `supports(node)`, or the boundary-cost rule below).
2. `partition`: nodes, visited in topological order, join a cluster of their own
   kind (compiled or host) when that creates no cycle; otherwise they start one.
   Host nodes are grouped too (one onnxruntime session per host cluster).
3. `outline`: a cluster becomes a standalone sub-graph.

Acyclicity (legality). Clusters form a DAG; `anc[C]` is the set of clusters C
depends on, kept transitively closed as a bitset. Adding node n to cluster C
is legal iff no cluster P that feeds n (P != C) depends on C: otherwise
C -> ... -> P -> n in C would be a cycle. This is GraphCycles' contract-edge
check made incremental by the topological visit: n is a sink when it is placed,
so only C's ancestor set and its descendants' sets grow (one OR per cluster).

Profitability is separate: `worth_a_boundary` says whether a compiled cluster
pays for leaving the host (see CHEAP_CLUSTER_ELEMENTS).

Constants are not clustered: `outline` copies each constant a cluster reads into
its sub-graph, so a constant never forces an edge (or a cycle) between clusters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from compiler.ir import Graph, Node, Value
from compiler.ops import Family

Supports = Callable[[Node], "str | None"]

# A compiled cluster made only of elementwise/movement ops producing fewer
# elements than this, wedged between host clusters, costs more in boundary
# crossings (a kernel call plus buffer hand-offs) than it saves: keep it on the host.
CHEAP_CLUSTER_ELEMENTS = 4096
_CHEAP_FAMILIES = (Family.ELEMENTWISE, Family.MOVEMENT)


@dataclass
class Cluster:
    """A set of nodes run as one step: compiled by braze, or run by the host framework."""

    id: int
    compiled: bool
    nodes: list[Node] = field(default_factory=list)
    inputs: list[Value] = field(default_factory=list)
    outputs: list[Value] = field(default_factory=list)
    reasons: dict[Node, str] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return "compiled" if self.compiled else "host"


def mark(graph: Graph, supports: Supports) -> dict[Node, str | None]:
    """node -> None (compilable) or the reason it is not; constants are not marked."""
    return {n: (supports(n) if n.op != "host" else _host_reason(n))
            for n in graph.nodes if n.op != "const"}


def _host_reason(n: Node) -> str:
    return n.attrs.get("reason") or f"{n.attrs.get('op_type', 'op')} is a host op"


def partition(graph: Graph, supports: Supports) -> list[Cluster]:
    """Maximal acyclic clusters, in an executable order (see the module docstring)."""
    marks = mark(graph, supports)
    clusters = _grow(graph, marks)
    demoted = [c for c in clusters if c.compiled and not worth_a_boundary(graph, c, clusters)]
    if demoted:
        for c in demoted:
            for n in c.nodes:
                marks[n] = ("too cheap to compile on its own between host clusters "
                            f"(< {CHEAP_CLUSTER_ELEMENTS} elements of elementwise/movement ops)")
        clusters = _grow(graph, marks)
    return clusters


def _grow(graph: Graph, marks: dict[Node, str | None]) -> list[Cluster]:
    owner: dict[Value, int] = {}  # value -> id of the cluster producing it
    anc: list[int] = []  # bitset of ancestor cluster ids, transitively closed
    clusters: list[Cluster] = []
    last_of_kind: dict[bool, int] = {}
    for n in graph.nodes:
        if n.op == "const":
            continue
        compiled = marks[n] is None
        feeds = {owner[v] for v in n.inputs if v in owner}
        candidates = [c for c in sorted(feeds, reverse=True) if clusters[c].compiled == compiled]
        if compiled in last_of_kind and last_of_kind[compiled] not in candidates:
            candidates.append(last_of_kind[compiled])
        target = next((c for c in candidates if _legal(c, feeds, anc)), None)
        if target is None:
            target = len(clusters)
            clusters.append(Cluster(target, compiled))
            anc.append(0)
        _place(n, target, feeds, anc)
        clusters[target].nodes.append(n)
        if not compiled:
            clusters[target].reasons[n] = marks[n]
        last_of_kind[compiled] = target
        for o in n.outputs:
            owner[o] = target
    _set_boundaries(graph, clusters, owner)
    return _ordered(clusters, anc)


def singletons(graph: Graph, compiled: bool = False) -> list[Cluster]:
    """One cluster per (non-constant) node, in graph order: the finest partition."""
    clusters, owner = [], {}
    for n in graph.nodes:
        if n.op == "const":
            continue
        c = Cluster(len(clusters), compiled, [n])
        if not compiled:
            c.reasons[n] = _host_reason(n) if n.op == "host" else "split from its cluster"
        clusters.append(c)
        owner.update({o: c.id for o in n.outputs})
    _set_boundaries(graph, clusters, owner)
    return clusters


def _legal(c: int, feeds: set[int], anc: list[int]) -> bool:
    """May a node fed by `feeds` join cluster c? Only if no feeder depends on c."""
    return all(p == c or not (anc[p] >> c) & 1 for p in feeds)


def _place(n: Node, c: int, feeds: set[int], anc: list[int]) -> None:
    """Record that c now depends on n's feeders; propagate to c's descendants."""
    new = 0
    for p in feeds:
        if p != c:
            new |= anc[p] | (1 << p)
    if new & ~anc[c]:
        anc[c] |= new
        for d in range(len(anc)):
            if (anc[d] >> c) & 1:
                anc[d] |= anc[c]


def _set_boundaries(graph: Graph, clusters: list[Cluster], owner: dict[Value, int]) -> None:
    """Each cluster's inputs (non-constant values from outside) and outputs (used outside)."""
    graph_outputs = set(graph.outputs)
    used_outside: dict[Value, bool] = {v: True for v in graph_outputs}
    for c in clusters:
        for n in c.nodes:
            for v in n.inputs:
                src = owner.get(v)
                if src != c.id:
                    used_outside[v] = True
                    if src is not None or v.producer is None:
                        if v not in c.inputs:
                            c.inputs.append(v)
    for c in clusters:
        c.outputs = [o for n in c.nodes for o in n.outputs if used_outside.get(o)]


def _ordered(clusters: list[Cluster], anc: list[int]) -> list[Cluster]:
    """Clusters sorted so each comes after every cluster it depends on."""
    # Sorting by the number of ancestors is a topological order because anc is
    # transitively closed: if A is an ancestor of B, anc[A] | {A} is a subset of anc[B].
    depth = {c.id: bin(anc[c.id]).count("1") for c in clusters}
    live = [c for c in clusters if c.nodes]
    return sorted(live, key=lambda c: (depth[c.id], c.id))


def worth_a_boundary(graph: Graph, c: Cluster, clusters: list[Cluster]) -> bool:
    """Is compiled cluster c worth its boundary? (profitability, not legality)"""
    if any(n.opdef.family not in _CHEAP_FAMILIES for n in c.nodes):
        return True
    if sum(o.type.size for n in c.nodes for o in n.outputs) >= CHEAP_CLUSTER_ELEMENTS:
        return True
    host_values = {o for h in clusters if not h.compiled for n in h.nodes for o in n.outputs}
    reads_host = any(v in host_values for v in c.inputs)
    host_inputs = {v for h in clusters if not h.compiled for v in h.inputs}
    feeds_host = any(v in host_inputs for v in c.outputs)
    return not (reads_host and feeds_host)


def outline(graph: Graph, cluster: Cluster) -> Graph:
    """The cluster as a standalone graph: crossing values as inputs, constants copied in."""
    g = Graph(f"cluster{cluster.id}")
    vmap: dict[Value, Value] = {v: g.add_input(v.name, v.type) for v in cluster.inputs}
    for n in cluster.nodes:
        for v in n.inputs:
            if v not in vmap and v.producer is not None and v.producer.op == "const":
                vmap[v] = g.add_node("const", [], v.producer.attrs, out_names=[v.name]).output
        m = g.add_node(n.op, [vmap[v] for v in n.inputs], n.attrs, name=n.name,
                       out_names=[o.name for o in n.outputs],
                       out_types=[o.type for o in n.outputs])
        vmap.update(zip(n.outputs, m.outputs))
    g.outputs = [vmap[v] for v in cluster.outputs]
    return g


def describe_partition(clusters: list[Cluster]) -> str:
    """Human-readable clusters and, for every node not compiled, why (`braze explain`)."""
    lines = []
    for c in clusters:
        ops: dict[str, int] = {}
        for n in c.nodes:
            key = n.attrs["op_type"] if n.op == "host" else n.op
            ops[key] = ops.get(key, 0) + 1
        summary = ", ".join(f"{k} x{v}" if v > 1 else k for k, v in ops.items())
        lines.append(f"cluster {c.id} ({c.kind}, {len(c.nodes)} nodes): {summary}")
    not_compiled = [(c, n) for c in clusters if not c.compiled for n in c.nodes]
    total = sum(len(c.nodes) for c in clusters)
    lines.append(f"{total - len(not_compiled)} of {total} nodes compiled by braze")
    if not_compiled:
        lines.append("not compiled:")
    for c, n in not_compiled:
        label = n.attrs["op_type"] if n.op == "host" else n.op
        lines.append(f"  {label} {n.name or n.outputs[0].name!r} (cluster {c.id}): "
                     f"{c.reasons[n]}")
    return "\n".join(lines) + "\n"
