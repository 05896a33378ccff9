"""Graph clean-up passes: constant folding, dead code, common subexpressions, identities.

Each pass is `fn(graph) -> bool` (whether it changed the graph), in place.

Identity rules (x is the non-constant operand, c a constant; each applies only
when the result has x's shape and dtype, so no broadcast is lost):
  x + 0, 0 + x, x - 0, x * 1, 1 * x, x / 1        -> x
  reshape/broadcast to x's own shape, transpose by the identity permutation,
  full slice (start 0, step 1, whole size), cast to x's dtype, zero padding,
  single-input concat, reduction over no axes      -> x
  reshape(reshape(x))                             -> reshape(x)
  transpose(transpose(x, p), q)                   -> transpose(x, p o q)
"""

from __future__ import annotations

import numpy as np

from compiler.ir import Graph, Node, Value

# Constants are folded up to this many output elements: enough for every weight
# transform (transposed or scaled weights are folded once at compile time, the
# way inductor's freezing does), small enough not to blow up memory on
# broadcast-produced giants.
FOLD_ELEMENTS = 1 << 24

# Constants up to this many elements are compared by value in CSE; larger ones
# only by identity (hashing weights costs more than it saves).
CSE_CONST_ELEMENTS = 1024


def const_value(v: Value) -> np.ndarray | None:
    """The array of a value produced by a `const` node, else None."""
    p = v.producer
    return p.attrs["value"] if p is not None and p.op == "const" else None


def _replace_with_consts(graph: Graph, node: Node, arrays: list) -> None:
    index = graph.nodes.index(node)
    for out, arr in zip(node.outputs, arrays):
        arr = np.ascontiguousarray(arr)
        arr.setflags(write=False)
        c = graph.add_node("const", [], {"value": arr}, out_names=[out.name + ".folded"],
                           index=index)
        graph.replace_all_uses(out, c.output)
        index += 1
    graph.nodes.remove(node)


def fold_constants(graph: Graph) -> bool:
    """Evaluate nodes whose inputs are all constants (bounded by FOLD_ELEMENTS)."""
    changed = False
    for node in list(graph.nodes):
        if node.op in ("const", "host") or not node.inputs:
            continue
        arrays = [const_value(v) for v in node.inputs]
        if any(a is None for a in arrays):
            continue
        if sum(o.type.size for o in node.outputs) > FOLD_ELEMENTS:
            continue
        _replace_with_consts(graph, node, node.opdef.evaluate(node, arrays))
        changed = True
    return changed


def remove_dead(graph: Graph) -> bool:
    """Drop nodes whose results nobody reads."""
    return graph.remove_dead() > 0


def _key(node: Node, ids: dict) -> tuple | None:
    if node.op == "host":
        return None  # opaque: may be random (RandomNormal) or stateful
    if node.op == "const":
        arr = node.attrs["value"]
        if arr.size > CSE_CONST_ELEMENTS or arr.dtype == object:
            return None
        return ("const", arr.dtype.str, arr.shape, arr.tobytes())
    attrs = tuple(sorted(node.attrs.items()))
    return (node.op, attrs, tuple(ids[v] for v in node.inputs))


def eliminate_common_subexpressions(graph: Graph) -> bool:
    """Merge nodes with the same op, attributes and inputs (small constants by value)."""
    seen: dict[tuple, Node] = {}
    ids: dict[Value, int] = {}
    changed = False
    for v in graph.inputs:
        ids[v] = len(ids)
    for node in list(graph.nodes):
        key = _key(node, ids)
        twin = seen.get(key) if key is not None else None
        if twin is not None and len(twin.outputs) == len(node.outputs):
            for a, b in zip(node.outputs, twin.outputs):
                graph.replace_all_uses(a, b)
                ids[a] = ids[b]
            graph.nodes.remove(node)
            changed = True
            continue
        if key is not None:
            seen[key] = node
        for o in node.outputs:
            ids[o] = len(ids)
    return changed


# -- identity rules ------------------------------------------------------------

def _all_equal(arr: np.ndarray | None, value) -> bool:
    return arr is not None and arr.dtype != object and arr.size > 0 and bool(np.all(arr == value))


def _passthrough(node: Node) -> Value | None:
    """The input this node returns unchanged, or None (see the module docstring)."""
    a = node.attrs
    x = node.inputs[0] if node.inputs else None
    out = node.outputs[0] if node.outputs else None
    if x is None or out is None or out.type != x.type:
        return None
    if node.op in ("reshape", "broadcast", "cast") or (node.op == "concat" and
                                                        len(node.inputs) == 1):
        return x
    if node.op == "transpose" and list(a["perm"]) == list(range(len(a["perm"]))):
        return x
    if node.op == "slice" and all(s == 0 for s in a["starts"]) and all(
            st == 1 for st in a["steps"]):
        return x
    if node.op == "pad" and not any(a["pads"]):
        return x
    if node.op.startswith("reduce_") and not a["axes"]:
        return x
    return _arith_identity(node)


_NEUTRAL = {"add": 0, "sub": 0, "mul": 1, "div": 1}


def _arith_identity(node: Node) -> Value | None:
    if node.op not in _NEUTRAL:
        return None
    a, b = node.inputs
    out, neutral = node.outputs[0], _NEUTRAL[node.op]
    if out.type == a.type and _all_equal(const_value(b), neutral):
        return a
    if node.op in ("add", "mul") and out.type == b.type and _all_equal(const_value(a), neutral):
        return b
    return None


def _compose(node: Node) -> bool:
    """reshape(reshape(x)) and transpose(transpose(x)): read x directly."""
    src = node.inputs[0].producer if node.inputs else None
    if src is None or src.op != node.op or node.op not in ("reshape", "transpose"):
        return False
    if node.op == "transpose":
        inner, outer = src.attrs["perm"], node.attrs["perm"]
        node.attrs["perm"] = tuple(inner[p] for p in outer)
    node.inputs[0] = src.inputs[0]
    return True


def simplify_identities(graph: Graph) -> bool:
    """Apply the identity rules of the module docstring."""
    changed = False
    outputs = set(graph.outputs)
    for node in list(graph.nodes):
        if node.op in ("const", "host"):
            continue
        if _compose(node):
            changed = True
        x = _passthrough(node)
        if x is None:
            continue
        out = node.outputs[0]
        if out in outputs and (x in outputs or x.producer is None):
            continue  # keep a distinct value for the graph output
        graph.replace_all_uses(out, x)
        changed = True
    return changed
