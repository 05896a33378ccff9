"""`compile_onnx`: an ONNX model in, a callable taking and returning numpy arrays out.

The model is specialized to the concrete input shapes of each call, as XLA
does: import (importers.onnx) -> graph passes -> clustering with the target's
codegen -> an Executable whose compiled clusters run braze's kernels and whose
host clusters run on onnxruntime. Specializations are cached per input-shape
signature (MAX_SPECIALIZATIONS, least recently used dropped first).
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
from dataclasses import dataclass

import numpy as np

from bridge.inputs import bind_inputs, check_input, input_spec
from compiler.errors import BrazeError, CompileError, InputError
from compiler.ir import Graph
from compiler.target import kind as target_kind
from compiler.target import parse as parse_target
from compiler.passes.cluster import (
    Cluster,
    describe_partition,
    outline,
    partition,
    singletons,
)

log = logging.getLogger("braze")

# Distinct input-shape signatures kept compiled per model; a model called with
# ever-changing shapes recompiles rather than growing without bound.
MAX_SPECIALIZATIONS = 16

# Each thread is an OS thread (onnxruntime's pool, braze's kernels): a count beyond
# any machine's cores is a typo that would start that many threads.
MAX_THREADS = 256


@dataclass(frozen=True)
class Options:
    """Options shared by compile_onnx, onnx_backend.prepare and the torch backend."""

    allow_fallback: bool = True
    threads: int = 2

    @classmethod
    def from_kwargs(cls, options: dict) -> Options:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(options) - known)
        if unknown:
            raise BrazeError(f"unknown option(s) {', '.join(unknown)}; "
                             f"known options: {', '.join(sorted(known))}")
        opts = cls(**options)
        if (not isinstance(opts.threads, int) or isinstance(opts.threads, bool)
                or not 1 <= opts.threads <= MAX_THREADS):
            raise BrazeError(f"threads must be a positive integer up to {MAX_THREADS}, "
                             f"got {opts.threads!r}")
        return opts


@functools.cache
def compile_cache():
    """The on-disk cache of compiled code (runtime/disk_cache.py; BRAZE_CACHE_DIR=off
    disables it)."""
    from runtime.disk_cache import DiskCache

    return DiskCache()


def codegen_supports(target: str):
    """The target's `supports(node) -> None | reason` (CONTRACTS.md, codegen)."""
    try:
        from compiler.codegen import supports
    except ImportError:
        return lambda node: f"no braze codegen for {node.op} on {target} yet"
    return lambda node: supports(node, target)


def run_pipeline(graph: Graph) -> None:
    """braze's graph passes, in place (compiler/passes/pipeline.py lists them)."""
    try:
        from compiler.passes.pipeline import run_passes
    except ImportError:
        return
    run_passes(graph)


def plan(graph: Graph, target: str, allow_fallback: bool = True) -> list[Cluster]:
    """Passes, then clusters of `graph` for `target` (without fallback, no cheap op is
    moved to the host: every refusal is then a real one)."""
    run_pipeline(graph)
    run_target_passes(graph, target)
    return partition(graph, codegen_supports(target), demote_cheap=allow_fallback)


def run_target_passes(graph: Graph, target: str) -> None:
    """Passes that depend on what the target compiles: channels-last conv chains."""
    try:
        from compiler.codegen import channels_last_refusal
    except ImportError:
        return
    from compiler.passes.layout import channels_last

    channels_last(graph, lambda node: channels_last_refusal(node, target))


def first_refusal(clusters: list[Cluster]) -> str | None:
    """'cannot compile <node>: <reason>' for the first node braze would leave to the host."""
    for c in clusters:
        if not c.compiled:
            n = c.nodes[0]
            label = n.label
            name = n.name or n.outputs[0].name
            return f"cannot compile {label} node {name!r}: {c.reasons[n]}"
    return None


def compile_cluster(sub: Graph, target: str, threads: int):
    """braze's kernels for a compiled cluster's sub-graph, loaded to run: a
    runtime.cpu.CpuStep (on "cuda", a runtime.cuda.CudaStep running PTX for the current
    device)."""
    from compiler.codegen import compile_graph

    if target == "cuda":
        from runtime.cuda import CudaStep, device_arch

        return CudaStep(compile_graph(sub, target=target, cache=compile_cache(),
                                      arch=device_arch()))
    from runtime.cpu import CpuStep

    return CpuStep(compile_graph(sub, target=target, cache=compile_cache()), threads)


