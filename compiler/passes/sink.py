"""Reshapes moved out of the way of fusion: a matmul reads through the reshape that
merges its rows, and an elementwise op goes before a reshape that keeps the last dim.

torch's Linear on a [B, H, W, C] activation comes out of dynamo as view(x, [B*H*W, C]),
addmm, view back to [B, H, W, N], then the activation: the reshapes sit between the
matmul and its epilogue, so braze copied the rows into a buffer before the GEMM and
ran the bias and GELU as a loop kernel after it (ConvNeXt-T through torch.compile: 78
kernels against 45 from the ONNX export of the same model, 1.8x the time). Moving them:

  matmul(reshape(x), w), w 2-d, x's last dim = K   -> reshape(matmul(x, w))
      (the GEMM folds x's leading dims into its rows: the same products, in order)
  op(reshape(y), c...), y's last dim kept, each other operand a scalar or a row
  broadcast along the last dim                     -> reshape(op(y, c...))
      (for add, mul, max and min, op(c, reshape(y)) is read as op(reshape(y), c))
  op(reshape(y), c), the reshape splitting y's first dim, c a small constant
                                                   -> reshape(op(y, c'))
      (c' = c as y's rows see it: Swin's shifted-window mask, added to scores viewed
      per window, becomes an additive mask of the scores themselves)
  op(reshape(y), c), y a matmul's result, c of op's whole shape
                                                   -> reshape(op(y, reshape(c)))
      (a residual add after a projection viewed back to [B, T, N]: GPT-2's Conv1D,
      ViT's attention out-projection; the add becomes the GEMM's epilogue, reading c
      in place through its reshape, instead of a loop kernel of its own)

after which reshape(reshape(v)) composes, and back to v's own shape vanishes
(identities.py). Both rules only move a reshape (no data moves at run time, no value
changes): each element is computed from the same operands as before.
"""

from __future__ import annotations

import numpy as np

from compiler.ir import Graph, Node, Value
from compiler.ops import Family, ops_in
from compiler.passes.rules import Context, Rule, apply_rules, new_const


def _reshaped(v: Value) -> Value | None:
    """The reshape's operand, if `v` is a reshape's result that keeps its last dim."""
    p = v.producer
    if p is None or p.op != "reshape":
        return None
    x = p.inputs[0]
    if not x.shape or not v.shape or x.shape[-1] != v.shape[-1]:
        return None
    return x


def check_matmul_rows(node: Node, ctx: Context):
    a, w = node.inputs[:2]
    x = _reshaped(a)
    if x is None:
        return "the left operand is not a reshape that keeps its last dim"
    if w.type.rank != 2:
        return "the right operand has batch dims (rows of a batched matmul do not merge)"
    if x.type.rank < 2:
        return "the reshape's operand is a vector"
    return x


def rewrite_matmul_rows(graph: Graph, node: Node, x: Value) -> Value:
    at = graph.nodes.index(node)
    y = graph.add_node("matmul", [x, node.inputs[1]], dict(node.attrs), name=node.name,
                       index=at).output
    return graph.add_node("reshape", [y], {"shape": node.outputs[0].shape},
                          name=node.name, index=at + 1).output


def _row_operand(c: Value, rank: int) -> bool:
    """Whether `c` broadcasts the same way against any shape with this last dim: a
    scalar, or all-ones dims but the last, of rank at most `rank`."""
    return c.type.rank <= rank and all(d == 1 for d in c.shape[:-1])


# Elementwise ops whose two operands may trade places (the ONNX export of a Linear
# writes Add(bias, MatMul): the reshaped product comes second).
COMMUTATIVE = frozenset({"add", "mul", "max", "min"})


