"""Host nodes on constants, run once at compile time by onnxruntime.

braze's own constant folding (compiler/passes/simplify.py) never touches a host node:
the compiler knows no framework. An ONNX model often builds a constant with ops braze
does not convert (Swin's shifted-window attention mask is ScatterND into zeros, ten
times over): left alone, those nodes form a host step that recomputes the same
tensors on every call, and a boundary in front of the compiled code. Here each host
node whose inputs are all constants, and which draws no random numbers, is run once
by onnxruntime (the same session code as a host step) and replaced by its results.
"""

from __future__ import annotations

import logging

import numpy as np

from compiler.errors import BrazeError
from compiler.ir import Graph, Node
from compiler.passes.cluster import Cluster, outline

log = logging.getLogger("braze")

# ONNX ops whose result is a fresh draw each call: never computed ahead.
RANDOM_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike",
                        "RandomUniformLike", "Multinomial", "Bernoulli", "Dropout"})
# Results larger than this (elements, all outputs) stay computed at run time: a model
# that builds a huge tensor from a shape would otherwise carry it as a constant.
FOLD_MAX_ELEMENTS = 1 << 22


def refusal(node: Node) -> str | None:
    """None if host node `node` is computed now; else why not."""
    if node.op != "host":
        return "not a host node"
    if any(not v.is_const for v in node.inputs):
        return "an input is computed at run time"
    if node.attrs.get("op_type") in RANDOM_OPS:
        return "a random op: a new draw each call"
    if not all(o.type.static for o in node.outputs):
        return "an output's shape is not known"
    if sum(o.type.size for o in node.outputs) > FOLD_MAX_ELEMENTS:
        return f"more than {FOLD_MAX_ELEMENTS} elements"
    return None


def _fits(arr, out) -> bool:
    """Whether onnxruntime's result `arr` is a tensor of `out`'s IR type."""
    from compiler.dtypes import to_numpy

    try:
        return (isinstance(arr, np.ndarray) and tuple(arr.shape) == tuple(out.shape)
                and arr.dtype == to_numpy(out.dtype))
    except (TypeError, ValueError, KeyError):
        return False


def fold_constant_host_nodes(graph: Graph, opset: int) -> int:
    """Replace every host node of `graph` that `refusal` accepts by constants (in graph
    order, so a chain of them folds in one sweep); the count folded."""
    from runtime.fallback_onnx import OnnxHostStep

    folded = 0
    for node in list(graph.nodes):
        if refusal(node) is not None:
            continue
        one = Cluster(0, False, [node], [], list(node.outputs))
        try:
            arrays = OnnxHostStep(outline(graph, one), threads=1, opset=opset)([])
        except BrazeError as e:  # onnxruntime refused it: it stays a host node
            log.info("braze: host node %s stays at run time: %s", node.describe(), e)
            continue
        if not all(_fits(arr, out) for arr, out in zip(arrays, node.outputs)):
            continue  # a sequence, or not what the IR says the value is: left to run
        at = graph.nodes.index(node)
        for out, arr in zip(node.outputs, arrays):
            const = graph.add_node("const", [], {"value": arr}, out_names=[out.name],
                                   out_types=[out.type], index=at).output
            graph.replace_all_uses(out, const)
        graph.remove_node(node)
        folded += 1
    return folded