def host_step(sub: Graph, threads: int, opset: int):
    """One onnxruntime session for the sub-graph; if onnxruntime refuses the whole (old
    host ops beside ops exported at a newer opset), one session per node instead."""
    from runtime.executable import build_executable
    from runtime.fallback_onnx import OnnxHostStep

    try:
        return OnnxHostStep(sub, threads=threads, opset=opset)
    except CompileError:
        parts = singletons(sub)
        if len(parts) <= 1:
            raise
    log.info("onnxruntime refused host cluster %s whole; running its %d nodes one by one",
             sub.name, len(parts))
    return build_executable(
        sub, parts, lambda c: OnnxHostStep(outline(sub, c), threads=threads, opset=opset)).run


class _Specialization:
    """One input signature (shapes, plus the values of inputs specialized on): its graph,
    clusters and executable."""

    def __init__(self, model, shapes: dict, values: dict, target: str, opts: Options):
        from compiler import gc_paused

        with gc_paused():
            self._build(model, shapes, values, target, opts)

    def _build(self, model, shapes: dict, values: dict, target: str, opts: Options):
        from importers.onnx import import_onnx
        from runtime.executable import build_executable

        imported = import_onnx(model, input_shapes=shapes, input_values=values)
        self.shapes, self.values = shapes, values
        self.graph = imported.graph
        self.opset = imported.opset
        # per cluster, in step order: (sub-graph, its CpuStep or None for the host);
        # what save() writes
        self.parts: list[tuple[Graph, object]] = []
        self.input_names = imported.input_names  # the model inputs the executable takes
        self.value_inputs = [n for n in imported.value_inputs if n not in values]
        self.clusters = plan(self.graph, target, opts.allow_fallback)
        self.refusal = first_refusal(self.clusters) if not opts.allow_fallback else None
        if self.refusal and not self.value_inputs:
            raise CompileError(f"{self.refusal} (allow_fallback=False)")
        # with value_inputs, the caller builds a value-specialized one: nothing to run here
        self.executable = None if self.refusal or self.value_inputs else build_executable(
            self.graph, self.clusters, lambda c: self._step(c, target, opts.threads))

    def _step(self, cluster: Cluster, target: str, threads: int):
        """The runtime step for one cluster: braze's kernels or an onnxruntime session."""
        sub = outline(self.graph, cluster)
        compiled = compile_cluster(sub, target, threads) if cluster.compiled else None
        self.parts.append((sub, compiled))
        return compiled.run if compiled else host_step(sub, threads, self.opset)


