"""The CPU program of a cluster: its native code plus its memory plan, as data.

Render (cpu.Renderer: fusion plan -> LLVM IR text), compile (llvm_cpu.optimize ->
object code, cacheable by key through any `cache` with get/put) happen here;
`compile_cpu` returns a CpuProgram, which runtime/cpu.py loads and runs (as
runtime/cuda.py runs a CudaProgram). The memory plan (slots, constants, arena) is
compiler/codegen/memory.py's, shared with the CUDA target.
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from compiler import __version__
from compiler import target as targets
from compiler.codegen import faults, llvm_cpu
from compiler.codegen.cpu import PACKED, Renderer, SplitRender
from compiler.codegen.memory import MemoryPlan, plan_memory
from compiler.errors import CompileError
from compiler.ir import Graph, Value
from compiler.kernels import choice, conv, gemm, grouped, recurrent, winograd
from compiler.passes.fuse import FusionPlan, plan
from compiler.text import print_graph

# A cluster with at least this many distinct kernels compiles as parallel parts (one per
# core, at most PARALLEL_PARTS): ResNet-50's 28 distinct kernels took 3.7 s as one module.
PARALLEL_MIN_GROUPS = 8
PARALLEL_PARTS = 2


@dataclass
class CpuProgram:
    """A cluster compiled for the host CPU (runtime/cpu.py: CpuStep loads and runs it).

    `object_code`: machine code for `target` (compiler/target.py; cacheable; one ELF object
    or several joined by llvm_cpu.join_objects) whose entry is `run(ptr table, i32
    threads)`; `memory`: the slots of that table and the arena (memory.MemoryPlan);
    `plan`: the FusionPlan (its kernels, with each one's implementation and reasons).
    Code for a CPU this machine cannot run compiles; runtime/cpu.py refuses to run it."""

    graph: Graph
    plan: FusionPlan
    memory: MemoryPlan
    object_code: bytes
    target: targets.Target
    _llvm_ir: str | None = None

    @property
    def kernels(self) -> list:
        return self.plan.kernels

    @property
    def tile(self) -> gemm.Tile:
        """The target's register tile (compiler/kernels/gemm.py) the kernels were built on."""
        return gemm.Tile.of(self.target)

    @property
    def slots(self) -> dict:
        return self.memory.slots

    @property
    def arena_bytes(self) -> int:
        return self.memory.arena_bytes

    @property
    def llvm_ir(self) -> str:
        """The rendered LLVM module (rendered on demand when the code came from a cache)."""
        if self._llvm_ir is None:
            self._llvm_ir = Renderer(self.graph, self.plan, self.slots, self.target).render()
        return self._llvm_ir

    def profiling_code(self) -> bytes:
        """Object code of a copy of this program whose entry `run_profiled(table, threads,
        stamps)` also writes the CPU's cycle counter before the first kernel and after
        each (stamps: i64[kernels + 1]); compiled on each call, never cached."""
        text = Renderer(self.graph, self.plan, self.slots, self.target, profile=True).render()
        return _compile_uncached(text, self.target)

    @classmethod
    def from_object_code(cls, graph: Graph, object_code: bytes,
                         target=targets.HOST) -> CpuProgram:
        """The program whose code `object_code` is (saved from one compiled for this same
        graph and target by this same braze): the plans are recomputed, LLVM is not run."""
        target = targets.parse(target)
        kplan, memory = _plans(graph, target)
        return cls(graph, kplan, memory, object_code, target)


def compile_cpu(graph: Graph, cache=None, target=targets.HOST) -> CpuProgram:
    """Plan, render and compile a cluster for a CPU (`target`: a compiler/target.py Target
    or spec, default this machine), object code from `cache` (any object with
    get(key)/put(key, bytes)) when it has this graph's."""
    target = targets.parse(target)
    kplan, memory = _plans(graph, target)
    program = CpuProgram(graph, kplan, memory, b"", target)
    program.object_code = _compile(program, cache)
    return program


def _plans(graph: Graph, target: targets.Target) -> tuple[FusionPlan, MemoryPlan]:
    """The fusion plan and memory plan of a cluster (constants it reads unpacked, then
    the packed ones, get slots; packing happens here, once)."""
    kplan = plan(graph, target)
    packed = packed_operands(kplan.kernels)
    unpacked = read_unpacked(graph, kplan.kernels)
    consts = [(n.outputs[0], np.ascontiguousarray(n.attrs["value"])) for n in graph.nodes
              if n.op == "const" and n.attrs["value"].size != 1 and n.outputs[0] in unpacked]
    fault_key = faults.FAULTS if faults.sites(graph) else None
    return kplan, plan_memory(graph, kplan, consts + list(packed.items()), fault_key)


def _compile(program: CpuProgram, cache) -> bytes:
    """Object code: from `cache` (get/put by key) when it has this graph's, else rendered
    and compiled. The key is the graph's text, not the LLVM IR's: a hit costs no rendering
    (kernels read constants through pointers, so the code does not depend on large
    constants' values, which the text names but does not hold)."""
    key = cache_key(program.graph, program.target) if cache is not None else None
    obj = cache.get(key) if key is not None else None
    if obj is None:
        obj = _render_and_compile(program, key)
        if key is not None:
            cache.put(key, obj)
    return obj


def _render_and_compile(program: CpuProgram, key: str | None) -> bytes:
    """Render and compile: in PARALLEL_PARTS modules at once when the cluster has enough
    distinct kernels (cpu.SplitRender, llvm_cpu.compile_parts), else one."""
    parts = parallel_parts()
    graph = program.graph
    if parts > 1:
        tag = f"braze.{(key or hashlib.sha256(print_graph(graph).encode()).hexdigest())[:16]}"
        split = SplitRender(graph, program.plan, program.slots, program.target, tag, parts)
        if split.groups >= PARALLEL_MIN_GROUPS:
            try:
                return llvm_cpu.compile_parts(split.render, parts, program.target)
            except RuntimeError as e:
                raise CompileError(f"LLVM rejected braze's IR: {e}") from None
    return _compile_uncached(program.llvm_ir, program.target)


def packers(kernel) -> dict:
    """Input position -> how that constant input of `kernel`'s contraction is packed for its
    implementation (`kernel.impl`; empty when it reads its inputs as they are)."""
    impl = kernel.impl
    if impl is None or not impl.packs_operands:
        return {}
    tile = impl.tile
    bias = functools.partial(conv.pack_bias, tile=tile)
    if impl.name == choice.GEMM:
        return {1: functools.partial(gemm.pack_b, tile=tile)}
    if impl.name == choice.RECURRENCE:  # R^T's panels when R is a constant
        r = kernel.contraction.inputs[1]
        return {1: functools.partial(recurrent.pack_r, tile=tile)} if r.is_const else {}
    if impl.name == choice.GROUPED:
        plan = grouped.plan(kernel.contraction, tile)
        width, groups = plan.width, plan.group if plan.padded else 1
        return {1: lambda w: grouped.pack_weight(w, width, groups),
                2: lambda b: grouped.pack_bias(b, width, groups)}
    if impl.name == choice.WINOGRAD:
        return {1: lambda w: winograd.pack_weight(w, impl.m, tile), 2: bias}
    return {1: functools.partial(conv.pack_weight, tile=tile), 2: bias}


def packed_operands(kernels) -> dict:
    """(PACKED, constant) -> its packed array, for the kernels that read packed operands
    (packing happens here, once, at compile time)."""
    out = {}
    for k in (part for k in kernels for part in k.parts()):
        node = k.contraction
        for i, pack in packers(k).items():
            if i < len(node.inputs):
                v = node.inputs[i]
                out.setdefault((PACKED, v), pack(np.asarray(v.const_value)))
    return out


def read_unpacked(graph: Graph, kernels) -> set[Value]:
    """The values some node reads other than as a packed operand, and the graph outputs
    (one pass: each kernel's packers are asked once)."""
    packed = {(part.contraction, i) for k in kernels for part in k.parts()
              for i in packers(part)}
    out = set(graph.outputs)
    for n in graph.nodes:
        out.update(u for i, u in enumerate(n.inputs) if (n, i) not in packed)
    return out


def cache_key(graph: Graph, target: targets.Target) -> str:
    """The compile cache's key for a cluster: its IR text, the target CPU (triple, name,
    features), braze's version, a fingerprint of the compiler's own source (a changed
    codegen never reuses code) and which nodes check for run-time faults: the text
    names large constants without their values, and whether a gather's constant indices
    or a division's constant divisor need a check (and the cluster a fault slot) depends
    on those values (faults.code_of)."""
    text = print_graph(graph)
    codes = (faults.code_of(n) for n in graph.nodes)
    checks = ",".join(f"{i}:{c}" for i, c in enumerate(codes) if c)
    parts = [text, checks, *target.key(), __version__, compiler_fingerprint()]
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
