"""Long single rows reduced in two stages, so that both threads share them.

A row kernel (compiler/passes/fuse.py) runs one row per work item, so a reduction with
one row (a 1-group GroupNorm's statistics at batch 1: each sample is one row of C*H*W
elements) runs on one thread however long the row. Cut into SPLIT_PARTS equal parts,

  reduce(x, last axis)  ->  reduce(reduce(reshape(x, (.., P, M / P)), last axis), axis -2)

the first stage has P rows (threaded), the second P elements per row. Sums, products,
maxima and minima combine their parts exactly so (a float sum is added in P blocks,
rounding at most as the one long sum does). Only where the row is at least
SPLIT_MIN_ELEMENTS long, there is one row, and P divides it.
"""

from __future__ import annotations

from compiler.ir import Graph, Node
from compiler.target import kind as target_kind

SPLIT_OPS = ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod")
SPLIT_MIN_ELEMENTS = 1 << 15
SPLIT_PARTS = (16, 8, 4)  # the first that divides the row


def split_long_rows(graph: Graph, target: str = "cpu") -> bool:
    """Split every long single-row reduction of `graph` in two stages (module doc), in
    place, on CPU targets; whether any changed."""
    if target_kind(target) != "cpu":
        return False
    changed = False
    for node in list(graph.nodes):
        parts = _parts(node)
        if parts is not None:
            _split(graph, node, parts)
            changed = True
    if changed:
        graph.remove_dead()  # the reductions split
    return changed


def _parts(node: Node) -> int | None:
    """The parts to cut node's row into, or None where it stays one reduction."""
    if node.op not in SPLIT_OPS:
        return None
    x = node.inputs[0]
    shape = tuple(x.shape)
    rank = len(shape)
    if rank == 0 or {a % rank for a in node.attrs["axes"]} != {rank - 1}:
        return None
    row = shape[-1]
    if row < SPLIT_MIN_ELEMENTS or x.type.size != row:  # one row only
        return None
    return next((p for p in SPLIT_PARTS if row % p == 0), None)


def _split(graph: Graph, node: Node, parts: int) -> None:
    x = node.inputs[0]
    shape = tuple(x.shape)
    at = graph.nodes.index(node)
    cut = graph.add_node("reshape", [x], {"shape": shape[:-1] + (parts, shape[-1] // parts)},
                         index=at).output
    first = graph.add_node(node.op, [cut], {**node.attrs, "axes": (len(shape),),
                                            "keepdims": True}, index=at + 1).output
    second = graph.add_node(node.op, [first], {**node.attrs, "axes": (len(shape) - 1,),
                                               "keepdims": True}, index=at + 2).output
    out = graph.add_node("reshape", [second], {"shape": tuple(node.outputs[0].shape)},
                         name=node.name, index=at + 3).output
    graph.replace_all_uses(node.outputs[0], out)
