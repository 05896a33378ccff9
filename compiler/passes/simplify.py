"""Graph clean-up passes: constant folding, dead code, common subexpressions.

Each pass is `fn(graph) -> bool` (whether it changed the graph), in place.
The algebraic identities (x*1, reshape of reshape, ...) live in identities.py.

Constant folding replaces a node whose inputs are all constants by a `const`
holding `OpDef.evaluate` of it, the same numpy semantics the interpreter uses,
so folding never changes what a graph computes. The folded value keeps its
name. Host nodes are never folded (compiler/ knows no framework, and some host
ops are random).

Common subexpressions: two nodes are the same when op, attributes and inputs
are (inputs compared as SSA values). Constants compare by value: dtype, shape
and bytes, so NaN payloads match themselves and -0.0 stays apart from 0.0.
Float attributes compare by repr for the same two reasons.
"""

from __future__ import annotations

import logging

import numpy as np

from compiler import dtypes
from compiler.errors import BrazeError
from compiler.ir import Graph, Node, Value
from compiler.ops import Family, get_op
from compiler.passes.rules import const_value

log = logging.getLogger("braze.passes")

# Results up to this many elements are always folded: shape chains, scalars,
# per-channel vectors. Larger results are folded only when no bigger than the
# constants they are computed from (a transposed or scaled weight is folded once
# at compile time, as inductor's freezing does; a scalar broadcast to a big
# tensor is not, as it would bloat memory for nothing).
FOLD_ALWAYS_ELEMENTS = 1 << 12
# An elementwise op on broadcast constants (an outer product: Swin's window mask is
# select(eq(sub(ids[w, 1, n], ids[w, n, 1]), 0), 0, -100), 64 x 49 x 49) computes a
# result larger than its inputs; up to this many elements (1 MiB of float32) it is
# folded all the same, as the work it saves runs on every call, inside a hot kernel.
# A bare broadcast (a movement op) is not: kernels read it through index arithmetic.
FOLD_GROWN_ELEMENTS = 1 << 18
# Nothing larger than this is folded, to bound compile time and memory; except a
# transpose or reshape of one constant, which only reorders what the model already holds
# (VGG's first FC weight, 25088 x 4096, is read through torch's W^T: unfolded, the
# matmul lost its packed GEMM and transposed 411 MB on every call).
FOLD_MAX_ELEMENTS = 1 << 26
FOLD_REORDER_OPS = ("transpose", "reshape")

# Constants up to this many elements are keyed by their bytes in CSE; larger ones
# (weights) by dtype, shape and CSE_SAMPLES evenly spaced elements, and merged only
# when all their bytes are equal (compared only where the samples agree). Shared weights
# are not rare: a torch.fx graph transposes ALBERT's one set of layer weights once per
# layer, and folding made twelve copies of each (77 constants, 356 MB, where the ONNX
# export has 11 and 44 MB), each packed and streamed from memory on its own.
CSE_CONST_ELEMENTS = 1 << 12
CSE_SAMPLES = 64


# -- constant folding ----------------------------------------------------------

def fold_refusal(node: Node, weight: bool = False) -> str | None:
    """None if `node` may be folded into a constant; else the reason it is not. A
    contraction's `weight` may outgrow its inputs (a scalar broadcast to a conv's kernel:
    ONNX models that build weights with ConstantOfShape): the kernel packs it at compile
    time, so it is held in full anyway."""
    if node.op in ("const", "host"):
        return f"{node.op} nodes are not folded"
    if any(const_value(v) is None for v in node.inputs):
        return "not every input is a constant"
    out_size = sum(o.type.size for o in node.outputs)
    in_size = sum(v.type.size for v in node.inputs)
    if out_size > FOLD_MAX_ELEMENTS and not (node.op in FOLD_REORDER_OPS
                                             and out_size == in_size):
        return f"its result has {out_size} elements (> FOLD_MAX_ELEMENTS)"
    grown = FOLD_GROWN_ELEMENTS if node.opdef.family is Family.ELEMENTWISE else 0
    if out_size > max(FOLD_ALWAYS_ELEMENTS, in_size, grown) and not weight:
        return f"its result ({out_size} elements) would outgrow its constant inputs"
    return None


