"""Local rewrite rules: pattern, check (a match, or the sentence saying why not), rewrite.

A `Rule` names the ops its pattern is rooted at; `check(node, ctx)` returns a
match object, or a `str` saying why the rule does not apply here; `rewrite(graph,
node, match)` edits the graph and returns the Value that now stands for the
node's output (the driver re-points every reader at it and drops the node), or
None when it edited the node in place. Refusals are logged at DEBUG on the
"braze.passes" logger: that level is the one switch that prints every "no".

`apply_rules` is one sweep over the graph in node order. A node rewritten in
place is matched again (a composed transpose may now be the identity), up to
MAX_REWRITES_PER_NODE times; the pipeline (compiler/passes/pipeline.py) runs
sweeps to a fixed point.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from compiler.ir import Graph, Node, Value

log = logging.getLogger("braze.passes")

# In-place rewrites of one node within a sweep; real chains need two or three
# (compose, then drop as identity). The bound stops two rules undoing each other.
MAX_REWRITES_PER_NODE = 8


class Context:
    """What checks ask about the graph: readers of a value (the graph's own readers map,
    kept current by its edits), graph outputs."""

    def __init__(self, graph: Graph):
        self.graph = graph

    def readers(self, v: Value) -> list[Node]:
        return self.graph.users().get(v, [])

    def is_output(self, v: Value) -> bool:
        return any(o is v for o in self.graph.outputs)

    def sole_reader(self, v: Value) -> str | None:
        """None if exactly one node reads `v` and it is no graph output; else why not."""
        if self.is_output(v):
            return f"%{v.name} is a graph output, so its unfolded value is still needed"
        if len(self.readers(v)) != 1:
            return f"%{v.name} has {len(self.readers(v))} readers, so it must stay as it is"
        return None


@dataclass(frozen=True)
class Rule:
    """One local rewrite; see the module docstring for the contract."""

    name: str
    ops: frozenset
    check: Callable[[Node, Context], Any]
    rewrite: Callable[[Graph, Node, Any], "Value | None"]


def const_value(v: Value) -> np.ndarray | None:
    """The array of a value produced by a `const` node, else None."""
    return v.const_value


def new_const(graph: Graph, before: Node, array: np.ndarray, hint: str) -> Value:
    """A const node holding `array` (made read-only), inserted just before `before`."""
    arr = np.array(array, order="C")  # a copy; keeps 0-d arrays 0-d (ascontiguousarray does not)
    arr.setflags(write=False)
    return graph.add_node("const", [], {"value": arr}, out_names=[hint],
                          index=graph.nodes.index(before)).output


def forwardable(ctx: Context, node: Node, x: Value) -> str | None:
    """None if `node`'s output may be replaced by `x`; else why not.

    x must have exactly the output's type (so no broadcast or cast is lost), and
    a graph output is not re-pointed at a graph input or at another graph output:
    the exporter and runtime give each graph output a value of its own.
    """
    out = node.outputs[0]
    if x.type != out.type:
        return f"%{x.name} is {x.type} but the result is {out.type}"
    if ctx.is_output(out) and (x.producer is None or ctx.is_output(x)):
        return f"%{out.name} is a graph output and %{x.name} is a graph input or output"
    return None


def apply_rules(graph: Graph, rules: list[Rule]) -> bool:
    """One sweep: at each node, the first rule whose check matches rewrites it."""
    ctx = Context(graph)
    by_op: dict[str, list[Rule]] = {}
    for r in rules:
        for op in r.ops:
            by_op.setdefault(op, []).append(r)
    gone: set[Node] = set()
    changed = False
    for node in list(graph.nodes):
        for _ in range(MAX_REWRITES_PER_NODE):
            if node in gone or not _rewrite_once(graph, ctx, by_op.get(node.op, ()), node, gone):
                break
            changed = True
    return changed


def _rewrite_once(graph: Graph, ctx: Context, rules: list[Rule], node: Node, gone: set) -> bool:
    """Apply the first rule that matches `node`; False if none does."""
    for rule in rules:
        match = rule.check(node, ctx)
        if isinstance(match, str):
            log.debug("rule %s at %s: %s", rule.name, node, match)
            continue
        _apply(graph, ctx, rule, node, match, gone)
        return True
    return False


def _apply(graph: Graph, ctx: Context, rule: Rule, node: Node, match, gone: set) -> None:
    log.debug("rule %s rewrites %s", rule.name, node)
    new = rule.rewrite(graph, node, match)
    if new is None:
        return
    old = node.outputs[0]
    graph.replace_all_uses(old, new)
    graph.remove_node(node)
    gone.add(node)
