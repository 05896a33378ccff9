"""Fold per-channel affine ops (batch norm in inference) into the contraction before them.

BatchNormalization in inference is y = x * s + t with per-channel constants
s = gamma / sqrt(var + eps), t = beta - mean * s; the importer emits exactly a
mul then an add, with s and t shaped (C, 1, ..., 1). For a convolution with
weights W (M, C/g, k...) and bias b (M), output channel m is
conv(x, W, b)[n, m, ...] = sum(W[m] * window) + b[m], which is linear in (W[m], b[m]):

  conv(x, W, b) * s  =  conv(x, W * s[:, None, ...], b * s)    (conv_mul)
  conv(x, W, b) + t  =  conv(x, W, b + t)                      (conv_add; no b: b = 0)

For a matmul with constant B (..., K, N), column n of the result is x @ B[:, n]:

  matmul(x, B) * s   =  matmul(x, B * s[None, :])   s along the last axis   (matmul_mul)

Gemm is matmul then add(bias); a BN after it needs the scale moved in front of
the bias first, and chains of constant adds/muls collapse:

  (z + a) * c  =  z * c + a * c      when z comes from a conv/matmul/mul   (push_mul)
  (z + a) + c  =  z + (a + c);   (z * a) * c  =  z * (a * c)              (merge_add, merge_mul)
  x - c        =  x + (-c)           exact, so the add rules see subtractions   (sub_as_add)

s, t, c "per channel" means the constant broadcasts against the result without
changing its shape and varies along the channel axis only (axis 1 for conv, the
last for matmul): shapes (C,1,1), (1,C,1,1), (C,) for matmul, or a scalar.

Conditions (each refusal says which failed): the intermediate has exactly one
reader and is no graph output (else its unfolded value is still needed); the
contraction's weight (and bias) are constants; scale constants are finite
(conv(x)*inf is NaN where conv(x) = 0, the folded form need not be). Float
constants are combined in float64 and rounded once, so results match within the
rounding of one multiply; integer constants combine in their own (wrapping)
arithmetic, which is exact modulo 2**bits just as the original is.
"""

from __future__ import annotations

import numpy as np

from compiler import dtypes
from compiler.ir import Graph, IRError, Node, Value
from compiler.ops.contraction import channels_last
from compiler.ops.elementwise import broadcast_shapes
from compiler.passes.rules import Context, Rule, apply_rules, const_value, new_const

# Producers into which a following scale can be folded: pushing a mul in front
# of an add only helps when one of these is there to absorb it.
_SCALE_ABSORBERS = ("conv", "matmul", "mul")
# Producers into which a following constant offset can be folded.
# (a sub next to another constant sub becomes an add too, so both count.)
_OFFSET_ABSORBERS = ("conv", "add", "sub")


def combine(op: str, a: np.ndarray, b: np.ndarray, dtype) -> np.ndarray:
    """a (op) b, broadcast, in float64 for floats (rounded once) or natively for integers."""
    if np.dtype(dtype).kind == "f":
        a, b = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(all="ignore"):
        return {"add": np.add, "mul": np.multiply}[op](a, b).astype(dtype)


def split(node: Node) -> tuple[Value, np.ndarray] | str:
    """(variable operand, constant array) of an add/mul/sub with one constant operand."""
    a, b = node.inputs
    ca, cb = const_value(a), const_value(b)
    if cb is not None and ca is None:
        return a, cb
    if ca is not None and cb is None and node.op in ("add", "mul"):
        return b, ca
    return f"{node.op} does not have exactly one constant operand (on a side that allows it)"


def along(c: np.ndarray, shape: tuple, axis: int) -> np.ndarray | str:
    """c as a vector over `axis` of `shape` if it only varies there and does not grow
    the shape; else why not."""
    if c.ndim > len(shape):
        return f"constant {c.shape} has a higher rank than the result {shape}"
    try:
        grown = broadcast_shapes(shape, c.shape) != tuple(shape)
    except IRError:
        grown = True
    if grown:
        return f"constant {c.shape} would broadcast the result {shape} to a larger shape"
    full = c.reshape((1,) * (len(shape) - c.ndim) + c.shape)
    axis %= len(shape)
    if any(d != 1 for i, d in enumerate(full.shape) if i != axis):
        return f"constant {c.shape} varies along more than axis {axis} of {shape}"
    return np.broadcast_to(full.reshape(-1), (shape[axis],))


