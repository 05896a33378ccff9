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

Channel movement (ShuffleNet's split, concat and shuffle) keeps the layout too. A
channels-first *view* is transpose(a, P) of a channels-last `a` = N,H,W,c1..ck whose
P puts the k channel dims (in any order Q) after N and the spatial dims last; it is
the view V(transpose(a, Q)) with V = (0, 3, ..., 2+k, 1, 2). Movement that keeps N
and the spatial dims and only touches channel dims moves inside the view:

  concat(V(a), V(b), channel axis)       -> V(concat(a, b, that channel axis))
  slice(V(a))                            -> V(slice(a, the same ranges permuted))
  reshape(V(a), N,d1..dm,H,W)            -> V'(reshape(a, N,H,W,d1..dm))
  (a transpose of channel dims composes into P: identities.py)

so a channel shuffle, reshape(transpose(reshape(x, N,g,C/g,H,W))), becomes the same
three ops over the last dims of the NHWC value and the transposes around it cancel.

A sample flattened into one row, R(a) = reshape(T_first(a), (N, 1.., M)) (a 1-group
GroupNorm, a norm over C, H and W), holds the same elements as reshape(a, (N, 1.., M)),
in another order. Ops that pair elements or reduce whole rows do not see the order:

  ew(R(a), R(b), per-row values)         -> R'(ew(rows of a, rows of b, those values))
  reduce(R(a), axes with the last)       -> reduce(rows of a, the same axes)
  reshape(ew(rows of x, per-row values), x's shape)
                                         -> ew(x, the values reshaped to (N, 1, ..))

(R' = reshape(T_first(reshape(., a's shape)))), so the statistics reduce NHWC rows, the
norm's last step writes the NHWC shape, and T_first sinks on through what follows. A
value with one element per sample, (N, 1, .., 1), passes an elementwise sink as it is
(the same array in either layout), and a pad moves its pads with the dims:
pad(T_first(a)) -> T_first(pad(a, permuted pads)). With G > 1 channel groups,
Rg(a) = reshape(T_first(a), (N, G, M)) is not a row of `a` (a group is every G-th run
of C / G channels), so:

  ew(Rg(a), Rg(b), per-group values)     -> Rg'(ew(a, b, each value repeated over its
                                            group's channels: (N, 1.., C)))
  reduce(Rg(a), the last axis)           -> reduce(reshape(reduce(a, spatial dims),
                                            (N, G, C / G)), the last axis)

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
# Channels-last values whose transposes sink through elementwise ops and reductions:
# also volumes (N,D,H,W,C), which compiler/passes/windows.py writes around 3-d windows.
SINK_RANKS = (3, 4, 5)
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
    return len(perm) in SINK_RANKS and perm == to_first(len(perm))


def _channel_view(v: Value) -> tuple | None:
    """(a, s, q) if v = transpose(a, P) is a channels-first view of a channels-last `a`
    (module doc): s spatial dims, q the order P takes a's channel dims in (a's dim
    numbers, each > s); None otherwise. Only 2-d images (s = 2, rank >= 4): a rank-4
    perm then reads one way only."""
    p = v.producer
    if p is None or p.op != "transpose":
        return None
    perm = tuple(p.attrs["perm"])
    rank = len(perm)
    if rank < 4:  # 1-d windows' (0, 2, 1) is every rank-3 swap (a transformer's too)
        return None
    s = 2
    k = rank - 1 - s
    q = perm[1:1 + k]
    if perm[0] != 0 or perm[1 + k:] != tuple(range(1, s + 1)) \
            or sorted(q) != list(range(s + 1, rank)):
        return None
    return p.inputs[0], s, q


def _view_perm(rank: int, s: int) -> tuple:
    """V: N,spatial(s),c1..ck -> N,c1..ck,spatial."""
    return (0,) + tuple(range(s + 1, rank)) + tuple(range(1, s + 1))


def _inner(graph: Graph, at: int, a: Value, s: int, q: tuple) -> tuple[Value, int]:
    """transpose(a, (0..s, q)) inserted at `at` (a itself when q is in order), and the
    next free index."""
    perm = tuple(range(s + 1)) + q
    if perm == tuple(range(len(perm))):
        return a, at
    return graph.add_node("transpose", [a], {"perm": perm}, index=at).output, at + 1