class CompiledOnnxModel:
    """A compiled ONNX model: call it with numpy arrays (positional or by input name)."""

    def __init__(self, model_or_path, target: str = "cpu", **options):
        from importers.onnx import load_model
        from importers.onnx_load import check_versions

        if target_kind(target) == "cpu":  # TargetError for an unknown spec, CPU or feature
            parse_target(target)
        elif target == "cuda":
            from runtime.cuda import require_device

            require_device()  # BrazeError: no CUDA device was found
        self.target = target
        self.options = Options.from_kwargs(options)
        self._model = load_model(model_or_path)
        check_versions(self._model)
        inits = {t.name for t in self._model.graph.initializer}
        self._inputs = [vi for vi in self._model.graph.input if vi.name not in inits]
        self.input_names = [vi.name for vi in self._inputs]
        self.input_specs = [input_spec(vi) for vi in self._inputs]
        self.output_names = [o.name for o in self._model.graph.output]
        self._specs: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()
        self._fast: tuple | None = None  # (input shapes, specialization) of the latest call

    # -- calling ------------------------------------------------------------

    def __call__(self, *args, **kwargs) -> list[np.ndarray]:
        if not kwargs and len(args) == len(self.input_specs):  # the common call: no dicts
            arrays = [check_input(s, a) for s, a in zip(self.input_specs, args)]
        else:
            arrays = bind_inputs(self.input_specs, args, kwargs)
        fast = self._fast
        if fast is not None and fast[0] == tuple(getattr(a, "shape", None) for a in arrays):
            return fast[1].executable.run(arrays)
        spec = self._specialize(arrays)
        by_name = dict(zip(self.input_names, arrays))
        return spec.executable.run([by_name[n] for n in spec.input_names])

    def _specialize(self, arrays: list) -> _Specialization:
        """The specialization for these inputs' shapes; if converting needs the values of
        small integer inputs (axes, pads, shapes given as inputs), for those values too."""
        shapes = {n: tuple(a.shape) for n, a in zip(self.input_names, arrays)
                  if isinstance(a, np.ndarray)}
        key = tuple(sorted(shapes.items()))
        with self._lock:
            spec = self._lookup(key) or self._build(key, shapes, {})
            given = dict(zip(self.input_names, arrays))
            values: dict = {}
            while spec.value_inputs:  # each round specializes at least one more input
                values.update({n: given[n] for n in spec.value_inputs})
                vkey = key + tuple((n, v.dtype.str, v.tobytes()) for n, v in values.items())
                spec = self._lookup(vkey) or self._build(vkey, shapes, dict(values))
            if spec.refusal:
                raise CompileError(f"{spec.refusal} (allow_fallback=False)")
            # the latest shape-only specialization taking every model input in order is
            # reused by the next call with the same shapes without building a key
            if not values and spec.input_names == self.input_names:
                self._fast = (tuple(getattr(a, "shape", None) for a in arrays), spec)
            return spec

    def _lookup(self, key):
        spec = self._specs.get(key)
        if spec is not None:
            self._specs.move_to_end(key)
        return spec

    def _build(self, key, shapes: dict, values: dict) -> _Specialization:
        log.info("compiling %s for input shapes %s%s", self._model.graph.name or "model", shapes,
                 f" and values of {sorted(values)}" if values else "")
        spec = _Specialization(self._model, shapes, values, self.target, self.options)
        self._specs[key] = spec
        while len(self._specs) > MAX_SPECIALIZATIONS:
            self._specs.popitem(last=False)
        return spec

    # -- artifacts ----------------------------------------------------------

    def save(self, path, input_shapes: dict | None = None) -> None:
        """Write every specialization compiled so far to one artifact file (bridge.load
        runs it in another process without recompiling). `input_shapes` (name -> shape)
        compiles those shapes first; with nothing compiled yet and no `input_shapes`, the
        model's declared static shapes."""
        from bridge.artifact import save_model

        if target_kind(self.target) != "cpu":
            raise BrazeError(f"artifacts hold CPU code; saving a model compiled for "
                             f"{self.target!r} is not supported (braze compile --target cuda "
                             "--emit ptx writes its PTX)")
        with self._lock:
            if input_shapes is not None or not self.saved_specializations():
                self._compile_shapes(self._shapes_to_save(input_shapes or {}))
            specs = self.saved_specializations()
        save_model(self, specs, path)

    def export_c(self, outdir, name: str | None = None, input_shapes: dict | None = None,
                 threads: int = 1) -> dict:
        """Write a C header and library running this model with no Python, for the CPU it
        is compiled for (see bridge/export_c.py); returns the paths written."""
        from bridge.export_c import write_library

        return write_library(self, outdir, name=name, input_shapes=input_shapes,
                             threads=threads)

    def saved_specializations(self) -> list[_Specialization]:
        """The specializations save() writes: those with something to run."""
        return [s for s in self._specs.values() if s.executable is not None]

    def _shapes_to_save(self, given: dict) -> dict:
        unknown = sorted(set(given) - set(self.input_names))
        if unknown:
            raise InputError(f"input_shapes names no input of the model: {', '.join(unknown)}; "
                             f"its inputs are {', '.join(self.input_names)}")
        shapes = {}
        for spec in self.input_specs:
            if spec.name in given:
                shapes[spec.name] = tuple(int(d) for d in given[spec.name])
            elif isinstance(spec.dims, tuple) and None not in spec.dims:
                shapes[spec.name] = spec.dims
            elif spec.dims is not None:
                raise BrazeError(f"nothing to save: no shapes compiled yet and input "
                                 f"{spec.text} has no static shape; call the model once or "
                                 f"pass input_shapes={{{spec.name!r}: (...)}} to save()")
        return shapes

    def _compile_shapes(self, shapes: dict) -> None:
        """Compile for these shapes (the caller holds the lock)."""
        key = tuple(sorted(shapes.items()))
        spec = self._lookup(key) or self._build(key, shapes, {})
        if spec.value_inputs and not any(s.shapes == shapes
                                         for s in self.saved_specializations()):
            raise BrazeError(f"cannot compile from shapes alone: braze needs the values of "
                             f"input(s) {', '.join(spec.value_inputs)}; call the model with "
                             "example inputs before save()")
        if spec.refusal:
            raise CompileError(f"{spec.refusal} (allow_fallback=False)")

    # -- introspection ------------------------------------------------------

    def explain(self, input_shapes: dict | None = None) -> str:
        """Clusters and, for every node not compiled, why (for the given shapes, else those
        of the latest call); `explain_data` gives the same as data."""
        return describe_partition(self._explained_clusters(input_shapes))

    def explain_data(self, input_shapes: dict | None = None) -> dict:
        """`explain` as data: see partition_report."""
        return partition_report(self._explained_clusters(input_shapes))

    def _explained_clusters(self, input_shapes: dict | None) -> list[Cluster]:
        from importers.onnx import import_onnx

        shapes = input_shapes or self._declared_shapes()
        imported = import_onnx(self._model, input_shapes=shapes)
        return plan(imported.graph, self.target, self.options.allow_fallback)

    def _declared_shapes(self) -> dict:
        """The shapes of the latest call (explain() with no shapes given)."""
        if self._specs:
            key = next(reversed(self._specs))
            return {e[0]: e[1] for e in key if len(e) == 2}
        return {}


