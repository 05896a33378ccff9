"""Channels-last layout for conv chains: NCHW at the graph's edges, NHWC inside.

braze's conv kernels (compiler/kernels/conv.py, grouped.py) read activations as N,H,W,C:
the channels a pixel contributes are contiguous, and its output channels are
the vector lanes. This pass sets `layout="NHWC"` on every conv and pool the
target compiles that way, with a transpose on each side, then moves those
transposes out of the chain until they meet and cancel (XLA's layout
assignment, for one choice of layout):

  conv(x)                    -> T_first(conv'(T_last(x)))           T_last = (0,2,3,1)
  ew(T_first(a), T_first(b)) -> T_first(ew(a, b))                  T_first = (0,3,1,2)
  ew(T_first(a), const c)    -> T_first(ew(a, T_last(c)))          (c folded now)
  reduce(T_first(a), axes)   -> T_first(reduce(a, T_first[axes]))  (keepdims)
  T_last(T_first(a))         -> a                                  (identities.py)

A ResNet is then one transpose of the image in, and the pooled features out
(where the transpose only moves 1-sized dims: a reshape). The pass runs for a
target, before clustering (compiler/driver.py, TARGET_PASSES), not in the generic pipeline:
`braze optimize` writes standard NCHW ONNX.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from compiler.ir import Graph, Node, Value
from compiler.ops import Family
from compiler.passes.identities import simplify_identities
from compiler.passes.rules import Context, Rule, apply_rules, const_value, new_const

TO_LAST = (0, 2, 3, 1)  # N,C,H,W -> N,H,W,C
TO_FIRST = (0, 3, 1, 2)  # N,H,W,C -> N,C,H,W
RANKS = (3, 4)  # 1-d windows (N,C,W <-> N,W,C) and 2-d ones
WINDOWED = ("conv", "max_pool", "avg_pool")
REDUCTIONS = ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod")
# Rounds of (layout rules, identities) before giving up on a fixed point; a ResNet
# settles in three (convert, sink through each block, cancel).
MAX_ROUNDS = 16


def to_last(rank: int) -> tuple:
    """The perm N,C,spatial... -> N,spatial...,C (TO_LAST for rank 4)."""
    return (0,) + tuple(range(2, rank)) + (1,)


def to_first(rank: int) -> tuple:
    """The perm N,spatial...,C -> N,C,spatial... (TO_FIRST for rank 4)."""
    return (0, rank - 1) + tuple(range(1, rank - 1))


def _is_first(v: Value) -> bool:
    """Whether v is transpose(a, to_first) of a 3-d or 4-d a (a channels-last value seen
    channels-first)."""
    p = v.producer
    if p is None or p.op != "transpose":
        return False
    perm = tuple(p.attrs["perm"])
    return len(perm) in RANKS and perm == to_first(len(perm))


def _check_convert(eligible: Callable[[Node], str | None]):
    def check(node: Node, ctx: Context):
        if node.attrs["layout"] != "NCHW" or len(node.inputs[0].shape) not in RANKS:
            return "not a 1-d or 2-d NCHW conv or pool"
        return eligible(node) or node
    return check


# A conv with fewer input channels than this (an image's 3) reads its input padded
# ahead of time: a window row's (kw, ci) then lie contiguous in memory, so the kernel's
# inner loop runs over KW * Cin elements instead of Cin (conv.py, "wide rows").
PREPAD_MAX_CHANNELS = 16


def _rewrite_convert(graph: Graph, node: Node, _match) -> Value:
    at = graph.nodes.index(node)
    rank = len(node.inputs[0].shape)
    x = graph.add_node("transpose", [node.inputs[0]], {"perm": to_last(rank)}, index=at).output
    attrs = {**node.attrs, "layout": "NHWC"}
    pads = tuple(attrs["pads"])
    if node.op == "conv" and rank == 4 and x.shape[3] < PREPAD_MAX_CHANNELS and any(pads) \
            and tuple(attrs["dilations"]) == (1, 1) and attrs["group"] == 1:
        at += 1
        x = graph.add_node("pad", [x], {"pads": (0, pads[0], pads[1], 0, 0, pads[2], pads[3], 0),
                                         "mode": "constant", "value": 0.0}, index=at).output
        attrs["pads"] = (0, 0, 0, 0)
    y = graph.add_node(node.op, [x] + node.inputs[1:], attrs, name=node.name,
                       index=at + 1).output
    return graph.add_node("transpose", [y], {"perm": to_first(rank)}, index=at + 2).output


def _check_sink_elementwise(node: Node, ctx: Context):
    out = node.outputs[0]
    rank = len(out.shape)
    if rank not in RANKS:
        return "not a 3-d or 4-d result"
    if not any(_is_first(u) and len(u.shape) == rank for u in node.inputs):
        return "no operand is a channels-last value"
    for u in node.inputs:
        if not ((_is_first(u) and len(u.shape) == rank)
                or (const_value(u) is not None and len(u.shape) <= rank)):
            return f"%{u.name} is neither channels-last nor a constant"
    return node


def _to_last_const(graph: Graph, before: Node, v: Value, rank: int) -> Value:
    arr = np.asarray(const_value(v))
    arr = arr.reshape((1,) * (rank - arr.ndim) + arr.shape)
    return new_const(graph, before, np.ascontiguousarray(arr.transpose(to_last(rank))), v.name)


def _rewrite_sink_elementwise(graph: Graph, node: Node, _match) -> Value:
    rank = len(node.outputs[0].shape)
    ins = [u.producer.inputs[0] if _is_first(u) else _to_last_const(graph, node, u, rank)
           for u in node.inputs]
    at = graph.nodes.index(node)
    y = graph.add_node(node.op, ins, dict(node.attrs), name=node.name, index=at).output
    return graph.add_node("transpose", [y], {"perm": to_first(rank)}, index=at + 1).output


def _check_sink_reduce(node: Node, ctx: Context):
    if not _is_first(node.inputs[0]):
        return "the operand is not a channels-last value"
    if not node.attrs["keepdims"]:
        return "keepdims=false changes the rank"
    return node


def _rewrite_sink_reduce(graph: Graph, node: Node, _match) -> Value:
    a = node.inputs[0].producer.inputs[0]
    perm = to_first(len(a.shape))
    axes = tuple(sorted(perm[d] for d in node.attrs["axes"]))
    at = graph.nodes.index(node)
    y = graph.add_node(node.op, [a], {**node.attrs, "axes": axes}, name=node.name,
                       index=at).output
    return graph.add_node("transpose", [y], {"perm": perm}, index=at + 1).output


def _elementwise_ops() -> frozenset:
    from compiler.ops import ops_in

    return frozenset(ops_in(Family.ELEMENTWISE))


def channels_last(graph: Graph, eligible: Callable[[Node], str | None]) -> bool:
    """Run the layout rules and the identities to a fixed point, in place; True if changed.

    `eligible(node)` (a conv or pool) is None where the target compiles the node
    channels-last, else the reason it stays NCHW.
    """
    rules = [
        Rule("to_channels_last", frozenset(WINDOWED), _check_convert(eligible),
             _rewrite_convert),
        Rule("sink_transpose_elementwise", _elementwise_ops(), _check_sink_elementwise,
             _rewrite_sink_elementwise),
        Rule("sink_transpose_reduce", frozenset(REDUCTIONS), _check_sink_reduce,
             _rewrite_sink_reduce),
    ]
    changed = False
    for _ in range(MAX_ROUNDS):
        step = apply_rules(graph, rules)
        step = simplify_identities(graph) or step
        if not step:
            break
        changed = True
    graph.remove_dead()
    return changed