def _view(graph: Graph, at: int, y: Value, s: int) -> Value:
    return graph.add_node("transpose", [y], {"perm": _view_perm(len(y.shape), s)},
                          index=at).output


def _check_view_concat(node: Node, ctx: Context):
    views = [_channel_view(u) for u in node.inputs]
    if any(v is None for v in views):
        return "an operand is not a channels-last value seen channels-first"
    s, q = views[0][1], views[0][2]
    if any((v[1], v[2]) != (s, q) for v in views):
        return "the operands are seen through different transposes"
    axis = node.attrs["axis"]
    if not 1 <= axis <= len(q):
        return "not a concat over channels"
    return views


def _rewrite_view_concat(graph: Graph, node: Node, views) -> Value:
    s, q = views[0][1], views[0][2]
    at = graph.nodes.index(node)
    ins = []
    for a, _, _ in views:
        x, at = _inner(graph, at, a, s, q)
        ins.append(x)
    y = graph.add_node("concat", ins, {"axis": s + node.attrs["axis"]}, name=node.name,
                       index=at).output
    return _view(graph, at + 1, y, s)


def _check_view_slice(node: Node, ctx: Context):
    return _channel_view(node.inputs[0]) or \
        "the operand is not a channels-last value seen channels-first"


def _rewrite_view_slice(graph: Graph, node: Node, view) -> Value:
    a, s, q = view
    at = graph.nodes.index(node)
    x, at = _inner(graph, at, a, s, q)
    order = _view_perm(len(a.shape), s)  # view dim i is x's dim order[i]
    attrs = {}
    for key in ("starts", "steps", "sizes"):
        vals = [0] * len(order)
        for i, d in enumerate(order):
            vals[d] = node.attrs[key][i]
        attrs[key] = tuple(vals)
    y = graph.add_node("slice", [x], attrs, name=node.name, index=at).output
    return _view(graph, at + 1, y, s)


def _check_view_reshape(node: Node, ctx: Context):
    view = _channel_view(node.inputs[0])
    if view is None:
        return "the operand is not a channels-last value seen channels-first"
    _, s, _ = view
    src, dst = node.inputs[0].shape, tuple(node.attrs["shape"])
    rank = len(dst)
    if rank < 4 or dst[0] != src[0] or dst[rank - s:] != src[len(src) - s:]:
        return "the reshape moves N or the spatial dims"
    return view


def _rewrite_view_reshape(graph: Graph, node: Node, view) -> Value:
    a, s, q = view
    at = graph.nodes.index(node)
    x, at = _inner(graph, at, a, s, q)
    dst = tuple(node.attrs["shape"])
    rank = len(dst)
    shape = (dst[0],) + dst[rank - s:] + dst[1:rank - s]
    y = graph.add_node("reshape", [x], {"shape": shape}, name=node.name, index=at).output
    return _view(graph, at + 1, y, s)


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
    if rank not in SINK_RANKS:
        return "not a 3-d, 4-d or 5-d result"
    if not any(_is_first(u) and len(u.shape) == rank for u in node.inputs):
        return "no operand is a channels-last value"
    for u in node.inputs:
        if not ((_is_first(u) and len(u.shape) == rank)
                or (const_value(u) is not None and len(u.shape) <= rank)
                or _per_sample(u, rank)):
            return f"%{u.name} is neither channels-last, a constant nor one value per sample"
    return node


def _per_sample(u: Value, rank: int) -> bool:
    """Whether u holds one value per sample (N, 1, ..) or one in all, at most `rank` dims:
    the same array in either layout (a norm's statistics)."""
    return len(u.shape) <= rank and all(d == 1 for d in u.shape[1:]) and (
        len(u.shape) == rank or u.type.size == 1)


def _to_last_const(graph: Graph, before: Node, v: Value, rank: int) -> Value:
    arr = np.asarray(const_value(v))
    arr = arr.reshape((1,) * (rank - arr.ndim) + arr.shape)
    return new_const(graph, before, np.ascontiguousarray(arr.transpose(to_last(rank))), v.name)


