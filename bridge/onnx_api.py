"""`compile_onnx`: an ONNX model in, a callable taking and returning numpy arrays out.

The ONNX adapter of braze's front-end layer. The model is specialized to the
concrete input shapes of each call, as XLA does: import (importers.onnx) -> the
compile driver (compiler/driver.py: passes, the target's passes, clustering) ->
steps (bridge/steps.py: braze's kernels, onnxruntime for host clusters) -> an
Executable. Specializations are kept per input-shape signature
(bridge/specializations.py).
"""

from __future__ import annotations

import logging

import numpy as np

from bridge.dynamic import (
    BUCKET_BASE,
    LengthPolicy,
    PadPlan,
    bucket_of,
    probe_lengths,
    symbolic_dims,
)
from bridge.inputs import bind_inputs, check_input, input_spec
from bridge.options import Options
from bridge.specializations import MISSING, SpecializationCache
from bridge.onnx_fold import fold_constant_host_nodes
from bridge.steps import Part, compile_cache, onnx_steps
from compiler import driver
from compiler.errors import BrazeError, InputError
from compiler.passes.cluster import Cluster, outline
from compiler.passes.padding import PaddingRefused, pad_length
from compiler.target import kind as target_kind

log = logging.getLogger("braze")


class _Specialization:
    """One input signature (shapes, plus the values of inputs specialized on): its graph,
    plan and executable."""

    def __init__(self, model, shapes: dict, values: dict, opts: Options,
                 probes: list | None = None):
        from compiler import gc_paused

        with gc_paused():
            self._build(model, shapes, values, opts, probes)

    def _build(self, model, shapes: dict, values: dict, opts: Options,
               probes: list | None):
        from runtime.executable import build_executable

        imported = _imported(model, shapes, values)
        self.shapes, self.values = shapes, values
        self.graph = imported.graph
        self.opset = imported.opset
        self.input_names = imported.input_names  # the model inputs the executable takes
        self.value_inputs = [n for n in imported.value_inputs if n not in values]
        self.pad_plan: PadPlan | None = None  # set for a bucket (bridge/dynamic.py)
        if probes is None:
            self.plan = driver.plan(self.graph, opts.target, opts.allow_fallback)
        else:
            self.plan = self._padded_plan(model, probes, opts)
        self.clusters = self.plan.clusters
        self.parts: list[Part] = []  # per cluster, in step order: what save() writes
        self.executable = None
        if self.value_inputs:  # the caller builds a value-specialized one: nothing to run
            return
        self.plan.check()
        self.parts = onnx_steps(opts, self.opset).parts(self.plan)
        self.executable = build_executable(self.graph, self.clusters,
                                           [p.step for p in self.parts])

    def _padded_plan(self, model, probes: list, opts: Options) -> driver.Plan:
        """The plan of a bucket: the graph at the bucket's length rewritten to serve every
        shorter one (compiler/passes/padding.py; `probes`: the shapes at other lengths,
        dynamic.probe_lengths). PaddingRefused when that is not proven."""
        if self.value_inputs:
            raise PaddingRefused(f"needs the values of input(s) {', '.join(self.value_inputs)}")
        driver.optimize(self.graph, opts.target)
        others = []
        for probe in probes:
            graph = _imported(model, probe, {}).graph
            driver.optimize(graph, opts.target)
            others.append((graph, _lengths(self.shapes, probe)[1]))
        length = _lengths(self.shapes, probes[0])[0]
        padding = pad_length(self.graph, others[0][0], length, others[0][1],
                             more=tuple(others[1:]))
        self.input_names = [v.name for v in self.graph.inputs]
        self.pad_plan = PadPlan(padding)
        return driver.cut(self.graph, opts.target, opts.allow_fallback)


def _imported(model, shapes: dict, values: dict):
    """The model imported at these shapes, its constant host nodes computed."""
    from importers.onnx import import_onnx

    imported = import_onnx(model, input_shapes=shapes, input_values=values)
    fold_constant_host_nodes(imported.graph, imported.opset)
    return imported


def _lengths(shapes: dict, probe: dict) -> tuple[int, int]:
    """The (bucket, probe) lengths: the one dim where the two sets of shapes differ."""
    pairs = {(a, b) for n in shapes for a, b in zip(shapes[n], probe[n]) if a != b}
    if len(pairs) != 1:
        raise PaddingRefused(f"cannot tell the length from shapes {shapes} and {probe}")
    return next(iter(pairs))


