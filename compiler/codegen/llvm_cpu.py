"""The host CPU as an LLVM target: initialization, the target machine, compiling a module.

Render (an llvmlite.ir.Module), compile (optimize at -O3 with the new pass
manager for the host's CPU name and features, AVX-512 included), and load (an
MCJIT engine, kept alive as long as any function pointer from it is used) are
separate steps, so compiled object code can also be cached and reloaded.

Threads: kernels split their outer loops with GNU OpenMP's `GOMP_parallel`
(libgomp, loaded once): a warm team launches in microseconds, with no Python
on the path. Where libgomp is missing, kernels run on one thread.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import threading

import llvmlite.binding as llvm

log = logging.getLogger("braze")
_lock = threading.Lock()


@functools.cache
def _init() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()


@functools.cache
def libgomp() -> bool:
    """Load libgomp for GOMP_parallel; False (one thread) if it cannot be found."""
    name = ctypes.util.find_library("gomp")
    if name is None:
        log.info("libgomp not found: braze's kernels run on one thread")
        return False
    try:
        llvm.load_library_permanently(name)
    except RuntimeError as e:
        log.info("cannot load %s (%s): braze's kernels run on one thread", name, e)
        return False
    return True


@functools.cache
def host() -> tuple[str, str, str]:
    """(triple, CPU name, feature string) of this machine."""
    _init()
    return (llvm.get_process_triple(), llvm.get_host_cpu_name(),
            llvm.get_host_cpu_features().flatten())


@functools.cache
def target_machine() -> llvm.TargetMachine:
    """The shared target machine for optimizing and emitting (never given to an engine)."""
    return _new_target_machine()


def _new_target_machine() -> llvm.TargetMachine:
    triple, cpu, features = host()
    target = llvm.Target.from_triple(triple)
    return target.create_target_machine(cpu=cpu, features=features, opt=3, reloc="default",
                                        codemodel="large")


def optimize(module_text: str) -> llvm.ModuleRef:
    """Parse and optimize LLVM IR for the host at -O3 (loop and SLP vectorizers on)."""
    _init()
    tm = target_machine()
    mod = llvm.parse_assembly(module_text)
    mod.triple = tm.triple
    mod.data_layout = str(tm.target_data)
    mod.verify()
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_unrolling = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return mod


class JitModule:
    """A loaded module: function addresses stay valid while this object lives."""

    def __init__(self, module: llvm.ModuleRef | None = None, object_code: bytes | None = None):
        _init()
        libgomp()
        with _lock:
            # an engine owns (and frees) its target machine: give it its own
            self._engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""),
                                                      _new_target_machine())
            if module is not None:
                self._engine.add_module(module)
                self._module = module
            if object_code is not None:
                self._engine.add_object_file(llvm.ObjectFileRef.from_data(object_code))
            self._engine.finalize_object()
            self._engine.run_static_constructors()

    def address(self, name: str) -> int:
        addr = self._engine.get_function_address(name)
        if not addr:
            raise RuntimeError(f"compiled code has no function {name!r}")
        return addr


def emit_object(module: llvm.ModuleRef) -> bytes:
    """Machine code for the host, to cache on disk and load with JitModule(object_code=...)."""
    return target_machine().emit_object(module)
