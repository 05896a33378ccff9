"""CompiledGraph: a cluster's native code plus its memory plan, callable with numpy arrays.

Render (cpu.Renderer: fusion plan -> LLVM IR text), compile (llvm_cpu.optimize
-> object code, cacheable by key through any `cache` with get/put) and load
(llvm_cpu.JitModule) are separate steps. Running is one ctypes call with a
pointer table: the cluster inputs, fresh outputs, constants, and the
intermediates, which live in one arena laid out once (liveness-based reuse).

Thread safety: each calling Python thread gets its own arena and pointer
table (threading.local), so concurrent `run` calls share nothing mutable;
ctypes releases the GIL during the native call.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

from compiler import __version__, dtypes
from compiler import target as targets
from compiler.codegen import faults, llvm_cpu
from compiler.codegen.cpu import PACKED, Renderer, SplitRender
from compiler.errors import CompileError, InputError
from compiler.ir import Graph, Value
from compiler.kernels import conv, gemm, grouped, winograd
from compiler.passes.fuse import FusionPlan, plan
from compiler.text import print_graph

ALIGN = 64  # arena buffers start on cache lines
# A cluster with at least this many distinct kernels compiles as parallel parts (one per
# core, at most PARALLEL_PARTS): ResNet-50's 28 distinct kernels took 3.7 s as one module.
PARALLEL_MIN_GROUPS = 8
PARALLEL_PARTS = 2
_RUN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int32)


def _padded_bytes(v: Value) -> int:
    return -(-max(v.type.size * dtypes.itemsize(v.dtype), 1) // ALIGN) * ALIGN


def arena_plan(kplan: FusionPlan, intermediates: list[Value]) -> tuple[dict[Value, int], int]:
    """Byte offsets of intermediates in one arena, and its size.

    Kernels run in order; a buffer is live from the kernel that writes it to
    the last kernel that reads it, and its bytes are reused (first fit) by
    buffers written after that. A kernel never gets a block freed by its own
    readers, so its inputs and output never overlap.
    """
    last: dict[Value, int] = {}
    for i, k in enumerate(kplan.kernels):
        for n in k.nodes:
            for u in n.inputs:
                last[u] = i
    wanted = set(intermediates)
    free: list[tuple[int, int]] = []  # (offset, size), sorted by offset
    offsets: dict[Value, int] = {}
    live: list[Value] = []
    top = 0
    for i, k in enumerate(kplan.kernels):
        v = k.root
        if v in wanted:
            size = _padded_bytes(v)
            fit = next((blk for blk in free if blk[1] >= size), None)
            if fit is None:
                offsets[v], top = top, top + size
            else:
                free.remove(fit)
                offsets[v] = fit[0]
                if fit[1] > size:
                    free.append((fit[0] + size, fit[1] - size))
                    free.sort()
            live.append(v)
        for u in [u for u in live if last.get(u, -1) <= i and u is not v]:
            live.remove(u)
            free.append((offsets[u], _padded_bytes(u)))
            free.sort()
    return offsets, top


class CompiledGraph:
    """A compiled cluster: `run(list of arrays) -> list of fresh arrays` (thread-safe).

    Introspection: `kernels` (fuse.Kernel: root value and the nodes it
    computes), `plan` (the FusionPlan, with reasons), `llvm_ir` (text of the
    rendered module; None when built from saved object code), `object_code` (machine
    code for `target`, cacheable), `arena_bytes` (intermediate memory per calling thread).

    `target` (compiler/target.py: a Target or its spec, default the host) is the CPU the
    code is for; code for a CPU this machine cannot run (another architecture, missing
    features) is compiled but not loaded: `object_code` and `llvm_ir` are there, `run`
    refuses.
    """

    def __init__(self, graph: Graph, threads: int = 2, cache=None,
                 object_code: bytes | None = None, target=targets.HOST):
        self.graph = graph
        self.target = targets.parse(target)
        self.tile = gemm.Tile.of(self.target)
        self.set_threads(threads)
        self.plan = plan(graph)
        self.kernels = self.plan.kernels
        self._inputs = list(graph.inputs)
        self._outputs = list(dict.fromkeys(v for v in graph.outputs
                                           if v in self.plan.materialized))
        packed = packed_operands(self.kernels, self.tile)
        unpacked = read_unpacked(graph, self.tile)
        consts = [n.outputs[0] for n in graph.nodes if n.op == "const"
                  and n.attrs["value"].size != 1 and n.outputs[0] in unpacked]
        self._inter = [k.root for k in self.kernels if k.root not in self._outputs]
        # the fault word's slot comes last (compiler/codegen/faults.py); none if nothing faults
        self._fault_sites = faults.sites(graph)
        order = self._inputs + self._outputs + consts + list(packed) + self._inter + (
            [faults.FAULTS] if self._fault_sites else [])
        self.slots = {v: i for i, v in enumerate(order)}
        self._const_arrays = [np.ascontiguousarray(v.producer.attrs["value"]) for v in consts]
        self._const_arrays += list(packed.values())
        self._offsets, self.arena_bytes = arena_plan(self.plan, self._inter)
        self._in_dtypes = [dtypes.to_numpy(v.dtype) for v in self._inputs]
        self._in_shapes = [v.shape for v in self._inputs]
        self._out_specs = [(v.shape, dtypes.to_numpy(v.dtype)) for v in self._outputs]
        self._llvm_ir: str | None = None
        if object_code is None:
            object_code = self._compile(cache)
        # else saved code (an artifact): the plans above are recomputed, LLVM is not run
        self.object_code = object_code
        self._local = threading.local()
        self.missing = self.target.missing_here()  # what this machine lacks to run it
        if self.missing:
            self._jit = self._fn = None
            return
        self._jit = llvm_cpu.JitModule(object_code=self.object_code)  # keeps code alive
        self._fn = _RUN(self._jit.address("run"))

    @property
    def llvm_ir(self) -> str:
        """The rendered LLVM module (rendered on demand when the code came from a cache)."""
        if self._llvm_ir is None:
            self._llvm_ir = Renderer(self.graph, self.plan, self.slots, self.target).render()
        return self._llvm_ir

    def _compile(self, cache) -> bytes:
        """Object code: from `cache` (get/put by key) when it has this graph's, else
        rendered and compiled. The key is the graph's text, not the LLVM IR's: a hit
        costs no rendering (kernels read constants through pointers, so the code does
        not depend on large constants' values, which the text names but does not hold)."""
        key = cache_key(self.graph, self.target) if cache is not None else None
        obj = cache.get(key) if key is not None else None
        if obj is None:
            obj = self._render_and_compile(key)
            if key is not None:
                cache.put(key, obj)
        return obj

    def _render_and_compile(self, key: str | None) -> bytes:
        """Render and compile: in PARALLEL_PARTS modules at once when the cluster has
        enough distinct kernels (cpu.SplitRender, llvm_cpu.compile_parts), else one."""
        parts = parallel_parts()
        if parts > 1:
            tag = f"braze.{(key or hashlib.sha256(print_graph(self.graph).encode()).hexdigest())[:16]}"
            split = SplitRender(self.graph, self.plan, self.slots, self.target, tag, parts)
            if split.groups >= PARALLEL_MIN_GROUPS:
                try:
                    return llvm_cpu.compile_parts(split.render, parts, self.target)
                except RuntimeError as e:
                    raise CompileError(f"LLVM rejected braze's IR: {e}") from None
        return _compile_uncached(self.llvm_ir, self.target)

    @classmethod
    def from_object_code(cls, graph: Graph, object_code: bytes, threads: int = 2,
                         target=targets.HOST):
        """The CompiledGraph whose code `object_code` is (saved from one built for this
        same graph and target by this same braze), loaded without rendering or compiling."""
        return cls(graph, threads=threads, object_code=object_code, target=target)

    def _refuse_to_run(self) -> None:
        raise CompileError(f"this code is for {self.target.describe()}; this machine lacks "
                           f"{', '.join(self.missing)}: it can be saved or inspected "
                           "(object_code, llvm_ir), not run here")

    def set_threads(self, threads: int) -> None:
        """Threads for big kernels (small ones run on the calling thread)."""
        if not isinstance(threads, int) or threads < 1:
            raise CompileError(f"threads must be a positive integer, got {threads!r}")
        self.threads = threads

    def _table(self):
        """This thread's pointer table (constants and arena slots filled once)."""
        t = getattr(self._local, "table", None)
        if t is None:
            arena = np.empty(self.arena_bytes + ALIGN, np.uint8)
            base = arena.ctypes.data + (-arena.ctypes.data) % ALIGN
            t = (ctypes.c_void_p * max(len(self.slots), 1))()
            for v, a in zip(list(self.slots)[len(self._inputs) + len(self._outputs):],
                            self._const_arrays):
                t[self.slots[v]] = a.ctypes.data
            for v in self._inter:
                t[self.slots[v]] = base + self._offsets[v]
            self._local.fault = np.zeros(1, np.int32)
            if self._fault_sites:
                t[self.slots[faults.FAULTS]] = self._local.fault.ctypes.data
            self._local.table, self._local.arena = t, arena
            self._local.address = ctypes.addressof(t)
        return t

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
        outs = [pool.take() for pool in pools]
        base = len(self._inputs)
        for i, o in enumerate(outs):
            t[base + i] = _address(o)
        self._fn(address, self.threads)
        if self._fault_sites:
            self._raise_faults()
        if len(outs) == len(self.graph.outputs):
            return outs  # the common case: every output computed, each once
        return self._results(outs, keep)

    def _raise_faults(self) -> None:
        """Raise what the call's fault word records (and clear it for the next call)."""
        word = int(self._local.fault[0])
        if word:
            self._local.fault[0] = 0
            faults.check(word, self.graph)

    def profile(self, arrays: list, rounds: int = 10) -> list[float]:
        """Seconds per kernel (in `kernels` order): the median over `rounds` calls of a
        copy of this code that reads the CPU's cycle counter between kernels (compiled
        on first use, never cached), scaled to wall-clock time over each whole call."""
        if self._fn is None:
            self._refuse_to_run()
        prof = getattr(self, "_profiled", None)
        if prof is None:
            text = Renderer(self.graph, self.plan, self.slots, self.target,
                            profile=True).render()
            jit = llvm_cpu.JitModule(object_code=_compile_uncached(text, self.target))
            fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int32,
                                  ctypes.c_void_p)(jit.address("run_profiled"))
            prof = self._profiled = (jit, fn)
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

    def _thread_state(self) -> tuple:
        """(pointer table, output pools, table address) of the calling thread."""
        t = self._table()
        pools = [OutputPool(shape, dt) for shape, dt in self._out_specs]
        self._local.state = (t, pools, self._local.address)
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
                results.append(np.array(v.producer.attrs["value"], copy=True))
        return results


