"""Object code of a cluster for linking into a C library (ahead of time, as tfcompile does).

The JIT path (compiled.py) emits code for an MCJIT engine: one entry named `run`, the
large code model. A library links many clusters into one shared object, so here each
cluster's module is optimized exactly as the JIT's is (the same IR, the same -O3
pipeline, hence the same arithmetic), then, before emission:
- its entry is renamed (`<prefix>_run`) and every other definition made internal, so
  clusters' kernels never clash with each other or with the program's own symbols;
- `braze_parallel` (compiler/codegen/parallel.py) is linked in as its OpenMP
  definition (a library starts no threads of its own: GOMP_parallel's team shares the
  kernels' items), internal like the rest;
- with `threads == 1`, its references to libgomp become weak: the entry only calls
  `braze_parallel` or `GOMP_parallel` when given more than one thread, so a one-thread
  library links and runs without libgomp;
and the object is emitted position-independent (a shared object needs it).

Cross-compiling: for a compiler/target.py Target other than the host (e.g.
"cpu:neoverse-n1@aarch64-linux-gnu"), the module is rendered for that target (its
register tile) and optimized and emitted for it.
"""

from __future__ import annotations

import llvmlite.binding as llvm

from compiler import target as targets
from compiler.codegen import llvm_cpu, parallel
from compiler.errors import CompileError
from compiler.target import Target

ENTRY = "run"  # the entry point compiled.CpuProgram's code exports
OPENMP = ("GOMP_parallel", "omp_get_num_threads", "omp_get_thread_num")


def library_object(llvm_ir: str, prefix: str, threads: int, target: Target) -> bytes:
    """Position-independent object code of one cluster's module for `target` (its IR
    rendered for that target), whose only global definition is `<prefix>_run(void
    **table, int32 threads)`."""
    try:
        module = llvm_cpu.optimize(llvm_ir, target,
                                   link=(parallel.gomp_module(target.triple),))
    except RuntimeError as e:
        raise CompileError(f"LLVM rejected braze's IR: {e}") from None
    _internalize(module, prefix)
    if threads == 1:
        _weaken_openmp(module)
    return pic_machine(target).emit_object(module)


def _internalize(module: llvm.ModuleRef, prefix: str) -> None:
    for fn in module.functions:
        if fn.is_declaration:
            continue
        if fn.name == ENTRY:
            fn.name = f"{prefix}_{ENTRY}"
        else:
            fn.linkage = llvm.Linkage.internal
    for g in module.global_variables:
        if not g.is_declaration:
            g.linkage = llvm.Linkage.internal


def _weaken_openmp(module: llvm.ModuleRef) -> None:
    for fn in module.functions:
        if fn.is_declaration and fn.name in OPENMP:
            fn.linkage = llvm.Linkage.external_weak


def pic_machine(target: Target) -> llvm.TargetMachine:
    """A target machine for `target` emitting position-independent code (a shared object
    needs it; the JIT's machine uses the large code model instead)."""
    targets.init()
    return llvm.Target.from_triple(target.triple).create_target_machine(
        cpu=target.cpu, features=target.features, opt=3, reloc="pic", codemodel="default")