class CompiledOnnxModel:
    """A compiled ONNX model: call it with numpy arrays (positional or by input name)."""

    def __init__(self, model_or_path, target: str = "cpu", **options):
        from importers.onnx import load_model
        from importers.onnx_load import check_versions

        self.options = Options.from_dict(options, target=target)
        if target_kind(target) == "cuda":
            from runtime.cuda import require_device

            require_device()  # BrazeError: no CUDA device was found
        self.target = target
        self._model = load_model(model_or_path)
        check_versions(self._model)
        inits = {t.name for t in self._model.graph.initializer}
        self._inputs = [vi for vi in self._model.graph.input if vi.name not in inits]
        self.input_names = [vi.name for vi in self._inputs]
        self.input_specs = [input_spec(vi) for vi in self._inputs]
        self.output_names = [o.name for o in self._model.graph.output]
        self._specs = SpecializationCache()
        self._fast: tuple | None = None  # (input shapes, specialization) of the latest call
        self._lengths = LengthPolicy(self._model, self.options.dynamic)
        self._refused: dict = {}  # bucket key -> why padding was refused (exact shapes then)
        self.compiles = 0  # specializations built (exact and buckets)

    # -- calling ------------------------------------------------------------

    def __call__(self, *args, **kwargs) -> list[np.ndarray]:
        if not kwargs and len(args) == len(self.input_specs):  # the common call: no dicts
            arrays = [check_input(s, a) for s, a in zip(self.input_specs, args)]
        else:
            arrays = bind_inputs(self.input_specs, args, kwargs)
        fast = self._fast
        if fast is not None and fast[0] == tuple(getattr(a, "shape", None) for a in arrays):
            return fast[1].executable.run(arrays)
        by_name = dict(zip(self.input_names, arrays))
        found = self._bucket(arrays)
        if found is not None:
            spec, n = found
            return spec.pad_plan.run(spec.executable, spec.input_names, by_name, n)
        spec = self._specialize(arrays)
        return spec.executable.run([by_name[n] for n in spec.input_names])

    def _bucket(self, arrays: list) -> tuple | None:
        """(the bucket's specialization, n) when this call runs padded (bridge/dynamic.py):
        its length is dynamic, its exact shapes are not compiled and padding is proven."""
        shapes = {n: tuple(a.shape) for n, a in zip(self.input_names, arrays)
                  if isinstance(a, np.ndarray)}
        with self._specs.lock:
            found = self._lengths.length(shapes)
            if found is None or self._specs.get(tuple(sorted(shapes.items()))) is not MISSING:
                return None
            symbol, n = found
            try:
                return self._bucket_spec(shapes, symbol, bucket_of(n)), n
            except PaddingRefused:
                return None

    def _bucket_spec(self, shapes: dict, symbol: str, length: int) -> _Specialization:
        """The bucket `length` of `symbol` for shapes like these, built if missing (the
        caller holds the lock); PaddingRefused (logged once) when padding is not proven."""
        bucket = self._lengths.with_length(shapes, symbol, length)
        key = (("@padded", symbol),) + tuple(sorted(bucket.items()))
        if key in self._refused:
            raise PaddingRefused(self._refused[key])
        try:
            spec = self._specs.get_or_build(key, lambda: self._build_bucket(bucket, symbol,
                                                                             length))
        except PaddingRefused as e:
            self._refused[key] = str(e)
            log.info("%s: lengths in the bucket of %d compile exactly (padding refused: %s)",
                     symbol, length, e)
            raise
        spec.plan.check()
        return spec

    def _build_bucket(self, shapes: dict, symbol: str, length: int) -> _Specialization:
        """The bucket of `length` (the shapes are at it), probed at length - 1 and at the
        shortest length it serves."""
        probes = [self._lengths.with_length(shapes, symbol, n) for n in probe_lengths(length)]
        log.info("compiling %s for %s up to %d, input shapes %s",
                 self._model.graph.name or "model", symbol, length, shapes)
        spec = _Specialization(self._model, shapes, {}, self.options, probes)
        self.compiles += 1
        return spec

    def _specialize(self, arrays: list) -> _Specialization:
        """The specialization for these inputs' shapes; if converting needs the values of
        small inputs (axes, pads, shapes, Resize scales given as inputs), for those values too."""
        shapes = {n: tuple(a.shape) for n, a in zip(self.input_names, arrays)
                  if isinstance(a, np.ndarray)}
        key = tuple(sorted(shapes.items()))
        with self._specs.lock:
            spec = self._lookup(key, shapes, {})
            given = dict(zip(self.input_names, arrays))
            values: dict = {}
            while spec.value_inputs:  # each round specializes at least one more input
                values.update({n: given[n] for n in spec.value_inputs})
                vkey = key + tuple((n, v.dtype.str, v.tobytes()) for n, v in values.items())
                spec = self._lookup(vkey, shapes, dict(values))
            spec.plan.check()
            # the latest shape-only specialization taking every model input in order is
            # reused by the next call with the same shapes without building a key
            if not values and spec.input_names == self.input_names:
                self._fast = (tuple(getattr(a, "shape", None) for a in arrays), spec)
            return spec

    def _lookup(self, key, shapes: dict, values: dict) -> _Specialization:
        """The specialization kept under `key`, else one built and kept."""
        return self._specs.get_or_build(key, lambda: self._build(shapes, values))

    def _build(self, shapes: dict, values: dict) -> _Specialization:
        log.info("compiling %s for input shapes %s%s", self._model.graph.name or "model", shapes,
                 f" and values of {sorted(values)}" if values else "")
        spec = _Specialization(self._model, shapes, values, self.options)
        self.compiles += 1
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
        with self._specs.lock:
            if input_shapes is not None or not self.saved_specializations():
                self._compile_shapes(self._shapes_to_save(input_shapes or {}))
            specs = self.saved_specializations()
        save_model(self, specs, path)

    def compile_lengths(self, symbol: str, input_shapes: dict) -> list[int]:
        """Compile every bucket of the symbolic dim `symbol` (bridge/dynamic.py) up to its
        size in `input_shapes`, so that save() writes an artifact serving every length
        from 1 to that size; the bucket lengths. BrazeError when padding is refused."""
        if symbol not in self._lengths.symbols:
            raise BrazeError(f"{symbol!r} is no symbolic input dim of the model "
                             f"(dynamic={self.options.dynamic!r}); its symbolic dims: "
                             f"{sorted(symbolic_dims(self._model)) or 'none'}")
        with self._specs.lock:
            shapes = self._shapes_to_save(input_shapes)
        top = max(shapes[n][a] for n, a in self._lengths.symbols[symbol] if n in shapes)
        lengths = [bucket_of(1)]
        while lengths[-1] < top:
            lengths.append(lengths[-1] * BUCKET_BASE)
        for length in lengths:
            with self._specs.lock:
                try:
                    self._bucket_spec(shapes, symbol, length)
                except PaddingRefused as e:
                    raise BrazeError(f"cannot serve {symbol} from buckets: padding to "
                                     f"{length} refused: {e}") from None
        return lengths

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
        spec = self._lookup(tuple(sorted(shapes.items())), shapes, {})
        if spec.value_inputs and not any(s.shapes == shapes
                                         for s in self.saved_specializations()):
            raise BrazeError(f"cannot compile from shapes alone: braze needs the values of "
                             f"input(s) {', '.join(spec.value_inputs)}; call the model with "
                             "example inputs before save()")
        spec.plan.check()

    # -- introspection ------------------------------------------------------

    def explain(self, input_shapes: dict | None = None) -> str:
        """Clusters and, for every node not compiled, why (for the given shapes, else those
        of the latest call); `explain_data` gives the same as data."""
        return self._explained(input_shapes).describe()

    def explain_data(self, input_shapes: dict | None = None) -> dict:
        """`explain` as data: see partition_report."""
        return partition_report(self._explained(input_shapes).clusters)

    def _explained(self, input_shapes: dict | None) -> driver.Plan:
        from importers.onnx import import_onnx

        shapes = input_shapes or self._declared_shapes()
        imported = import_onnx(self._model, input_shapes=shapes)
        return driver.plan(imported.graph, self.target, self.options.allow_fallback)

    def _declared_shapes(self) -> dict:
        """The shapes of the latest call (explain() with no shapes given)."""
        key = self._specs.latest_key()
        return {e[0]: e[1] for e in key if len(e) == 2 and isinstance(e[1], tuple)
                } if key is not None else {}


