"""Artifacts of compiled ONNX models: `CompiledOnnxModel.save(path)` and `load(path)`.

One file (runtime/artifact.py: a zip with a JSON manifest, .npy tensors and object
code) holds every saved specialization: its key (input shapes, plus the values of
inputs it is specialized on), its graph (IR text, for inspection) and its
Executable's steps. A compiled step is its cluster's IR text and the object code
braze compiled for it: loading rebuilds the CpuProgram from both (fusion and
memory plans are recomputed and must match the saved ones) and never runs LLVM's
optimizer or code generator. A host step is its sub-graph's IR text (host nodes
carry their ONNX node as payload): loading exports it and opens an onnxruntime
session, as compiling did. The manifest's layout is in docs/CONTRACTS.md.
"""

from __future__ import annotations

import numpy as np

from bridge.dynamic import PadPlan
from bridge.inputs import InputSpec, bind_inputs
from bridge.options import Options, check_threads
from bridge.steps import onnx_steps
from compiler.errors import ArtifactError, BrazeError, InputError
from compiler.ir import Graph, IRError, verify
from compiler.target import Target
from compiler.text import constants, graphs_equal, parse_graph, print_graph
from runtime.artifact import (
    ArtifactReader,
    ArtifactWriter,
    executable_data,
    load_executable,
)

KIND = "onnx"  # what the artifact holds (a compiled ONNX model)


# -- saving -------------------------------------------------------------------

def save_model(model, specs: list, path) -> None:
    """Write `specs` (the model's _Specializations) to `path`."""
    if not specs:
        raise BrazeError("nothing to save: no specialization of the model compiled")
    w = ArtifactWriter()
    manifest = {
        "kind": KIND,
        "model": {"name": model._model.graph.name, "target": model.target,
                  "inputs": [s.to_json() for s in model.input_specs],
                  "outputs": list(model.output_names),
                  "options": model.options.saved()},
        "specializations": [_spec_data(w, f"spec{i}", s) for i, s in enumerate(specs)],
    }
    w.write(path, manifest, target=model.target)


def _spec_data(w: ArtifactWriter, prefix: str, spec) -> dict:
    if len(spec.parts) != len(spec.executable.steps):
        raise ArtifactError(f"cannot save: {len(spec.executable.steps)} steps but "
                            f"{len(spec.parts)} recorded clusters")

    def step_data(i: int, step) -> dict:
        part = spec.parts[i]
        graph = _put_graph(w, f"{prefix}/step{i}.ir", part.graph)
        if part.compiled is None:
            return {"kind": "host", "graph": graph}
        return {"kind": "compiled", "graph": graph,
                "object_code": w.add(f"{prefix}/step{i}.o", part.compiled.object_code),
                "memory": _memory_plan(part.compiled)}

    padding = {} if spec.pad_plan is None else {"padding": spec.pad_plan.to_json()}
    return {**padding, "shapes": {n: list(s) for n, s in spec.shapes.items()},
            "values": {n: w.add_tensor(v) for n, v in spec.values.items()},
            "inputs": list(spec.input_names), "opset": spec.opset,
            "graph": _put_graph(w, f"{prefix}/graph.ir", spec.graph),
            "executable": executable_data(spec.executable, w, step_data)}


def _put_graph(w: ArtifactWriter, name: str, g: Graph) -> dict:
    """The graph as IR text plus its large constants as tensors; it must read back equal."""
    text, consts = print_graph(g), constants(g)
    if not graphs_equal(parse_graph(text, consts), g):
        raise ArtifactError(f"cannot save graph {g.name}: its text form does not read back "
                            "the same graph")
    return {"ir": w.add(name, text), "constants": {k: w.add_tensor(v) for k, v in consts.items()}}


def _memory_plan(compiled) -> dict:
    """What the object code assumes: the slot table's order and the arena's size."""
    return {"slots": [_slot_name(k) for k in compiled.slots], "arena_bytes": compiled.arena_bytes}


def _slot_name(key) -> str:
    if isinstance(key, tuple):  # a derived buffer, e.g. (PACKED, weight)
        return ":".join(_slot_name(k) for k in key)
    return getattr(key, "name", None) or str(key)


# -- loading ------------------------------------------------------------------

def load(path, threads: int | None = None) -> LoadedModel:
    """The model saved at `path`, ready to call; `threads` overrides the saved option.

    ArtifactError when the file is missing, damaged, from another braze or format
    version, or compiled for another CPU. Runs no code from the file but the compiled
    kernels it holds, and never compiles (no LLVM).
    """
    if threads is not None:
        check_threads(threads)
    reader = ArtifactReader(path)
    try:
        return LoadedModel(reader, threads)
    except (AttributeError, KeyError, IndexError, TypeError, ValueError, IRError) as e:
        reader.fail(f"malformed artifact ({type(e).__name__}: {e})")


