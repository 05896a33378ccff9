"""The step factory: a plan's clusters become the runtime steps of an Executable.

A compiled cluster becomes braze's code for the target (compiler.codegen:
a CpuStep running a CpuProgram on the CPU, a CudaStep running PTX on "cuda"), or the same code
read back from an artifact; a host cluster becomes whatever the front end runs
host nodes with (an onnxruntime session, eager torch), passed in as `host`.
Every front end builds its steps here, with its Options, and hands the list to
runtime.executable.build_executable (or runtime.artifact.load_executable).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

from bridge.options import Options
from compiler.driver import Plan
from compiler.errors import CompileError
from compiler.ir import Graph
from compiler.passes.cluster import outline, singletons

log = logging.getLogger("braze")

StepFn = Callable[[list], list]


@dataclass
class Part:
    """One cluster at run time: its outlined sub-graph, braze's code for it (a
    CpuStep or CudaStep; None when the host runs it) and its step."""

    graph: Graph
    compiled: object | None
    step: StepFn


@functools.cache
def compile_cache():
    """The on-disk cache of compiled code (runtime/disk_cache.py; BRAZE_CACHE_DIR=off
    disables it)."""
    from runtime.disk_cache import DiskCache

    return DiskCache()


class Steps:
    """Parts for a plan's clusters, with the front end's options.

    `host(sub-graph) -> step` runs a host cluster; `adapt(run) -> step` wraps a
    compiled cluster's `run` (the torch front end hands it tensors); `cache`: where
    compiled code is kept (None: not kept)."""

    def __init__(self, opts: Options, host: Callable[[Graph], StepFn], cache=None,
                 adapt: Callable[[StepFn], StepFn] | None = None):
        self.opts = opts
        self.host = host
        self.cache = cache
        self.adapt = adapt
        # whether the host runs every step (no braze kernel shares its cores): see
        # onnx_host_step's `spin`
        self.host_only = False

    def parts(self, plan: Plan) -> list[Part]:
        """One part per cluster, in step order."""
        self.host_only = not any(c.compiled for c in plan.clusters)
        return [self.part(outline(plan.graph, c), c.compiled) for c in plan.clusters]

    def part(self, sub: Graph, compiled: bool) -> Part:
        if not compiled:
            return Part(sub, None, self.host(sub))
        return self._ready(sub, self.compile(sub))

    def compile(self, sub: Graph):
        """braze's code for a compiled cluster's sub-graph, ready to run."""
        from compiler.codegen import compile_graph

        from compiler.target import kind

        target = self.opts.target
        if kind(target) == "cuda":
            from runtime.cuda import CudaStep, device_arch

            return CudaStep(compile_graph(sub, target=target, cache=self.cache,
                                          arch=device_arch()))
        from runtime.cpu import CpuStep

        return CpuStep(compile_graph(sub, target=target, cache=self.cache), self.opts.threads)

    def load(self, sub: Graph, object_code: bytes, target) -> Part:
        """The part for saved object code (an artifact) built for `target` (a
        compiler.target.Target): loaded, neither rendered nor compiled."""
        from compiler.codegen.compiled import CpuProgram
        from runtime.cpu import CpuStep

        program = CpuProgram.from_object_code(sub, object_code, target)
        return self._ready(sub, CpuStep(program, self.opts.threads))

    def _ready(self, sub: Graph, code) -> Part:
        return Part(sub, code, code.run if self.adapt is None else self.adapt(code.run))


def onnx_host_step(sub: Graph, threads: int, opset: int, spin: bool = False) -> StepFn:
    """One onnxruntime session for the sub-graph; if onnxruntime refuses the whole (old
    host ops beside ops exported at a newer opset), one session per node instead.
    `spin`: the session's threads may spin between its parallel sections (only where no
    braze kernel runs on the same cores: see OnnxHostStep)."""
    from runtime.executable import build_executable
    from runtime.fallback_onnx import OnnxHostStep

    try:
        return OnnxHostStep(sub, threads=threads, opset=opset, spin=spin)
    except CompileError:
        parts = singletons(sub)
        if len(parts) <= 1:
            raise
    log.info("onnxruntime refused host cluster %s whole; running its %d nodes one by one",
             sub.name, len(parts))
    steps = [OnnxHostStep(outline(sub, c), threads=threads, opset=opset, spin=spin)
             for c in parts]
    return build_executable(sub, parts, steps).run


def onnx_steps(opts: Options, opset: int) -> Steps:
    """The ONNX front ends' steps (compile_onnx and artifacts): onnxruntime for the host,
    compiled code kept in the on-disk cache."""
    steps = Steps(opts, lambda sub: onnx_host_step(sub, opts.threads, opset,
                                                   spin=steps.host_only), compile_cache())
    return steps
