"""CPUs as LLVM targets: the target machine, compiling a module to object code.

Render (an llvmlite.ir.Module) and compile (optimize at -O3 with the new pass
manager for a compiler/target.py Target: the host's CPU name and features by
default, or another CPU's) happen here; loading (an MCJIT engine on this machine,
kept alive as long as any function pointer from it is used) is runtime/cpu.py's
JitModule, so compiled object code can also be cached, reloaded, or written for a
CPU that is not this one.

Threads: kernels share their outer loops through `braze_parallel`
(compiler/codegen/parallel.py; runtime/pool.py installs braze's own pool) and, for a
split recurrence's team, GNU OpenMP's `GOMP_parallel` (libgomp, loaded once). Where
libgomp is missing, those kernels run on one thread.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import struct
import warnings
from typing import Callable

import llvmlite.binding as llvm

from compiler import target as targets
from compiler.target import Target

log = logging.getLogger("braze")


@functools.cache
def init() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    targets.init()


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
def target_machine(target: Target | None = None) -> llvm.TargetMachine:
    """The shared target machine of `target` (default: the host) for optimizing and
    emitting (never given to an engine)."""
    init()
    return targets.target_machine(target or targets.host())


def optimize(module_text: str, target: Target | None = None,
             link: tuple[str, ...] = ()) -> llvm.ModuleRef:
    """Parse and optimize LLVM IR for `target` (default: the host) at -O3 (loop and SLP
    vectorizers on: they widen to the target's vectors), with the modules `link` (IR
    texts) linked in first."""
    init()
    tm = target_machine(target)
    mod = _parsed(module_text, tm)
    for text in link:
        mod.link_in(_parsed(text, tm))
    mod.verify()
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_unrolling = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return mod


def _parsed(module_text: str, tm: llvm.TargetMachine) -> llvm.ModuleRef:
    mod = llvm.parse_assembly(module_text)
    mod.triple = tm.triple
    mod.data_layout = str(tm.target_data)
    return mod


def emit_object(module: llvm.ModuleRef, target: Target | None = None) -> bytes:
    """Machine code for `target` (default: the host), to cache on disk and load with
    runtime.cpu.JitModule where the target runs."""
    return target_machine(target).emit_object(module)


def emit_assembly(module_text: str, target: Target | None = None, verbose: bool = True) -> str:
    """Optimized assembly text of LLVM IR for `target` (verbose: with LLVM's comments
    marking loops, spills and reloads)."""
    mod = optimize(module_text, target)
    tm = targets.target_machine(target or targets.host())
    tm.set_asm_verbosity(verbose)
    return tm.emit_assembly(mod)


# Several object files as one blob (what the compile cache and artifacts store): MAGIC,
# the count and each length (little-endian u32, u64s), then the files. A single
# object file is stored as itself.
MAGIC = b"braze-objects\0"


def join_objects(objects: list[bytes]) -> bytes:
    if len(objects) == 1:
        return objects[0]
    head = MAGIC + struct.pack(f"<I{len(objects)}Q", len(objects), *map(len, objects))
    return head + b"".join(objects)


def split_objects(blob: bytes) -> list[bytes]:
    if not blob.startswith(MAGIC):
        return [blob]
    at = len(MAGIC)
    (count,) = struct.unpack_from("<I", blob, at)
    sizes = struct.unpack_from(f"<{count}Q", blob, at + 4)
    at += 4 + 8 * count
    out = []
    for size in sizes:
        out.append(blob[at:at + size])
        at += size
    if at != len(blob):
        raise ValueError("truncated braze object blob")
    return out


def compile_ir(module_text: str, target: Target | None = None) -> bytes:
    """Object code of one LLVM IR module, optimized for `target` (default: the host)."""
    return emit_object(optimize(module_text, target), target)


def compile_parts(render: Callable[[int], str], parts: int,
                  target: Target | None = None) -> bytes:
    """Object code of `parts` modules, `render(p)` -> IR text of part p, as one blob.

    LLVM calls through llvmlite hold one process-wide lock, so parts cannot compile on
    threads: parts 1.. are rendered and compiled in forked children (where the OS has
    fork), which send their object code back through a pipe, while this process does
    part 0. A child that fails leaves its part to this process, which then compiles it
    itself (and raises any error there, as a serial compile would)."""
    if parts == 1 or not hasattr(os, "fork") or llvmlite_lock() is None:
        return join_objects([compile_ir(render(p), target) for p in range(parts)])
    children = [_fork_part(render, p, target) for p in range(1, parts)]
    objects = [compile_ir(render(0), target)]
    for p, child in enumerate(children, start=1):
        obj = _collect(child)
        if obj is None:
            log.debug("braze: compile worker for part %d failed; compiling it here", p)
            obj = compile_ir(render(p), target)
        objects.append(obj)
    return join_objects(objects)


def llvmlite_lock():
    """llvmlite's process-wide lock (every call into LLVM takes it), or None where this
    llvmlite has no lock braze can take; then compile_parts compiles its parts here, one
    after another, instead of in forked children.

    The one use of llvmlite's private API in braze, kept here: `llvm.ffi.lib._lock`.
    llvmlite offers no public way to take its lock (`ffi.register_lock_callback` only
    observes it), and a fork while another thread holds it leaves the child waiting for
    it forever. tests/compiler/test_codegen.py checks that this is the lock llvmlite's
    calls take (through that public callback) and that without it nothing forks."""
    lock = getattr(getattr(llvm.ffi, "lib", None), "_lock", None)
    return lock if hasattr(lock, "__enter__") and hasattr(lock, "__exit__") else None


def _fork_part(render, part: int, target: Target | None):
    """(pid, read end) of a child compiling `part`, or None when fork fails."""
    init()
    read, write = os.pipe()
    # no other thread may hold llvmlite's lock across the fork (the child would wait
    # for it forever): take it here, and the child (this thread's copy) releases it
    try:
        with llvmlite_lock(), warnings.catch_warnings():
            # Python 3.12+ warns about fork in a threaded process; the child runs only
            # LLVM (whose lock is held here) and this module's code, then _exit
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except OSError:
        os.close(read)
        os.close(write)
        return None
    if pid == 0:  # the child: compile, write, and leave without running any cleanup
        status = 1
        try:
            os.close(read)
            obj = compile_ir(render(part), target)
            with os.fdopen(write, "wb") as out:
                out.write(struct.pack("<Q", len(obj)) + obj)
            status = 0
        finally:
            os._exit(status)
    os.close(write)
    return pid, read


def _collect(child) -> bytes | None:
    """The child's object code, or None if it failed (its exit is reaped either way)."""
    if child is None:
        return None
    pid, read = child
    with os.fdopen(read, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if status != 0 or len(data) < 8:
        return None
    (size,) = struct.unpack_from("<Q", data)
    return data[8:] if len(data) == 8 + size else None