class LoadedModel:
    """A compiled model loaded from an artifact: called like CompiledOnnxModel (numpy
    arrays, positional or by name; returns a list of arrays), for the input signatures
    it was saved with (`saved_shapes`)."""

    def __init__(self, reader: ArtifactReader, threads: int | None):
        m = reader.manifest
        if m.get("kind") != KIND:
            reader.fail(f"holds a {m.get('kind')!r} model; braze loads {KIND!r} ones")
        model = m["model"]
        self.path = reader.path
        self.target = model["target"]
        self.compiled_for = Target.from_json(m["target"])  # what the kernels were built for
        self.input_specs = [InputSpec.from_json(d) for d in model["inputs"]]
        self.input_names = [s.name for s in self.input_specs]
        self.output_names = [str(n) for n in model["outputs"]]
        # as saved, but for `threads` when load() was given it (a model saved without
        # fallback has no host steps: allow_fallback is a record, nothing reads it)
        self.options = _options(reader, model["options"], threads)
        self._specs = [_LoadedSpecialization(reader, d, self.options, self.compiled_for)
                       for d in m["specializations"]]
        if not self._specs:
            reader.fail("holds no compiled specialization")

    def __repr__(self) -> str:
        return (f"<braze artifact {self.path}: inputs {', '.join(self.input_names)}; "
                f"{len(self._specs)} specialization(s)>")

    @property
    def threads(self) -> int:
        """The threads it runs with (load's argument, else the saved option)."""
        return self.options.threads

    @property
    def saved_shapes(self) -> list[dict]:
        """The input shapes of each saved specialization."""
        return [dict(s.shapes) for s in self._specs]

    @property
    def host_steps(self) -> int:
        """Steps that run on onnxruntime, over all specializations."""
        return sum(s.host_steps for s in self._specs)

    def __call__(self, *args, **kwargs) -> list[np.ndarray]:
        arrays = bind_inputs(self.input_specs, args, kwargs)
        by_name = dict(zip(self.input_names, arrays))
        spec, n = self._find(by_name)
        if n is not None:
            return spec.pad_plan.run(spec.executable, spec.input_names, by_name, n)
        return spec.executable.run([by_name[n] for n in spec.input_names])

    def _find(self, given: dict) -> tuple:
        """(the specialization serving these inputs, n when it is a padded bucket)."""
        shapes = {n: tuple(a.shape) for n, a in given.items() if isinstance(a, np.ndarray)}
        same = [s for s in self._specs if s.shapes == shapes and s.pad_plan is None]
        if not same:
            padded = self._bucket(shapes)
            if padded is not None:
                return padded
            saved = "; ".join(_shapes_text(s.shapes) for s in self._specs)
            raise InputError(f"{self.path} holds no code for input shapes "
                             f"{_shapes_text(shapes)}; it was saved for: {saved} "
                             "(compile and save those shapes too)")
        for s in same:
            if all(_same_array(given[n], v) for n, v in s.values.items()):
                return s, None
        names = sorted({n for s in same for n in s.values})
        raise InputError(f"{self.path} was compiled for particular values of input(s) "
                         f"{', '.join(names)} at these shapes, not for the values given "
                         "(call the compiled model with them and save again)")

    def _bucket(self, shapes: dict) -> tuple | None:
        """(the smallest saved bucket serving these shapes, n), or None."""
        fits = [(s.pad_plan.padding.length, i, s, n) for i, s in enumerate(self._specs)
                if s.pad_plan is not None
                and (n := s.pad_plan.serves(shapes, s.shapes)) is not None]
        if not fits:
            return None
        _, _, spec, n = min(fits)
        return spec, n


def _options(reader: ArtifactReader, saved: dict, threads: int | None) -> Options:
    """The saved options, `threads` (when given) in place of the saved one."""
    try:
        return Options.from_dict(dict(saved, threads=threads or saved["threads"]))
    except BrazeError as e:
        reader.fail(f"malformed manifest: options {saved!r}: {e}")


class _LoadedSpecialization:
    """One saved input signature and its rebuilt Executable."""

    def __init__(self, reader: ArtifactReader, d: dict, opts: Options, target: Target):
        self.shapes = {str(n): tuple(int(x) for x in s) for n, s in d["shapes"].items()}
        self.values = {str(n): reader.tensor(t) for n, t in d["values"].items()}
        self.input_names = [str(n) for n in d["inputs"]]
        # a bucket serving shorter lengths by padding (bridge/dynamic.py), else None
        self.pad_plan = PadPlan.from_json(d["padding"]) if "padding" in d else None
        self.graph_entry = d["graph"]  # the whole graph's IR text, for inspection only
        kinds = [st["kind"] for st in d["executable"]["steps"]]
        self.host_steps = kinds.count("host")
        steps = onnx_steps(opts, int(d["opset"]))
        fns = [_load_step(reader, st, steps, target) for st in d["executable"]["steps"]]
        self.executable = load_executable(d["executable"], reader, fns)


def _load_step(reader: ArtifactReader, st: dict, steps, target: Target):
    """The runtime step a saved step describes (bridge/steps.py builds it): its object
    code, or a new onnxruntime session for its host sub-graph."""
    sub = _get_graph(reader, st["graph"])
    if st["kind"] == "host":
        return steps.part(sub, compiled=False).step
    if st["kind"] != "compiled":
        reader.fail(f"malformed manifest: unknown step kind {st['kind']!r}")
    part = steps.load(sub, reader.read(st["object_code"]), target)
    if _memory_plan(part.compiled) != st["memory"]:
        reader.fail(f"{st['label']}: this braze plans its memory differently from the code "
                    "saved for it; compile the model again (`braze compile`)")
    return part.step


def _get_graph(reader: ArtifactReader, d: dict) -> Graph:
    g = parse_graph(reader.text(d["ir"]),
                    {str(k): reader.tensor(v) for k, v in d["constants"].items()})
    verify(g)
    return g


def _same_array(a, b: np.ndarray) -> bool:
    return (isinstance(a, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
            and a.tobytes() == b.tobytes())


def _shapes_text(shapes: dict) -> str:
    return ", ".join(f"{n}={list(s)}" for n, s in sorted(shapes.items())) or "(no tensors)"