def explain_onnx(model, shapes: dict, target: str = "cpu", kernels: bool = False) -> str:
    """`braze explain`: import at these shapes, plan, describe (with `kernels`, each
    compiled cluster's fusion plan too: kernels, their ops and implementations)."""
    from compiler.passes.fuse import describe_kernels

    imported = _imported(model, shapes, {})  # as compile_onnx sees it: constants folded
    p = driver.plan(imported.graph, target)
    text = p.describe()
    return text + describe_kernels(imported.graph, p.clusters, target) if kernels else text


def compile_onnx_ptx(model, shapes: dict, arch: str | None = None,
                     allow_fallback: bool = True) -> list[tuple[Cluster, object]]:
    """PTX for every compiled cluster of the model at these input shapes, for `arch`
    (default sm_80): (cluster, compiler.codegen.cuda.CudaProgram, or None for a host
    cluster) pairs, in step order. Needs no GPU. Without fallback, a host cluster is a
    CompileError."""
    from compiler.codegen import compile_graph

    imported = _imported(model, shapes, {})
    if imported.value_inputs:
        raise BrazeError(f"cannot compile from shapes alone: braze needs the values of "
                         f"input(s) {', '.join(imported.value_inputs)}")
    plan = driver.plan(imported.graph, "cuda", allow_fallback)
    plan.check()
    return [(c, compile_graph(outline(plan.graph, c), target="cuda", arch=arch,
                              cache=compile_cache()) if c.compiled else None)
            for c in plan.clusters]


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
    """Compile an ONNX model (path, bytes or ModelProto) for `target`; `options` are
    bridge.options.Options' fields (allow_fallback, threads)."""
    return CompiledOnnxModel(model_or_path, target, **options)
