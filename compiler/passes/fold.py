"""Fold per-channel affine ops (batch norm in inference) into the contraction before them.

BatchNormalization in inference is y = x * s + t with per-channel constants
s = gamma / sqrt(var + eps), t = beta - mean * s (the importer emits exactly
mul then add). After a convolution z = conv(x, W) + b:

  conv(x, W, b) * s     = conv(x, W * s[:, None, ...], b * s)        (rule conv_mul)
  conv(x, W, b) + t     = conv(x, W, b + t)                          (rule conv_add)
  matmul(x, B) * s      = matmul(x, B * s[None, :])  (s along the last axis; rule matmul_mul)

and to bring a scale past a bias (Gemm = matmul then add, then BN):

  (y + a) * s           = y * s + a * s                              (rule push_mul)
  (y + a) + c           = y + (a + c);  (y * a) * c = y * (a * c)    (rules merge_*)

Each rule needs the intermediate to have a single reader (else the unfolded
value is still needed) and constants that only vary along the channel axis
(axis 1 for conv, the last axis for matmul). The new constants are computed in
float64 and rounded once.
"""

from __future__ import annotations

import numpy as np

from compiler.ir import Graph, Node, Value
from compiler.ops.elementwise import broadcast_shapes
from compiler.passes.simplify import const_value


def _single_reader(graph: Graph, v: Value, users: dict) -> bool:
    return len(users.get(v, [])) == 1 and v not in graph.outputs


def _split(node: Node) -> tuple[Value, np.ndarray] | None:
    """(variable operand, constant operand) of a binary node, if exactly one is constant."""
    a, b = node.inputs
    ca, cb = const_value(a), const_value(b)
    if cb is not None and ca is None:
        return a, cb
    if ca is not None and cb is None and node.op in ("add", "mul"):
        return b, ca
    return None


def _along(c: np.ndarray, shape: tuple, axis: int) -> np.ndarray | None:
    """c as a 1-D vector over `axis` of `shape`, if c broadcasts there and varies only
    along that axis without changing the shape; else None."""
    if c.ndim > len(shape):
        return None
    try:
        if broadcast_shapes(shape, c.shape) != tuple(shape):
            return None
    except Exception:
        return None
    full = c.reshape((1,) * (len(shape) - c.ndim) + c.shape)
    if any(d != 1 for i, d in enumerate(full.shape) if i != axis % len(shape)):
        return None
    return np.broadcast_to(full.reshape(-1), (shape[axis],)).astype(np.float64)


def _new_const(graph: Graph, node: Node, arr: np.ndarray, dtype, hint: str) -> Value:
    out = np.ascontiguousarray(arr.astype(dtype))
    out.setflags(write=False)
    return graph.add_node("const", [], {"value": out}, out_names=[hint],
                          index=graph.nodes.index(node)).output


def _conv_affine(graph: Graph, conv: Node, node: Node, vec: np.ndarray) -> bool:
    w = const_value(conv.inputs[1])
    if w is None:
        return False
    b = const_value(conv.inputs[2]) if len(conv.inputs) == 3 else np.zeros(w.shape[0], w.dtype)
    if b is None:
        return False
    w64, b64 = w.astype(np.float64), b.astype(np.float64)
    if node.op == "mul":
        w64 = w64 * vec.reshape((-1,) + (1,) * (w.ndim - 1))
        b64 = b64 * vec
    else:
        b64 = b64 + vec
    name = conv.outputs[0].name
    conv.inputs = [conv.inputs[0], _new_const(graph, conv, w64, w.dtype, name + ".w"),
                   _new_const(graph, conv, b64, w.dtype, name + ".b")]
    return True


def _matmul_scale(graph: Graph, mm: Node, vec: np.ndarray) -> bool:
    bmat = const_value(mm.inputs[1])
    if bmat is None:
        return False
    scaled = bmat.astype(np.float64) * vec
    mm.inputs = [mm.inputs[0], _new_const(graph, mm, scaled, bmat.dtype,
                                          mm.outputs[0].name + ".w")]
    return True


def _fold_into_producer(graph: Graph, node: Node, users: dict) -> bool:
    split = _split(node)
    if split is None:
        return False
    y, c = split
    p = y.producer
    if p is None or not _single_reader(graph, y, users) or c.dtype.kind != "f":
        return False
    if node.outputs[0].type != y.type:
        return False
    done = False
    if p.op == "conv" and (vec := _along(c, y.shape, 1)) is not None:
        done = _conv_affine(graph, p, node, vec)
    elif p.op == "matmul" and node.op == "mul" and (vec := _along(c, y.shape, -1)) is not None:
        done = _matmul_scale(graph, p, vec)
    elif p.op in ("add", "mul") and (inner := _split(p)) is not None:
        done = _reassociate(graph, p, node, inner, c)
    if done:
        graph.replace_all_uses(node.outputs[0], y)
    return done


def _reassociate(graph: Graph, p: Node, node: Node, inner, c: np.ndarray) -> bool:
    """(y + a) * c -> y * c + a * c; (y + a) + c -> y + (a + c); (y * a) * c -> y * (a*c)."""
    z, a = inner
    out = p.outputs[0]
    if z.type != out.type or a.dtype != c.dtype:
        return False
    a64, c64 = a.astype(np.float64), c.astype(np.float64)
    if p.op == node.op:
        merged = a64 + c64 if p.op == "add" else a64 * c64
        p.inputs = [z, _new_const(graph, p, merged, a.dtype, out.name + ".c")]
        return True
    if p.op == "add" and node.op == "mul":  # (z + a) * c = z * c + a * c
        index = graph.nodes.index(p)
        cval = _new_const(graph, p, c64, c.dtype, out.name + ".s")
        scaled = graph.add_node("mul", [z, cval], name=node.name,
                                index=index + 1).output
        p.inputs = [scaled, _new_const(graph, p, a64 * c64, a.dtype, out.name + ".c")]
        graph.toposort()
        return True
    return False


def fold_affine_into_contractions(graph: Graph) -> bool:
    """Fold per-channel mul/add constants (batch norm) into conv/matmul (module docstring)."""
    changed = False
    progress = True
    while progress:
        progress = False
        users = graph.users()
        for node in list(graph.nodes):
            if node.op in ("mul", "add") and node in graph.nodes:
                if _fold_into_producer(graph, node, users):
                    graph.nodes.remove(node)
                    progress = changed = True
                    break
    return changed
