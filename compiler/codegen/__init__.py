"""Code generation: which nodes braze compiles for a target, and compiling a cluster.

`supports(node, target)` is the one registry that decides compile-or-fallback
per node (inductor's lowerings/make_fallback): None when braze's codegen emits
the node, else the sentence saying why not. `compile_graph` turns a cluster's
sub-graph into data for the runtime: a CpuProgram (object code and memory plan:
compiler/codegen/compiled.py; runtime/cpu.py runs it) for the CPU, or a CudaProgram
(PTX: compiler/codegen/cuda.py; runtime/cuda.py runs it) for "cuda".
"""

from __future__ import annotations

from compiler.codegen.ops_llvm import CAST_ONLY_DTYPES, INT_REFUSED, SUPPORTED_DTYPES
from compiler.errors import BrazeError, CompileError
from compiler.ir import Graph, Node
from compiler.ops import Family
from compiler.target import kind as target_kind

# Codegens; "cpu" also takes "cpu:<LLVM CPU name>..." (compiler/target.py parses those).
TARGETS = ("cpu", "cuda")

_LIBRARY_CLASS = "library-class op {op}: not yet compiled by braze (runs on the host library)"


def supports(node: Node, target: str = "cpu") -> str | None:
    """None if braze compiles `node` for `target`; otherwise the reason it does not."""
    if _kind(target) not in TARGETS:
        return f"no braze codegen for target {target!r}"
    target = _kind(target)
    family = node.opdef.family
    if family is Family.HOST:
        return node.attrs.get("reason") or "host op"
    if target == "cuda":
        from compiler.codegen import cuda

        reason = cuda.refusal(node)  # library-class ops; libm calls without libdevice
        if reason is not None:
            return reason
    if node.op in ("conv", "max_pool", "avg_pool"):
        reason = channels_last_refusal(node, target)
        if reason is None and node.attrs["layout"] != "NHWC":
            reason = "NCHW: braze compiles it channels-last (the layout pass sets that)"
        if reason is not None:
            return _LIBRARY_CLASS.format(op=node.op) + f": {reason}"
    if node.op in ("attention", "recurrence"):
        from compiler.kernels import attention, recurrent

        reason = (attention if node.op == "attention" else recurrent).refusal(node)
        if reason is not None:
            return _LIBRARY_CLASS.format(op=node.op) + f": {reason}"
    for v in list(node.inputs) + list(node.outputs):
        if v.dtype not in SUPPORTED_DTYPES:
            return f"dtype {v.dtype} of %{v.name} is not compiled by braze"
        if v.dtype in CAST_ONLY_DTYPES and node.op not in ("cast", "bitcast") and \
                family not in (Family.MOVEMENT, Family.CONST):
            return (f"dtype {v.dtype} of %{v.name}: braze computes it as f32 (casts at "
                    f"the edges), and this {node.op} node was left computing on it")
        if not v.type.static:
            return f"%{v.name} has a data-dependent shape"
    if node.op in INT_REFUSED and node.inputs[0].dtype not in ("f32", "f64"):
        return INT_REFUSED[node.op]
    return None


def channels_last_refusal(node: Node, target: str = "cpu") -> str | None:
    """None if braze compiles conv/pool `node` channels-last for `target`, else why not
    (the layout pass converts exactly these; compiler/kernels/conv.py runs the convs)."""
    if _kind(target) not in TARGETS:
        return f"no braze codegen for target {target!r}"
    target = _kind(target)
    if target == "cuda":
        return "channels-last conv and pooling kernels are CPU-only"
    x = node.inputs[0]
    grouped = node.op == "conv" and node.attrs["group"] != 1
    if not x.type.static or len(x.shape) not in ((3, 4) if grouped else (4,)):
        return f"{len(x.shape) - 2}-d windows: braze compiles 2-d ones " \
               f"(and 1-d grouped convs)"
    if node.op != "conv":
        return None if x.dtype in ("f32", "f64") else f"dtype {x.dtype}"
    from compiler.kernels import conv, grouped

    return conv.refusal(node) if node.attrs["group"] == 1 else grouped.refusal(node)


def _kind(target) -> str | None:
    """"cpu" or "cuda" for a target spec (or Target), None for one braze does not know."""
    try:
        return target_kind(target)
    except BrazeError:
        return None


def compile_graph(subgraph: Graph, target="cpu", cache=None, arch: str | None = None):
    """Compile a cluster's sub-graph into a CpuProgram (object code and memory plan; run it
    with runtime.cpu.CpuStep), or for target "cuda" into a CudaProgram (PTX for `arch`,
    default sm_80; runtime.cuda.CudaStep runs it). Neither needs the device to exist.
    A CPU target is "cpu" (this machine), "cpu:<LLVM CPU name>[,+f,-f][@triple]" or a
    compiler.target.Target; code for a CPU this machine cannot run compiles (CpuStep
    refuses to run it).

    `cache`: any object with get(key)/put(key, bytes) for the object code (or PTX).
    CompileError names the first node braze cannot compile, and why.
    """
    target_kind(target)  # TargetError on a malformed spec
    for n in subgraph.nodes:
        reason = supports(n, target)
        if reason is not None:
            raise CompileError(f"cannot compile {n.describe()} for {target}: {reason}")
    if target_kind(target) == "cuda":
        from compiler.codegen.cuda import compile_cuda
        from compiler.codegen.nvptx import DEFAULT_ARCH

        return compile_cuda(subgraph, arch=arch or DEFAULT_ARCH, cache=cache)
    from compiler import gc_paused
    from compiler.codegen.compiled import compile_cpu

    with gc_paused():
        return compile_cpu(subgraph, cache=cache, target=target)