def _rewrite_sink_elementwise(graph: Graph, node: Node, _match) -> Value:
    rank = len(node.outputs[0].shape)
    ins = [u.producer.inputs[0] if _is_first(u) and len(u.shape) == rank else
           u if const_value(u) is None else _to_last_const(graph, node, u, rank)
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


def _row_view(v: Value) -> tuple | None:
    """(a, shape) if v = reshape(transpose(a, to_first), shape) of a channels-last `a`
    with `shape` = (N, 1.., M): each sample's channels-first elements as one row (a
    1-group GroupNorm's rows, a flatten before a norm over C, H and W); else None. The
    row holds the same elements as reshape(a, shape), in another order."""
    a = _flattened(v)
    shape = tuple(v.shape)
    if a is None or len(shape) < 2 or shape[0] != a.shape[0] or any(
            d != 1 for d in shape[1:-1]):
        return None
    return a, shape


def _flattened(v: Value) -> Value | None:
    """The channels-last `a` of v = reshape(transpose(a, to_first), ...), else None."""
    p = v.producer
    if p is None or p.op != "reshape" or not _is_first(p.inputs[0]):
        return None
    return p.inputs[0].producer.inputs[0]


def _row_broadcast(u: Value) -> bool:
    """Whether u is the same for every element of a row: its last dim is 1 (a row's
    statistic) or it has none."""
    return not u.shape or u.shape[-1] == 1


def _check_sink_row_elementwise(node: Node, ctx: Context):
    out = node.outputs[0]
    views = [_row_view(u) for u in node.inputs]
    first = next((v for v in views if v is not None), None)
    if first is None:
        return "no operand is a channels-last row"
    a, shape = first
    if tuple(out.shape) != shape:
        return "the result is not shaped as the rows"
    for u, view in zip(node.inputs, views):
        if view is None and not _row_broadcast(u):
            return f"%{u.name} is neither a channels-last row nor the same along a row"
        if view is not None and (tuple(view[0].shape), view[1]) != (tuple(a.shape), shape):
            return f"%{u.name} orders its row another way"
        if view is None and u.type.size != 1 and len(u.shape) != len(shape):
            return f"%{u.name} differs per row but does not say which"
    return views


def _rewrite_sink_row_elementwise(graph: Graph, node: Node, views) -> Value:
    """op(rows seen channels-first, row values) -> the same op over the channels-last
    rows, seen channels-first: each row is the same elements in another order, and the
    op pairs its operands element by element."""
    at = graph.nodes.index(node)
    ins = []
    for u, view in zip(node.inputs, views):
        if view is None:
            ins.append(u)
            continue
        ins.append(graph.add_node("reshape", [view[0]], {"shape": view[1]}, index=at).output)
        at += 1
    a, shape = next(v for v in views if v is not None)
    y = graph.add_node(node.op, ins, dict(node.attrs), name=node.name, index=at).output
    x = graph.add_node("reshape", [y], {"shape": tuple(a.shape)}, index=at + 1).output
    t = graph.add_node("transpose", [x], {"perm": to_first(len(a.shape))}, index=at + 2).output
    return graph.add_node("reshape", [t], {"shape": shape}, index=at + 3).output


def _check_unrow(node: Node, ctx: Context):
    """reshape(op(rows), the rows' own shape): see _rewrite_unrow."""
    y = node.inputs[0]
    p = y.producer
    shape = tuple(node.attrs["shape"])
    if p is None or p.opdef.family is not Family.ELEMENTWISE:
        return "not a reshape of an elementwise result"
    rows = tuple(y.shape)
    if len(rows) < 2 or any(d != 1 for d in rows[1:-1]) or not shape or shape[0] != rows[0]:
        return "not a reshape of whole-sample rows"
    if not _rows_of(y, shape, UNROW_DEPTH):
        return ("not computed elementwise from rows of values of the reshaped shape and "
                "one value per row")
    return p


# How many elementwise ops deep _rows_of looks (a norm's last step is two or three
# ops from its input's rows).
UNROW_DEPTH = 6


def _rows_of(v: Value, shape: tuple, depth: int) -> bool:
    """Whether v, of whole-sample rows, is reshape(x, rows) of an x of `shape`, or an
    elementwise op of such rows and of values with one element per row (or in all)."""
    p = v.producer
    if p is None:
        return False
    if p.op == "reshape":
        return tuple(p.inputs[0].shape) == shape
    if depth == 0 or p.opdef.family is not Family.ELEMENTWISE:
        return False
    rows = tuple(v.shape)
    full = False
    for u in p.inputs:
        if tuple(u.shape) == rows:
            if not _rows_of(u, shape, depth - 1):
                return False
            full = True
        elif not (_row_broadcast(u) and (u.type.size == 1 or len(u.shape) == len(rows))):
            return False
    return full


def _rewrite_unrow(graph: Graph, node: Node, p: Node) -> Value:
    """reshape(op(rows of x, row values), x's shape) -> op(x, row values reshaped): the
    last step of a norm computed on rows (the rows the layout rules above made of
    channels-last values) writes its result in x's shape itself, in a loop kernel of its
    own (threaded, where the rows' kernel runs one row per thread), instead of a copy
    after it; the row kernel keeps the statistics."""
    shape = tuple(node.attrs["shape"])
    rows = tuple(p.outputs[0].shape)
    at = graph.nodes.index(node)
    ins = []
    for u in p.inputs:
        if tuple(u.shape) == rows:
            target = shape
        elif u.type.size == 1 and len(u.shape) <= len(shape):
            ins.append(u)
            continue
        else:
            target = (u.shape[0] if u.type.size != 1 else 1,) + (1,) * (len(shape) - 1)
        ins.append(graph.add_node("reshape", [u], {"shape": target}, index=at).output)
        at += 1
    return graph.add_node(p.op, ins, dict(p.attrs), name=p.name, index=at).output


def _check_reduce_row(node: Node, ctx: Context):
    view = _row_view(node.inputs[0])
    if view is None:
        return "the operand is not a channels-last row"
    rank = len(view[1])
    axes = {d % rank for d in node.attrs["axes"]}
    if rank - 1 not in axes:
        return "the rows are not reduced"
    return view


def _rewrite_reduce_row(graph: Graph, node: Node, view) -> Value:
    """A reduction of whole rows reads them in any order: the channels-last rows."""
    a, shape = view
    at = graph.nodes.index(node)
    x = graph.add_node("reshape", [a], {"shape": shape}, index=at).output
    return graph.add_node(node.op, [x], dict(node.attrs), name=node.name,
                          index=at + 1).output


def _group_view(v: Value) -> tuple | None:
    """(a, groups) if v = reshape(transpose(a, to_first), (N, G, M)) of a channels-last
    `a` (N, spatial.., C) with G > 1 groups of C / G channels, M their elements per
    sample (GroupNorm's rows); else None. In N,spatial..,C a group is every G-th run of
    C / G channels, not a row: its ops run on `a` itself, its reductions over the
    spatial dims (by columns, per channel) and then over the group's channels."""
    a = _flattened(v)
    shape = tuple(v.shape)
    if a is None or len(shape) != 3 or shape[0] != a.shape[0] or shape[1] <= 1 \
            or a.shape[-1] % shape[1]:
        return None
    return a, shape[1]


def _per_group(u: Value, n: int, groups: int) -> bool:
    """Whether u holds one value per (sample, group): shape (N or 1, G, 1)."""
    return len(u.shape) == 3 and u.shape[0] in (1, n) and u.shape[1:] == (groups, 1)


def _check_sink_group_elementwise(node: Node, ctx: Context):
    views = [_group_view(u) for u in node.inputs]
    first = next((v for v in views if v is not None), None)
    if first is None:
        return "no operand is channels-last values seen as channel groups"
    a, groups = first
    n = a.shape[0]
    if tuple(node.outputs[0].shape) != tuple(node.inputs[views.index(first)].shape):
        return "the result is not shaped as the groups"
    for u, view in zip(node.inputs, views):
        if view is not None and (tuple(view[0].shape), view[1]) != (tuple(a.shape), groups):
            return f"%{u.name} groups other values"
        if view is None and not (_per_group(u, n, groups)
                                 or (u.type.size == 1 and len(u.shape) <= len(a.shape))):
            return f"%{u.name} is neither grouped values nor one value per group"
    return views


def _rewrite_sink_group_elementwise(graph: Graph, node: Node, views) -> Value:
    """op(groups seen channels-first, per-group values) -> op(the channels-last values,
    each group's value repeated over its channels), seen as groups again."""
    a, groups = next(v for v in views if v is not None)
    rank, c = len(a.shape), a.shape[-1]
    at = graph.nodes.index(node)
    ins = []
    for u, view in zip(node.inputs, views):
        if view is not None:
            ins.append(view[0])
            continue
        if u.type.size == 1:
            ins.append(u)
            continue
        lead = (u.shape[0],) + (1,) * (rank - 2)
        x = graph.add_node("reshape", [u], {"shape": lead + (groups, 1)}, index=at).output
        x = graph.add_node("broadcast", [x], {"shape": lead + (groups, c // groups)},
                           index=at + 1).output
        ins.append(graph.add_node("reshape", [x], {"shape": lead + (c,)}, index=at + 2).output)
        at += 3
    y = graph.add_node(node.op, ins, dict(node.attrs), name=node.name, index=at).output
    t = graph.add_node("transpose", [y], {"perm": to_first(rank)}, index=at + 1).output
    return graph.add_node("reshape", [t], {"shape": tuple(node.outputs[0].shape)},
                          index=at + 2).output


def _check_reduce_groups(node: Node, ctx: Context):
    view = _group_view(node.inputs[0])
    if view is None:
        return "the operand is not channels-last values seen as channel groups"
    if {d % 3 for d in node.attrs["axes"]} != {2}:
        return "not a reduction of each group's elements"
    return view


def _rewrite_reduce_groups(graph: Graph, node: Node, view) -> Value:
    """reduce(groups) -> reduce over the spatial dims per channel (by columns, the
    channels contiguous), then over each group's channels."""
    a, groups = view
    rank, n, c = len(a.shape), a.shape[0], a.shape[-1]
    at = graph.nodes.index(node)
    per_channel = graph.add_node(node.op, [a], {**node.attrs, "axes": tuple(range(1, rank - 1)),
                                                "keepdims": True}, index=at).output
    x = graph.add_node("reshape", [per_channel], {"shape": (n, groups, c // groups)},
                       index=at + 1).output
    return graph.add_node(node.op, [x], {**node.attrs, "axes": (2,)}, name=node.name,
                          index=at + 2).output


def _check_sink_pad(node: Node, ctx: Context):
    if not _is_first(node.inputs[0]):
        return "the operand is not a channels-last value"
    return node


def _rewrite_sink_pad(graph: Graph, node: Node, _match) -> Value:
    """pad(T_first(a)) -> T_first(pad(a)), each dim's pads moved with it (any mode: a
    pad treats each dim on its own). A pad between convs (a TensorFlow export's, reflect
    padding in an image-to-image net) then keeps the chain channels-last."""
    a = node.inputs[0].producer.inputs[0]
    rank = len(a.shape)
    perm = to_first(rank)
    pads = node.attrs["pads"]
    moved = [0] * (2 * rank)
    for i, d in enumerate(perm):
        moved[d], moved[rank + d] = pads[i], pads[rank + i]
    at = graph.nodes.index(node)
    y = graph.add_node("pad", [a], {**node.attrs, "pads": tuple(moved)}, name=node.name,
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
        Rule("view_concat", frozenset({"concat"}), _check_view_concat, _rewrite_view_concat),
        Rule("view_slice", frozenset({"slice"}), _check_view_slice, _rewrite_view_slice),
        Rule("view_reshape", frozenset({"reshape"}), _check_view_reshape,
             _rewrite_view_reshape),
        Rule("sink_row_elementwise", _elementwise_ops(), _check_sink_row_elementwise,
             _rewrite_sink_row_elementwise),
        Rule("reduce_row", frozenset(REDUCTIONS), _check_reduce_row, _rewrite_reduce_row),
        Rule("sink_transpose_pad", frozenset({"pad"}), _check_sink_pad, _rewrite_sink_pad),
        Rule("sink_group_elementwise", _elementwise_ops(), _check_sink_group_elementwise,
             _rewrite_sink_group_elementwise),
        Rule("reduce_groups", frozenset(REDUCTIONS), _check_reduce_groups,
             _rewrite_reduce_groups),
        Rule("unrow", frozenset({"reshape"}), _check_unrow, _rewrite_unrow),
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