def _operand(node: Node, ctx: Context, producer_ops: tuple) -> tuple | str:
    """(producer node, constant) when node = op(producer's sole output, constant)."""
    parts = split(node)
    if isinstance(parts, str):
        return parts
    y, c = parts
    p = y.producer
    if p is None or p.op not in producer_ops:
        return f"the variable operand is not produced by {' or '.join(producer_ops)}"
    return ctx.sole_reader(y) or (p, c)


def _finite(c: np.ndarray) -> str | None:
    if c.dtype.kind == "f" and not np.all(np.isfinite(c)):
        return "the scale has non-finite entries"
    return None


# -- into conv ------------------------------------------------------------------

def check_conv(node: Node, ctx: Context):
    found = _operand(node, ctx, ("conv",))
    if isinstance(found, str):
        return found
    conv, c = found
    vec = along(c, conv.outputs[0].shape, 1)
    if isinstance(vec, str):
        return vec
    if node.op == "mul" and (const_value(conv.inputs[1]) is None or _finite(c)):
        return _finite(c) or "the conv's weight is not a constant"
    if len(conv.inputs) == 3 and const_value(conv.inputs[2]) is None:
        return "the conv's bias is not a constant"
    return conv, vec


def rewrite_conv(graph: Graph, node: Node, match) -> Value:
    conv, vec = match
    w_val = conv.inputs[1]
    w = const_value(w_val)
    b = const_value(conv.inputs[2]) if len(conv.inputs) == 3 else None
    dtype = dtypes.to_numpy(conv.outputs[0].dtype)
    if b is None:
        b = np.zeros(conv.outputs[0].shape[1], dtype)
    if node.op == "mul":
        w_val = new_const(graph, conv, combine("mul", w, vec.reshape((-1,) + (1,) * (w.ndim - 1)),
                                               w.dtype), w_val.name + ".scaled")
        b = combine("mul", b, vec, dtype)
    else:
        b = combine("add", b, vec, dtype)
    bias = new_const(graph, conv, b, conv.outputs[0].name + ".bias")
    graph.set_inputs(conv, [conv.inputs[0], w_val, bias])
    return conv.outputs[0]


# -- into matmul ----------------------------------------------------------------

def check_matmul(node: Node, ctx: Context):
    found = _operand(node, ctx, ("matmul",))
    if isinstance(found, str):
        return found
    mm, c = found
    if const_value(mm.inputs[1]) is None:
        return "the matmul's right operand is not a constant"
    vec = along(c, mm.outputs[0].shape, -1)
    if isinstance(vec, str):
        return vec
    return _finite(c) or (mm, vec)


def rewrite_matmul(graph: Graph, node: Node, match) -> Value:
    mm, vec = match
    b = const_value(mm.inputs[1])
    graph.set_inputs(mm, [mm.inputs[0], new_const(graph, mm, combine("mul", b, vec, b.dtype),
                                                  mm.inputs[1].name + ".scaled")])
    return mm.outputs[0]


# -- chains of constant adds and muls -----------------------------------------

def _merged(op: str, a: np.ndarray, c: np.ndarray) -> str | None:
    """None if a (op) c may replace a and c: no larger than either, and finite where
    they are (an overflowing product would turn 0 * 1e30 * 1e30 = 0 into 0 * inf = NaN)."""
    shape = broadcast_shapes(a.shape, c.shape)
    if int(np.prod(shape)) > max(a.size, c.size):
        return f"constants {a.shape} and {c.shape} would merge into a larger one {shape}"
    if a.dtype.kind == "f":
        merged = combine(op, a, c, a.dtype)
        finite = np.isfinite(a) & np.isfinite(c)
        if np.any(finite & ~np.isfinite(merged)):
            return "the merged constant overflows"
    return None


def check_merge(node: Node, ctx: Context):
    found = _operand(node, ctx, (node.op,))
    if isinstance(found, str):
        return found
    inner, c = found
    parts = split(inner)
    if isinstance(parts, str):
        return f"the inner {parts}"
    z, a = parts
    if z.type != node.outputs[0].type:
        return f"the constants broadcast %{z.name} to a larger shape"
    return _merged(node.op, a, c) or (inner, z, a, c)


def rewrite_merge(graph: Graph, node: Node, match) -> Value:
    inner, z, a, c = match
    graph.set_inputs(inner, [z, new_const(graph, inner, combine(node.op, a, c, a.dtype),
                                          inner.outputs[0].name + ".c")])
    return inner.outputs[0]


