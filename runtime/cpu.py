"""Running braze's CPU programs: loading object code, pointer tables, the ctypes call.

`CpuStep(program, threads)` loads a compiled cluster (compiler.codegen.compiled.CpuProgram:
object code and its memory plan) into an MCJIT engine and runs it as an Executable step:
`run(list of arrays) -> list of fresh arrays`, one ctypes call with a pointer table (the
cluster inputs, fresh outputs, constants, and the intermediates, which live in one arena
laid out by compiler/codegen/memory.py). runtime/cuda.py's CudaStep is its GPU sibling.

Thread safety: each calling Python thread gets its own arena, pointer table and output
pools (threading.local), so concurrent `run` calls share nothing mutable; ctypes releases
the GIL during the native call.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time

import llvmlite.binding as llvm
import numpy as np

from compiler import dtypes
from compiler import target as targets
from compiler.codegen import faults, llvm_cpu
from compiler.codegen.memory import ALIGN
from compiler.errors import CompileError, InputError
from runtime import pool

_RUN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int32)
_RUN_PROFILED = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p)
_lock = threading.Lock()  # engines are created one at a time


class JitModule:
    """Loaded code (a parsed module or object code): function addresses stay valid while
    this object lives."""

    def __init__(self, module: llvm.ModuleRef | None = None, object_code: bytes | None = None,
                 own_symbols: bool = False):
        """`own_symbols`: the code calls nothing braze defines (runtime/pool.py's own code,
        loaded before `braze_parallel` exists)."""
        llvm_cpu.init()
        llvm_cpu.libgomp()
        if not own_symbols:
            pool.install()  # compiled code calls braze_parallel
        with _lock:
            # an engine owns (and frees) its target machine: give it its own
            self._engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""),
                                                      targets.target_machine(targets.host()))
            if module is not None:
                self._engine.add_module(module)
                self._module = module
            for obj in llvm_cpu.split_objects(object_code) if object_code is not None else ():
                self._engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
            self._engine.finalize_object()
            self._engine.run_static_constructors()

    def address(self, name: str) -> int:
        addr = self._engine.get_function_address(name)
        if not addr:
            raise RuntimeError(f"compiled code has no function {name!r}")
        return addr


class CpuStep:
    """A compiled cluster on the host CPU: `run(list of arrays) -> list of fresh arrays`
    (thread-safe), also callable as an Executable step.

    Introspection (the program's): `kernels` (fuse.Kernel: root value, the nodes it
    computes, its implementation), `plan`, `llvm_ir`, `object_code`, `slots`,
    `arena_bytes` (intermediate memory per calling thread), `target`.

    Code for a CPU this machine cannot run (another architecture, missing features) is
    not loaded: `missing` names what this machine lacks, and `run` refuses.
    """

    def __init__(self, program, threads: int = 2):
        self.program = program
        self.set_threads(threads)
        memory = program.memory
        self._inputs, self._outputs = memory.inputs, memory.outputs
        self._in_dtypes = [dtypes.to_numpy(v.dtype) for v in self._inputs]
        self._in_shapes = [v.shape for v in self._inputs]
        self._out_specs = [(v.shape, dtypes.to_numpy(v.dtype)) for v in self._outputs]
        self._local = threading.local()
        self._fault = memory.fault_slot  # None: no node of this cluster can fault
        self.missing = program.target.missing_here()  # what this machine lacks to run it
        if self.missing:
            self._jit = self._fn = None
            return
        self._jit = JitModule(object_code=program.object_code)  # keeps the code alive
        self._fn = _RUN(self._jit.address("run"))

    graph = property(lambda self: self.program.graph)
    plan = property(lambda self: self.program.plan)
    kernels = property(lambda self: self.program.kernels)
    slots = property(lambda self: self.program.slots)
    arena_bytes = property(lambda self: self.program.arena_bytes)
    object_code = property(lambda self: self.program.object_code)
    llvm_ir = property(lambda self: self.program.llvm_ir)
    target = property(lambda self: self.program.target)
    tile = property(lambda self: self.program.tile)

    def set_threads(self, threads: int) -> None:
        """Threads for big kernels (small ones run on the calling thread)."""
        if not isinstance(threads, int) or threads < 1:
            raise CompileError(f"threads must be a positive integer, got {threads!r}")
        self.threads = threads
        pool.ensure_workers(threads)

    def __call__(self, arrays: list) -> list[np.ndarray]:
        return self.run(arrays)

    def run(self, arrays: list) -> list[np.ndarray]:
        if self._fn is None:
            self._refuse_to_run()
        state = self._local.__dict__.get("state") or self._thread_state()
        t, pools, address = state
        if len(arrays) != len(self._inputs):
            raise InputError(f"compiled cluster takes {len(self._inputs)} inputs, "
                             f"got {len(arrays)}")
        keep = list(arrays)
        for i, (a, dt, shape) in enumerate(zip(keep, self._in_dtypes, self._in_shapes)):
            # the common case (a C-contiguous array of the right dtype) costs no copy
            if a.__class__ is not np.ndarray or a.dtype != dt or not a.flags.c_contiguous:
                a = keep[i] = np.asarray(a, dtype=dt, order="C")
            if a.shape != shape:
                raise InputError(f"input %{self._inputs[i].name} must have shape {shape}, "
                                 f"got {a.shape}")
            t[i] = _address(a)
        return self._call(state, keep)

    def run_at(self, addresses: list, keep: list) -> list[np.ndarray]:
        """`run` on inputs given by their data addresses, each a dense C-order block of
        that input's shape and dtype (the caller's check: bridge/torch_backend.py's
        tensors, read in place), alive in `keep` (the same objects, in input order)."""
        if self._fn is None:
            self._refuse_to_run()
        state = self._local.__dict__.get("state") or self._thread_state()
        t = state[0]
        for i, a in enumerate(addresses):
            t[i] = a
        return self._call(state, keep)

    def _call(self, state: tuple, keep: list) -> list[np.ndarray]:
        """Fresh outputs into the table, the compiled code's call, faults, the results."""
        t, pools, address = state
        outs = [pool.take() for pool in pools]
        base = len(self._inputs)
        for i, o in enumerate(outs):
            t[base + i] = _address(o)
        self._fn(address, self.threads)
        if self._fault is not None:
            self._raise_faults()
        if len(outs) == len(self.graph.outputs):
            return outs  # the common case: every output computed, each once
        return self._results(outs, keep)

    @property
    def input_specs(self) -> list[tuple]:
        """(shape, numpy dtype) of each input, in order."""
        return list(zip(self._in_shapes, self._in_dtypes))

    @property
    def computes_outputs(self) -> bool:
        """Whether every result is an output buffer of the code (none an input, a
        constant or a repeat, which `run` copies from its arguments)."""
        return len(self._outputs) == len(self.graph.outputs)

    def profile(self, arrays: list, rounds: int = 10) -> list[float]:
        """Seconds per kernel (in `kernels` order): the median over `rounds` calls of a
        copy of this code that reads the CPU's cycle counter between kernels (compiled
        on first use, never cached), scaled to wall-clock time over each whole call."""
        if self._fn is None:
            self._refuse_to_run()
        prof = getattr(self, "_profiled", None)
        if prof is None:
            jit = JitModule(object_code=self.program.profiling_code())
            prof = self._profiled = (jit, _RUN_PROFILED(jit.address("run_profiled")))
        fn = prof[1]
        stamps = np.zeros(len(self.kernels) + 1, np.int64)
        run, self._fn = self._fn, lambda address, threads: fn(address, threads,
                                                               _address(stamps))
        samples = []
        try:
            for _ in range(rounds):
                start = time.perf_counter()
                self.run(arrays)
                wall = time.perf_counter() - start
                ticks = np.diff(stamps).astype(np.float64)
                samples.append(ticks * (wall / max(stamps[-1] - stamps[0], 1)))
        finally:
            self._fn = run
        return list(np.median(np.array(samples), axis=0))

    def _raise_faults(self) -> None:
        """Raise what this thread's fault word records (cleared for the next call):
        compiler/codegen/faults.py's run-time faults (index out of range, division by 0)."""
        word = int(self._local.fault[0])
        if word:
            self._local.fault[0] = 0
            faults.check(word, self.graph)

    def _refuse_to_run(self) -> None:
        raise CompileError(f"this code is for {self.target.describe()}; this machine lacks "
                           f"{', '.join(self.missing)}: it can be saved or inspected "
                           "(object_code, llvm_ir), not run here")

    def _thread_state(self) -> tuple:
        """(pointer table, output pools, table address) of the calling thread; its arena
        and the table (constants and arena slots filled once) are allocated here."""
        memory = self.program.memory
        arena = np.empty(memory.arena_bytes + ALIGN, np.uint8)
        base = arena.ctypes.data + (-arena.ctypes.data) % ALIGN
        t = (ctypes.c_void_p * max(len(memory.slots), 1))()
        for slot, a in memory.constants:
            t[slot] = a.ctypes.data
        for slot, offset in memory.offsets.items():
            t[slot] = base + offset
        self._local.fault = np.zeros(1, np.int32)
        if memory.fault_slot is not None:
            t[memory.fault_slot] = self._local.fault.ctypes.data
        self._local.arena = arena
        pools = [OutputPool(shape, dt) for shape, dt in self._out_specs]
        self._local.state = (t, pools, ctypes.addressof(t))
        return self._local.state

    def _results(self, outs: list, inputs: list) -> list[np.ndarray]:
        """Outputs in graph order; repeats, inputs and constants as fresh copies."""
        by_value = dict(zip(self._outputs, outs))
        by_input = dict(zip(self._inputs, inputs))
        results, seen = [], set()
        for v in self.graph.outputs:
            if v in by_value:
                results.append(by_value[v] if v not in seen else by_value[v].copy())
                seen.add(v)
            elif v in by_input:
                results.append(np.array(by_input[v], copy=True))
            else:  # a constant output
                results.append(np.array(v.const_value, copy=True))
        return results


