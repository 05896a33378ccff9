"""Object code of a cluster for linking into a C library (ahead of time, as tfcompile does).

The JIT path (compiled.py) emits code for an MCJIT engine: one entry named `run`, the
large code model. A library links many clusters into one shared object, so here each
cluster's module is optimized exactly as the JIT's is (the same IR, the same -O3
pipeline, hence the same arithmetic), then, before emission:
- its entry is renamed (`<prefix>_run`) and every other definition made internal, so
  clusters' kernels never clash with each other or with the program's own symbols;
- with `threads == 1`, its references to libgomp become weak: the entry only calls
  `GOMP_parallel` when given more than one thread, so a one-thread library links and
  runs without libgomp;
and the object is emitted position-independent (a shared object needs it).

Cross-compiling: with a `triple` (and `cpu`) other than the host's, the same module is
optimized and emitted for that target (e.g. aarch64-linux-gnu, neoverse-n1). braze's
kernels are written with 16-lane vectors, which LLVM legalizes for any target (correct
everywhere, tuned for AVX-512 hosts).
"""

from __future__ import annotations

import functools

import llvmlite.binding as llvm

from compiler.codegen import llvm_cpu
from compiler.errors import CompileError

ENTRY = "run"  # the entry point compiled.CpuProgram's code exports
OPENMP = ("GOMP_parallel", "omp_get_num_threads", "omp_get_thread_num")


def library_object(llvm_ir: str, prefix: str, threads: int, triple: str | None = None,
                   cpu: str | None = None) -> bytes:
    """Position-independent object code of one cluster's module (for the host CPU, or
    `triple`/`cpu`), whose only global definition is `<prefix>_run(void **table, int32
    threads)`."""
    machine = pic_machine(triple, cpu)
    try:
        module = llvm_cpu.optimize(llvm_ir, None if triple is None else machine)
    except RuntimeError as e:
        raise CompileError(f"LLVM rejected braze's IR: {e}") from None
    _internalize(module, prefix)
    if threads == 1:
        _weaken_openmp(module)
    return machine.emit_object(module)


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


def pic_machine(triple: str | None = None, cpu: str | None = None) -> llvm.TargetMachine:
    """A PIC target machine for the host (its CPU and features), or for `triple` and
    `cpu` (that CPU's own features; default "generic"). CompileError where LLVM does not
    know the triple."""
    host_triple, host_cpu, host_features = llvm_cpu.host()
    if triple is None:
        triple = host_triple
        features = host_features if cpu in (None, host_cpu) else ""
        cpu = cpu or host_cpu
    else:
        features = ""
        cpu = cpu or "generic"
    _init_all()
    try:
        target = llvm.Target.from_triple(triple)
    except RuntimeError as e:
        raise CompileError(f"LLVM cannot compile for triple {triple!r}: {e}") from None
    return target.create_target_machine(cpu=cpu, features=features, opt=3, reloc="pic",
                                        codemodel="default")


@functools.cache
def _init_all() -> None:
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