def check_push_mul(node: Node, ctx: Context):
    found = _operand(node, ctx, ("add",))
    if isinstance(found, str):
        return found
    add, c = found
    parts = split(add)
    if isinstance(parts, str):
        return f"the inner {parts}"
    z, a = parts
    if z.producer is None or z.producer.op not in _SCALE_ABSORBERS or ctx.sole_reader(z):
        return ("no conv, matmul or mul read only by the add would absorb the scale, "
                "so moving it gains nothing")
    if z.type != node.outputs[0].type:
        return f"the constants broadcast %{z.name} to a larger shape"
    return _finite(c) or _merged("mul", a, c) or (add, z, a, c)


def rewrite_push_mul(graph: Graph, node: Node, match) -> Value:
    add, z, a, c = match
    scale = new_const(graph, add, c, node.outputs[0].name + ".s")
    scaled = graph.add_node("mul", [z, scale], name=node.name,
                            index=graph.nodes.index(add)).output
    graph.set_inputs(add, [scaled, new_const(graph, add, combine("mul", a, c, a.dtype),
                                             add.outputs[0].name + ".c")])
    return add.outputs[0]


def check_sub(node: Node, ctx: Context):
    x, c = node.inputs[0], const_value(node.inputs[1])
    if c is None or const_value(x) is not None:
        return "only x - constant becomes an add"
    readers = ctx.readers(node.outputs[0])
    merges_back = x.producer is not None and x.producer.op in _OFFSET_ABSORBERS
    merges_on = len(readers) == 1 and readers[0].op in ("add", "sub", "mul")
    if not (merges_back or merges_on):
        return ("no conv, add or mul next to it would absorb the offset, "
                "so rewriting gains nothing")
    return c


def rewrite_sub(graph: Graph, node: Node, c: np.ndarray) -> None:
    with np.errstate(all="ignore"):
        neg = np.negative(c)
    node.op = "add"
    graph.set_input(node, 1, new_const(graph, node, neg, node.inputs[1].name + ".neg"))


def spatial_axes(node: Node) -> list[int]:
    """The spatial dims of a conv's or pool's input, in its layout."""
    rank = len(node.inputs[0].shape)
    return list(range(1, rank - 1)) if channels_last(node) else list(range(2, rank))


def check_pad_into_window(node: Node, ctx: Context):
    x = node.inputs[0]
    p = x.producer
    if p is None or p.op != "pad":
        return "the input is not padded by a pad op"
    if node.op == "avg_pool" and not node.attrs.get("count_include_pad"):
        return "an average that leaves padding out of its count would count the zeros"
    a = p.attrs
    if a["mode"] != "constant" or float(a["value"]) != 0.0:
        return f"a {a['mode']} pad by {a['value']}, not by zeros"
    rank = len(x.shape)
    begin, end = a["pads"][:rank], a["pads"][rank:]
    axes = spatial_axes(node)
    if any(b < 0 or e < 0 for b, e in zip(begin, end)):
        return "a negative pad (a crop)"
    if any((begin[d] or end[d]) for d in range(rank) if d not in axes):
        return "the pad reaches beyond the spatial dims"
    return begin, end, axes


def rewrite_pad_into_window(graph: Graph, node: Node, match) -> None:
    """conv(pad(x, zeros)) -> conv(x) with the pad added to its own (a TensorFlow
    export's SAME padding, an explicit F.pad before a conv): the window kernels test
    their taps against the image's edges anyway, where the pad op was a copy."""
    begin, end, axes = match
    pads = node.attrs["pads"]
    s = len(axes)
    node.attrs = {**node.attrs,
                  "pads": tuple([pads[i] + begin[d] for i, d in enumerate(axes)]
                                + [pads[s + i] + end[d] for i, d in enumerate(axes)])}
    graph.set_input(node, 0, node.inputs[0].producer.inputs[0])


RULES = [
    Rule("pad_into_window", frozenset({"conv", "avg_pool"}), check_pad_into_window,
         rewrite_pad_into_window),
    Rule("sub_as_add", frozenset({"sub"}), check_sub, rewrite_sub),
    Rule("conv_affine", frozenset({"mul", "add"}), check_conv, rewrite_conv),
    Rule("matmul_mul", frozenset({"mul"}), check_matmul, rewrite_matmul),
    Rule("merge_constants", frozenset({"mul", "add"}), check_merge, rewrite_merge),
    Rule("push_mul", frozenset({"mul"}), check_push_mul, rewrite_push_mul),
]


def fold_affine_into_contractions(graph: Graph) -> bool:
    """Fold per-channel mul/add constants (batch norm) into conv/matmul (one sweep)."""
    return apply_rules(graph, RULES)
