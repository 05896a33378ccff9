"""Code generation: which nodes braze compiles for a target, and compiling a cluster.

`supports(node, target)` is the one registry that decides compile-or-fallback
per node (inductor's lowerings/make_fallback): None when braze's codegen emits
the node, else the sentence saying why not. `compile_graph` turns a cluster's
sub-graph into a CompiledGraph (compiler/codegen/compiled.py).
"""

from __future__ import annotations

from compiler.codegen.ops_llvm import INT_REFUSED, SUPPORTED_DTYPES
from compiler.errors import CompileError
from compiler.ir import Graph, Node
from compiler.ops import Family

TARGETS = ("cpu",)

_LIBRARY_CLASS = "library-class op {op}: not yet compiled by braze (runs on the host library)"


def supports(node: Node, target: str = "cpu") -> str | None:
    """None if braze compiles `node` for `target`; otherwise the reason it does not."""
    if target not in TARGETS:
        return f"no braze codegen for target {target!r}"
    family = node.opdef.family
    if family is Family.HOST:
        return node.attrs.get("reason") or "host op"
    if family is Family.POOL or (family is Family.CONTRACTION and node.op != "matmul"):
        return _LIBRARY_CLASS.format(op=node.op)
    for v in list(node.inputs) + list(node.outputs):
        if v.dtype not in SUPPORTED_DTYPES:
            return f"dtype {v.dtype} of %{v.name} is not compiled by braze"
        if not v.type.static:
            return f"%{v.name} has a data-dependent shape"
    if node.op in INT_REFUSED and node.inputs[0].dtype not in ("f32", "f64"):
        return INT_REFUSED[node.op]
    return None


def compile_graph(subgraph: Graph, target: str = "cpu", threads: int = 2, cache=None):
    """Compile a cluster's sub-graph into a CompiledGraph (`.run(arrays) -> arrays`).

    `threads`: threads for big kernels (CompiledGraph.set_threads changes it);
    `cache`: any object with get(key)/put(key, bytes) for the object code.
    CompileError names the first node braze cannot compile, and why.
    """
    from compiler.codegen.compiled import CompiledGraph

    for n in subgraph.nodes:
        reason = supports(n, target)
        if reason is not None:
            raise CompileError(f"cannot compile {n.describe()} for {target}: {reason}")
    return CompiledGraph(subgraph, threads=threads, cache=cache)