class OutputPool:
    """Recycles output buffers the caller has let go of.

    Every result is a fresh array object (a view of a pooled block), so it never
    aliases the arena or another result the caller still holds. A block is reused
    only when nothing but the pool refers to it: no view of it, nor any view of a
    view, is alive anywhere (its reference count says so). Reuse matters because a
    fresh multi-megabyte allocation costs page faults on every call (measured here:
    ~1.4 ms per 4 MB, ten times the kernel's own time). One pool per output per
    calling thread, so two threads never hand out the same block.
    """

    KEEP = 4  # blocks kept per output; beyond that, results are plain allocations
    # references to a free block while `take` looks at it: the pool's list, the loop
    # variable and getrefcount's own argument
    _FREE_REFS = 3

    def __init__(self, shape: tuple, dtype):
        self.shape, self.dtype = shape, dtype
        self.blocks: list[np.ndarray] = []

    def take(self) -> np.ndarray:
        for block in self.blocks:
            if sys.getrefcount(block) <= self._FREE_REFS:
                return block.view()
        block = np.empty(self.shape, self.dtype)
        if len(self.blocks) < self.KEEP:
            self.blocks.append(block)
            return block.view()
        return block


def packers(node, tile: gemm.Tile) -> dict:
    """Input position -> how that constant input is packed for braze's kernel of `node`
    with the target's register `tile` (empty when the node runs on a kernel reading its
    inputs as they are)."""
    bias = functools.partial(conv.pack_bias, tile=tile)
    if node.op == "matmul" and gemm.refusal(node) is None:
        return {1: functools.partial(gemm.pack_b, tile=tile)}
    if node.op == "conv" and grouped.refusal(node) is None:
        width = grouped.plan(node, tile.vec).width
        return {1: lambda w: grouped.pack_weight(w, width),
                2: lambda b: grouped.pack_bias(b, width)}
    if node.op == "conv" and winograd.refusal(node, tile) is None:
        m = winograd.plan(node, tile).m
        return {1: lambda w: winograd.pack_weight(w, m, tile), 2: bias}
    if node.op == "conv" and conv.refusal(node) is None:
        return {1: functools.partial(conv.pack_weight, tile=tile), 2: bias}
    return {}