def explain_onnx(model, shapes: dict, target: str = "cpu", kernels: bool = False) -> str:
    """`braze explain`: import at these shapes, cluster, describe (with `kernels`, each
    compiled cluster's fusion plan too: kernels, their ops and implementations)."""
    from compiler.passes.fuse import describe_kernels
    from importers.onnx import import_onnx

    imported = import_onnx(model, input_shapes=shapes)
    clusters = plan(imported.graph, target)
    text = describe_partition(clusters)
    return text + describe_kernels(imported.graph, clusters, target) if kernels else text


def compile_onnx_ptx(model, shapes: dict, arch: str | None = None,
                     allow_fallback: bool = True) -> list[tuple[Cluster, object]]:
    """PTX for every compiled cluster of the model at these input shapes, for `arch`
    (default sm_80): (cluster, compiler.codegen.cuda.CudaProgram, or None for a host
    cluster) pairs, in step order. Needs no GPU. Without fallback, a host cluster is a
    CompileError."""
    from compiler.codegen import compile_graph
    from importers.onnx import import_onnx

    imported = import_onnx(model, input_shapes=shapes)
    if imported.value_inputs:
        raise BrazeError(f"cannot compile from shapes alone: braze needs the values of "
                         f"input(s) {', '.join(imported.value_inputs)}")
    clusters = plan(imported.graph, "cuda", allow_fallback)
    refusal = None if allow_fallback else first_refusal(clusters)
    if refusal:
        raise CompileError(f"{refusal} (allow_fallback=False)")
    return [(c, compile_graph(outline(imported.graph, c), target="cuda", arch=arch,
                              cache=compile_cache()) if c.compiled else None)
            for c in clusters]


def partition_report(clusters: list[Cluster]) -> dict:
    """The clusters as data: {"clusters": [{id, kind, ops, inputs, outputs}], "not_compiled":
    [{op, name, cluster, reason}], "nodes", "compiled_nodes"} (value names, node labels)."""
    def label(n):
        return n.label

    not_compiled = [{"op": label(n), "name": n.name or n.outputs[0].name, "cluster": c.id,
                     "reason": c.reasons[n]} for c in clusters if not c.compiled for n in c.nodes]
    nodes = sum(len(c.nodes) for c in clusters)
    return {
        "clusters": [{"id": c.id, "kind": c.kind, "ops": [label(n) for n in c.nodes],
                      "inputs": [v.name for v in c.inputs],
                      "outputs": [v.name for v in c.outputs]} for c in clusters],
        "not_compiled": not_compiled,
        "nodes": nodes,
        "compiled_nodes": nodes - len(not_compiled),
    }


def compile_onnx(model_or_path, target: str = "cpu", **options) -> CompiledOnnxModel:
    """Compile an ONNX model (path, bytes or ModelProto) for `target` (see Options)."""
    return CompiledOnnxModel(model_or_path, target, **options)