class OutputPool:
    """Recycles output buffers the caller has let go of.

    Every result is a fresh array object (a view of a pooled block), so it never
    aliases the arena or another result the caller still holds. A block is reused
    only when nothing but the pool refers to it: no view of it, nor any view of a
    view (numpy points every view's `base` at the block that owns the memory), is
    alive anywhere, which its reference count says. The count a free block has while
    `take` looks at it depends on the interpreter (3.14 borrows references that 3.12
    counted), so it is measured once per process (`_free_refs`) by the same loop, not
    assumed; where the measure is not sound, blocks are never reused. Reuse matters
    because a fresh multi-megabyte allocation costs page faults on every call
    (measured here: ~1.4 ms per 4 MB, ten times the kernel's own time). One pool per
    output per calling thread, so two threads never hand out the same block.
    """

    KEEP = 4  # blocks kept per output; beyond that, results are plain allocations

    def __init__(self, shape: tuple, dtype):
        self.shape, self.dtype = shape, dtype
        self.blocks: list[np.ndarray] = []

    def take(self) -> np.ndarray:
        free = _FREE_REFS
        for block in self.blocks:
            if sys.getrefcount(block) <= free:
                return block.view()
        block = np.empty(self.shape, self.dtype)
        if len(self.blocks) < self.KEEP:
            self.blocks.append(block)
            return block.view()
        return block

    def _first_refs(self) -> int:
        """The reference count `take`'s loop sees for the first block (its twin loop)."""
        free = 0
        for block in self.blocks:
            return sys.getrefcount(block) + free
        return -1