def _folded(node: Node) -> list[np.ndarray] | str:
    """The node's results as arrays of exactly its output types, or why not."""
    try:
        arrays = node.opdef.evaluate(node, [const_value(v) for v in node.inputs])
    except BrazeError as e:  # e.g. a constant gather index out of range: fail at run time
        return f"evaluating it failed ({e})"
    out = []
    for v, a in zip(node.outputs, arrays):
        a = np.asarray(a)
        if a.shape != v.shape:
            return f"evaluation gave shape {a.shape}, not {v.shape}"
        out.append(a.astype(dtypes.to_numpy(v.dtype), copy=False))
    return out


def _become_const(node: Node, value: Value, array: np.ndarray) -> Node:
    """A const node producing `value` (same Value object, so the same name) from `array`."""
    arr = np.array(array, order="C")  # a copy; keeps 0-d arrays 0-d (ascontiguousarray does not)
    arr.setflags(write=False)
    const = Node("const", [], get_op("const").normalize_attrs({"value": arr}), node.name)
    const.outputs = [value]
    value.producer = const
    return const


def fold_constants(graph: Graph) -> bool:
    """Evaluate nodes whose inputs are all constants (bounded: see FOLD_* constants)."""
    nodes, changed = [], False
    weights = {v for n in graph.nodes if n.opdef.family is Family.CONTRACTION
               for v in n.inputs[1:]}
    for node in graph.nodes:
        why = fold_refusal(node, weight=any(v in weights for v in node.outputs))
        arrays = _folded(node) if why is None else why
        if isinstance(arrays, str):
            if node.op not in ("const", "host") and why != "not every input is a constant":
                log.debug("fold_constants: %s not folded: %s", node, arrays)
            nodes.append(node)
            continue
        nodes.extend(_become_const(node, v, a) for v, a in zip(node.outputs, arrays))
        changed = True
    graph.nodes = nodes
    return changed


# -- dead code -----------------------------------------------------------------

def remove_dead(graph: Graph) -> bool:
    """Drop nodes whose results nobody reads (graph outputs are read)."""
    return graph.remove_dead() > 0


# -- common subexpressions -----------------------------------------------------

def _freeze(x):
    """An attribute value as a hashable key that tells -0.0 from 0.0 and matches NaN."""
    if isinstance(x, float):
        return ("f", repr(x))
    if isinstance(x, tuple):
        return tuple(_freeze(e) for e in x)
    return x


def cse_key(node: Node, ids: dict[Value, int]) -> tuple | str:
    """What makes `node` equal to another, or the reason it is never merged."""
    if node.op == "host":
        return "host nodes are opaque (some are random or stateful)"
    if node.op == "const":
        arr = node.attrs["value"]
        if arr.dtype == object:
            return "string constants are not compared"
        if arr.size > CSE_CONST_ELEMENTS:  # merged only if _same_bytes (below)
            picks = np.linspace(0, arr.size - 1, CSE_SAMPLES).astype(np.int64)
            return ("large const", arr.dtype.str, arr.shape, arr.flat[picks].tobytes())
        return ("const", arr.dtype.str, arr.shape, arr.tobytes())
    attrs = tuple((k, _freeze(v)) for k, v in sorted(node.attrs.items()))
    return (node.op, attrs, tuple(ids[v] for v in node.inputs))


def _same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two constants of one dtype and shape hold the same bytes (NaNs and
    signed zeros as they are)."""
    if a is b:
        return True
    return np.array_equal(np.ascontiguousarray(a).view(np.uint8),
                          np.ascontiguousarray(b).view(np.uint8))


def eliminate_common_subexpressions(graph: Graph) -> bool:
    """Merge nodes with the same op, attributes and inputs (small constants by value)."""
    seen: dict[tuple, Node] = {}
    ids: dict[Value, int] = {v: i for i, v in enumerate(graph.inputs)}
    outputs = set(graph.outputs)
    kept, changed = [], False
    for node in graph.nodes:
        key = cse_key(node, ids)
        twins = seen.get(key, ()) if isinstance(key, tuple) else ()
        twin = next((t for t in twins if key[0] != "large const" or _same_bytes(
            node.attrs["value"], t.attrs["value"])), None)
        if twin is not None and any(o in outputs for o in node.outputs) and any(
                o in outputs for o in twin.outputs):
            log.debug("cse: %s kept apart from %s: both are graph outputs", node, twin)
            twin = None
        if twin is None:
            if isinstance(key, tuple):
                seen.setdefault(key, []).append(node)
            ids.update((o, len(ids)) for o in node.outputs)
            kept.append(node)
            continue
        for a, b in zip(node.outputs, twin.outputs):
            graph.replace_all_uses(a, b)
            ids[a] = ids[b]
        changed = True
    graph.nodes = kept
    return changed