def packed_operands(kernels, tile: gemm.Tile) -> dict:
    """(PACKED, constant) -> its packed array, for the kernels that read packed operands
    (packing happens here, once, at compile time)."""
    out = {}
    for k in kernels:
        node = k.contraction
        if node is None:
            continue
        for i, pack in packers(node, tile).items():
            if i < len(node.inputs):
                v = node.inputs[i]
                out.setdefault((PACKED, v), pack(np.asarray(v.producer.attrs["value"])))
    return out


def read_unpacked(graph: Graph, tile: gemm.Tile) -> set[Value]:
    """The values some node reads other than as a packed operand, and the graph outputs
    (one pass: each node's packers are asked once)."""
    out = set(graph.outputs)
    for n in graph.nodes:
        packed = packers(n, tile)
        out.update(u for i, u in enumerate(n.inputs) if i not in packed)
    return out


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


def cache_key(graph: Graph, target: targets.Target) -> str:
    """The compile cache's key for a cluster: its IR text, the target CPU (triple, name,
    features), braze's version and a fingerprint of the compiler's own source (a changed
    codegen never reuses code)."""
    text = print_graph(graph)
    parts = [text, *target.key(), __version__, compiler_fingerprint()]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


@functools.cache
def compiler_fingerprint() -> str:
    """A hash of every source file of the compiler package (read once per process)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def parallel_parts() -> int:
    """Modules to compile at once: one per core up to PARALLEL_PARTS
    (BRAZE_COMPILE_JOBS=1 turns it off)."""
    env = os.environ.get("BRAZE_COMPILE_JOBS")
    if env is not None:
        try:
            return max(1, int(env))
        except ValueError:
            raise CompileError(f"BRAZE_COMPILE_JOBS must be an integer, got {env!r}") from None
    return max(1, min(PARALLEL_PARTS, len(os.sched_getaffinity(0))
                      if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def _compile_uncached(llvm_ir: str, target: targets.Target) -> bytes:
    try:
        return llvm_cpu.compile_ir(llvm_ir, target)
    except RuntimeError as e:
        raise CompileError(f"LLVM rejected braze's IR: {e}") from None