def _free_refs() -> int:
    """The count `take` sees for a block only the pool holds; -1 (never reuse) unless one
    more reference is seen as one more (the measure distinguishes free from held)."""
    pool = OutputPool((1,), np.uint8)
    pool.blocks.append(np.empty(1, np.uint8))
    free = pool._first_refs()
    held = pool.blocks[0].view()
    busy = pool._first_refs()
    del held
    return free if busy == free + 1 else -1


_FREE_REFS = _free_refs()


def _interface_address(a: np.ndarray) -> int:
    """The data pointer, through the array interface (several times cheaper than `.ctypes`)."""
    return a.__array_interface__["data"][0]


def _struct_address_reader():
    """A reader of an ndarray's data pointer straight from its C struct (numpy's
    PyArrayObject: the object header, then `char *data`), about 5x cheaper than the
    array interface; None unless it agrees with the interface on this build."""
    offset, read = object.__basicsize__, ctypes.c_void_p.from_address
    probe = np.arange(3, dtype=np.float32)[1:]
    try:
        if read(id(probe) + offset).value != _interface_address(probe):
            return None
    except (ValueError, OSError):
        return None
    return lambda a: read(id(a) + offset).value


_read_address = _struct_address_reader()
_address = _interface_address if _read_address is None else _read_address