def check_elementwise(node: Node, ctx: Context):
    if node.opdef.family is not Family.ELEMENTWISE or not node.inputs:
        return "not an elementwise op"
    if (node.op in COMMUTATIVE and len(node.inputs) == 2 and _reshaped(node.inputs[0]) is None
            and _reshaped(node.inputs[1]) is not None):
        a, b = node.inputs
        ctx.graph.set_inputs(node, [b, a])  # the same value either way; the reshape first
    first = node.inputs[0]
    y = _reshaped(first)
    if y is None:
        return "the first operand is not a reshape that keeps its last dim"
    if first.shape != node.outputs[0].shape:
        return "the first operand is broadcast"
    why = ctx.sole_reader(first)
    if why is not None:
        return why
    if all(_row_operand(c, y.type.rank) for c in node.inputs[1:]):
        return y, None
    if len(node.inputs) == 2:
        folded = _split_operand(node.inputs[1], y.shape, first.shape)
        if folded is not None:
            return y, folded
        if _whole_operand_beside_product(node.inputs[1], y, first):
            return y, RESHAPED
    return ("another operand is more than a scalar, a row or a constant over split rows "
            "(or of the whole shape beside a reshaped value that is not a matmul's)")


# rewrite_elementwise's `folded` for an operand reshaped alongside y
RESHAPED = "reshaped"


def _whole_operand_beside_product(c: Value, y: Value, first: Value) -> bool:
    """Whether op(first, c), first = reshape(y), may read c through a reshape to y's shape
    instead: c has the whole shape (no broadcast), y is a matmul's result or its bias
    add (an op the epilogue takes), and c is neither (the residual stream). The op then
    joins y's epilogue, which reads c in its own buffer (register_ops.operand_kind).
    Never where both are products: the reshape would move to the other one, then back."""
    return (c.shape == first.shape and c.dtype == first.dtype and _from_matmul(y)
            and not _from_matmul(c))


def _from_matmul(v: Value) -> bool:
    """A matmul's result, or an elementwise op's that reads one directly (its bias)."""
    p = v.producer
    if p is None:
        return False
    if p.op == "matmul":
        return True
    return p.opdef.family is Family.ELEMENTWISE and any(
        u.producer is not None and u.producer.op == "matmul" for u in p.inputs)


def _split_operand(c: Value, before: tuple, after: tuple):
    """Where the reshape only splits y's first dim (y [A, d...] -> [B, W, d...], B*W = A)
    and `c` is a small constant: c as seen by y's elements ([A, c's own trailing dims]),
    so that op(reshape(y), c) = reshape(op(y, c')). Swin's shifted windows add their
    mask this way: scores [B*nW, h, N, N] -> [B, nW, h, N, N] + mask[1, nW, 1, N, N]."""
    arr = c.const_value
    j = len(after) - len(before)  # dims the first one splits into, less one
    if arr is None or j < 1 or after[j + 1:] != before[1:] or arr.ndim > len(after):
        return None
    arr = arr.reshape((1,) * (len(after) - arr.ndim) + arr.shape)
    if before[0] * int(np.prod(arr.shape[j + 1:])) > SPLIT_CONSTANT_ELEMENTS:
        return None  # the size of what is written out: c's split dims become y's first
    lead = np.broadcast_to(arr, after[:j + 1] + arr.shape[j + 1:])
    return np.ascontiguousarray(lead.reshape((before[0],) + arr.shape[j + 1:]))


# The largest operand _split_operand writes out (elements): a mask repeated per row
# block, not a tensor the size of an activation.
SPLIT_CONSTANT_ELEMENTS = 1 << 20


def rewrite_elementwise(graph: Graph, node: Node, match) -> Value:
    y, folded = match
    at = graph.nodes.index(node)
    rest = list(node.inputs[1:])
    if folded is RESHAPED:
        rest = [graph.add_node("reshape", rest, {"shape": y.shape}, name=node.name,
                               index=at).output]
        at += 1
    elif folded is not None:
        rest = [new_const(graph, node, folded, node.inputs[1].name)]
        at += 1
    z = graph.add_node(node.op, [y, *rest], dict(node.attrs), name=node.name,
                       index=at).output
    return graph.add_node("reshape", [z], {"shape": node.outputs[0].shape},
                          name=node.name, index=at + 1).output


RULES = [
    Rule("matmul_through_reshape", frozenset({"matmul"}), check_matmul_rows,
         rewrite_matmul_rows),
    Rule("elementwise_before_reshape", frozenset(ops_in(Family.ELEMENTWISE)),
         check_elementwise, rewrite_elementwise),
]


def sink_reshapes(graph: Graph) -> bool:
    """Apply the rules of the module docstring (one sweep)."""
    return apply_rules(graph, RULES)
