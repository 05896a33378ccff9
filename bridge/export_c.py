"""A model compiled ahead of time into a C library: header, static and shared library.

`write_library(compiled, outdir, name, input_shapes, threads)` (CompiledOnnxModel.export_c
and `braze compile --emit c` call it; `export_c(module, example_inputs, outdir)` does it for
a torch module, through torch's ONNX exporter) writes into `outdir`:
- `NAME.h`: inputs' and outputs' names, shapes and dtypes as constants, the scratch size
  (the static memory plan: no allocation inside a call), the thread count it was built
  for, braze's version, and `int NAME_run(inputs..., outputs..., void *scratch)`;
- `libNAME.a` and `libNAME.so`: each compiled cluster's object code
  (compiler/codegen/aot.py), the weights as read-only data (one blob, `.incbin`-ed by a
  generated assembly file), and a generated C driver that lays out the scratch arena,
  fills each cluster's pointer table and calls the clusters in order;
- `README.txt`: the `cc` line that links a program against it.

The library needs libc and libm, and libgomp only when built with threads > 1. A model
with nodes braze does not compile is refused (ExportRefused lists them and why): a C
library has no host framework to fall back on.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from compiler import __version__, dtypes
from compiler.codegen import faults
from compiler.codegen.memory import ALIGN, padded_bytes
from compiler.errors import BrazeError, ExportRefused
from compiler.ir import Graph, Value

# C element type of each IR dtype a library's inputs and outputs may have
C_TYPES = {"f32": "float", "f64": "double", "i64": "int64_t", "i32": "int32_t",
           "i8": "int8_t", "u8": "uint8_t", "bool": "uint8_t", "f16": "uint16_t"}


@dataclass
class _Layout:
    """Where every value lives during a call: C expressions for base pointers."""

    where: dict = field(default_factory=dict)  # Value -> C expression (char *)
    values_bytes: int = 0  # scratch bytes for values passed between clusters
    arena_bytes: int = 0  # the largest cluster arena (clusters run one at a time)
    blob: list = field(default_factory=list)  # weight arrays, in blob order
    blob_bytes: int = 0

    def scratch_value(self, v: Value) -> str:
        self.where[v] = f"(s + {self.values_bytes})"
        self.values_bytes += padded_bytes(v)
        return self.where[v]

    def weight(self, a: np.ndarray) -> str:
        at = self.blob_bytes
        self.blob.append((at, np.ascontiguousarray(a)))
        self.blob_bytes += -(-max(a.nbytes, 1) // ALIGN) * ALIGN
        return f"(W + {at})"


def export_c(module, example_inputs, outdir, name: str | None = None, threads: int = 1,
             target: str = "cpu") -> dict:
    """The C library of a torch module at the shapes of `example_inputs` (a tensor or a
    tuple of them): exported with torch's ONNX exporter (static shapes, inputs in0, in1,
    ..., outputs out0, ...), then compiled by braze for `target` as `write_library` does."""
    import torch

    args = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (
        example_inputs,)
    with tempfile.TemporaryDirectory(prefix="braze-torch-") as tmp:
        path = Path(tmp) / "model.onnx"
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the exporter's deprecation notices
            torch.onnx.export(module, args, str(path),
                              input_names=[f"in{i}" for i in range(len(args))],
                              output_names=["out0"], opset_version=17, dynamo=False)
        from bridge.onnx_api import compile_onnx

        compiled = compile_onnx(str(path), target=target, allow_fallback=False)
        return write_library(compiled, outdir,
                             name=name or _c_name(type(module).__name__.lower()),
                             threads=threads)


def write_library(compiled, outdir, name: str | None = None,
                  input_shapes: dict | None = None, threads: int = 1,
                  cc: str | None = None) -> dict:
    """Write the C library of `compiled` (a CompiledOnnxModel) for `input_shapes` (default:
    the model's static shapes) into `outdir`, for the CPU it was compiled for (its
    `target`: this machine, or another, e.g. "cpu:neoverse-n1@aarch64-linux-gnu", built
    with the GNU cross tools `ARCH-linux-gnu-gcc` and `-ar`); returns {what: path} of the
    files written."""
    from compiler.target import kind, parse

    if kind(compiled.target) != "cpu":
        raise BrazeError(f"a C library runs on a CPU; this model is compiled for "
                         f"{compiled.target!r}")
    target = parse(compiled.target)
    name = _c_name(name or compiled._model.graph.name or "model")
    if not isinstance(threads, int) or threads < 1:
        raise BrazeError(f"threads must be a positive integer, got {threads!r}")
    tools = _tools(cc, target)
    graph, names = _plan_graph(compiled, input_shapes or {})
    clusters = _compiled_clusters(graph, compiled.target)
    objects, steps, layout = _lower(graph, clusters, name, threads, target)
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    header = _header(graph, names, name, layout, threads)
    driver = _driver(graph, name, steps, layout)
    return _build(out, name, header, driver, objects, layout, threads, tools)


def _tools(cc: str | None, target) -> tuple[str, str]:
    """(C compiler, archiver): this machine's, or for another architecture its GNU cross
    tools (ARCH-linux-gnu-gcc, -ar)."""
    from compiler.target import arch_of, host

    triple = None if target.arch == arch_of(host().triple) else target.triple
    if triple is None:
        cc, ar = cc or os.environ.get("CC") or "cc", "ar"
    else:
        if "linux" not in triple:
            raise BrazeError(f"export_c cross-compiles for Linux only; {triple!r} is not")
        prefix = f"{target.arch}-linux-gnu"
        cc, ar = cc or f"{prefix}-gcc", f"{prefix}-ar"
    for tool in (cc, ar):
        if shutil.which(tool) is None:
            raise BrazeError(f"no {tool!r} found: export_c builds the library's driver and "
                             "archive with it" + (f" (install a cross toolchain for {triple}, "
                                                  "e.g. Debian's gcc-aarch64-linux-gnu)"
                                                  if triple else " (set CC or install cc)"))
    return cc, ar


# -- planning -----------------------------------------------------------------------


def _plan_graph(compiled, given: dict) -> tuple[Graph, dict]:
    """The imported, optimized graph for these shapes and the model's input names."""
    from importers.onnx import import_onnx

    with compiled._specs.lock:
        shapes = compiled._shapes_to_save(given)
    imported = import_onnx(compiled._model, input_shapes=shapes)
    if imported.value_inputs:
        raise ExportRefused(f"input(s) {', '.join(imported.value_inputs)} decide shapes by "
                            "their values; a C library takes only data inputs")
    names = {"inputs": list(imported.input_names), "outputs": list(compiled.output_names)}
    return imported.graph, names


def _compiled_clusters(graph: Graph, target) -> list:
    """The clusters of `graph`, all compiled by braze, or ExportRefused naming each node
    that is not and why."""
    from compiler import driver

    clusters = driver.plan(graph, target, allow_fallback=False).clusters
    host = [(n, c.reasons[n]) for c in clusters if not c.compiled for n in c.nodes]
    if host:
        lines = [f"  {n.label} node {n.name or n.outputs[0].name!r}: {why}" for n, why in host]
        raise ExportRefused(f"cannot export to C: {len(host)} node(s) braze does not compile "
                            "(a C library has no host framework to fall back on):\n"
                            + "\n".join(lines))
    return clusters


def _lower(graph: Graph, clusters: list, name: str, threads: int, target) -> tuple:
    """Object code per cluster, the driver's steps (C statements per cluster) and the
    layout of values, arena and weights."""
    from compiler.codegen.aot import library_object
    from compiler.codegen.compiled import CpuProgram
    from compiler.passes.cluster import outline

    layout = _Layout()
    for i, v in enumerate(graph.inputs):
        layout.where[v] = f"((char *)in{i})"
    first_out = {}
    for j, v in enumerate(graph.outputs):
        first_out.setdefault(v, f"((char *)out{j})")
    objects, steps = [], []
    for k, c in enumerate(clusters):
        # plans only (no LLVM run here): the code is compiled for the library below
        program = CpuProgram.from_object_code(outline(graph, c), b"", target)
        prefix = f"{name}_c{k}"
        code = library_object(program.llvm_ir, prefix, threads, target)
        objects.append((f"{prefix}.o", code))
        for v in c.outputs:
            if v not in layout.where:
                layout.where[v] = first_out.get(v) or layout.scratch_value(v)
        layout.arena_bytes = max(layout.arena_bytes, program.arena_bytes)
        steps.append(_step(program, c, prefix, f"{name.upper()}_THREADS", layout))
    for v in graph.outputs:
        if v not in layout.where:  # a constant output
            layout.where[v] = layout.weight(np.asarray(v.const_value))
    return objects, steps, layout


def _step(program, cluster, prefix: str, threads: str, layout: _Layout) -> list[str]:
    """C statements of one cluster: fill its table, call it, copy what it does not write."""
    memory = program.memory
    sub = program.graph
    local = dict(zip(sub.inputs, (layout.where[v] for v in cluster.inputs)))
    outs = dict(zip(sub.outputs, cluster.outputs))
    lines = [f"{{ /* cluster {cluster.id}: {len(cluster.nodes)} nodes, "
             f"{len(program.kernels)} kernels */",
             f"  void *t[{max(len(memory.slots), 1)}];"]
    for v in memory.inputs:
        lines.append(f"  t[{memory.slots[v]}] = {local[v]};")
    for v in memory.outputs:
        lines.append(f"  t[{memory.slots[v]}] = {layout.where[outs[v]]};")
    for slot, a in memory.constants:
        lines.append(f"  t[{slot}] = {layout.weight(a)};")
    for slot, offset in sorted(memory.offsets.items()):
        lines.append(f"  t[{slot}] = a + {offset};")
    if memory.fault_slot is not None:  # the kernels OR run-time fault codes into it
        lines.append(f"  t[{memory.fault_slot}] = &fault;")
    lines.append(f"  {prefix}_run(t, {threads});")
    written = set(memory.outputs)
    for sv, v in zip(sub.outputs, cluster.outputs):
        dst = layout.where[v]
        if sv in written:
            src = layout.where[outs[sv]]
            if src != dst:
                lines.append(f"  memcpy({dst}, {src}, {_nbytes(v)});")
            continue
        src = local.get(sv) or layout.weight(np.asarray(sv.const_value))
        lines.append(f"  memcpy({dst}, {src}, {_nbytes(v)});")
        written.add(sv)
        outs[sv] = v
    lines.append("}")
    return lines


def _nbytes(v: Value) -> int:
    return v.type.size * dtypes.itemsize(v.dtype)


# -- generated sources -------------------------------------------------------------------


def _c_name(text: str) -> str:
    """A C identifier from a model or value name."""
    out = re.sub(r"[^0-9A-Za-z_]", "_", text)
    return out if out and not out[0].isdigit() else f"m_{out}"


def _c_type(v: Value, what: str) -> str:
    ctype = C_TYPES.get(v.dtype)
    if ctype is None:
        raise ExportRefused(f"{what} %{v.name} has dtype {v.dtype}, which the C library "
                            f"cannot take (it takes {', '.join(sorted(C_TYPES))})")
    return ctype


def _signature(graph: Graph, name: str) -> str:
    args = [f"const {_c_type(v, 'input')} *in{i}" for i, v in enumerate(graph.inputs)]
    args += [f"{_c_type(v, 'output')} *out{j}" for j, v in enumerate(graph.outputs)]
    return f"int {name}_run({', '.join(args + ['void *scratch'])})"


def _header(graph: Graph, names: dict, name: str, layout: _Layout, threads: int) -> str:
    up = name.upper()
    scratch = layout.values_bytes + layout.arena_bytes + ALIGN
    lines = [f"/* {name}.h: the model {name!r} compiled ahead of time by braze {__version__}.",
             " * Link: see README.txt. Needs libc, libm"
             + (", libgomp." if threads > 1 else "."), " */",
             f"#ifndef {up}_H", f"#define {up}_H", "", "#include <stdint.h>", "",
             "#ifdef __cplusplus", 'extern "C" {', "#endif", "",
             f'#define {up}_VERSION "braze {__version__}"  /* the compiler that wrote it */',
             f"#define {up}_THREADS {threads}  /* threads the kernels use (fixed at build) */",
             f"/* bytes of the caller's `scratch` buffer (any alignment; not shared by "
             "concurrent calls) */",
             f"#define {up}_SCRATCH_BYTES {scratch}",
             f"#define {up}_NUM_INPUTS {len(graph.inputs)}",
             f"#define {up}_NUM_OUTPUTS {len(graph.outputs)}", ""]
    for kind, values, vnames in (("INPUT", graph.inputs, names["inputs"]),
                                 ("OUTPUT", graph.outputs, names["outputs"])):
        for i, (v, vname) in enumerate(zip(values, vnames)):
            ctype = _c_type(v, kind.lower())
            dims = ", ".join(str(d) for d in v.shape) or "1"
            p = f"{up}_{kind}{i}"
            lines += [f"/* {kind.lower()} {i}: {vname!r}, {ctype}[{dims}] */",
                      f'#define {p}_NAME "{vname}"',
                      f'#define {p}_DTYPE "{np.dtype(dtypes.to_numpy(v.dtype)).name}"',
                      f"#define {p}_RANK {len(v.shape)}",
                      f"#define {p}_SIZE {v.type.size}  /* elements */",
                      f"static const int64_t {p}_SHAPE[] = {{{dims}}};", ""]
    lines += [f"#define {up}_FAULT_INDEX {faults.INDEX}  /* a gather index out of range */",
              f"#define {up}_FAULT_ZERO_DIVISOR {faults.ZERO_DIVISOR}  "
              "/* an integer division by 0 */",
              f"#define {up}_FAULT_LENGTH {faults.LENGTH}  "
              "/* a recurrence's sequence length outside [0, T] */", "",
              "/* Runs the model: inputs and outputs are C-contiguous buffers of the sizes",
              " * above (outputs are written, never read); returns 0, or the FAULT_ codes",
              " * above ORed (the outputs are then computed on clamped values). */",
              _signature(graph, name) + ";", "",
              "#ifdef __cplusplus", "}", "#endif", f"#endif  /* {up}_H */", ""]
    return "\n".join(lines)


def _driver(graph: Graph, name: str, steps: list, layout: _Layout) -> str:
    protos = sorted({line.split("_run(")[0].strip() for step in steps for line in step
                     if "_run(t," in line})
    lines = [f"/* The driver of {name}: generated by braze {__version__}. */",
             f'#include "{name}.h"', "#include <string.h>", "",
             f"extern const unsigned char {name}_weights[] "
             '__attribute__((visibility("hidden")));']
    lines += [f'void {p}_run(void **table, int32_t threads) __attribute__((visibility("hidden")));'
              for p in protos]
    lines += ["", _signature(graph, name) + " {",
              f"  char *s = (char *)(((uintptr_t)scratch + {ALIGN - 1}) & "
              f"~(uintptr_t){ALIGN - 1});",
              f"  char *a = s + {layout.values_bytes};  /* the clusters' arena */",
              f"  const char *W = (const char *){name}_weights;",
              "  int32_t fault = 0;  /* run-time faults (faults.py codes), ORed */",
              "  (void)a; (void)W;"]
    for step in steps:
        lines += ["  " + line for line in step]
    for j, v in enumerate(graph.outputs):
        src = layout.where[v]
        if src != f"((char *)out{j})":
            lines.append(f"  memcpy(out{j}, {src}, {_nbytes(v)});")
    lines += ["  return fault;", "}", ""]
    return "\n".join(lines)


def _weights_asm(name: str) -> str:
    return "\n".join([".section .rodata", f".balign {ALIGN}", f".globl {name}_weights",
                      f".hidden {name}_weights", f".type {name}_weights, %object",
                      f"{name}_weights:", f'.incbin "{name}_weights.bin"', ".byte 0",
                      '.section .note.GNU-stack,"",%progbits', ""])


# -- building ------------------------------------------------------------------------------


def _build(out: Path, name: str, header: str, driver: str, objects: list, layout: _Layout,
           threads: int, tools: tuple[str, str]) -> dict:
    cc, ar = tools
    libs = ["-lm"] + (["-lgomp"] if threads > 1 else [])
    with tempfile.TemporaryDirectory(prefix="braze-export-") as tmp:
        work = Path(tmp)
        (out / f"{name}.h").write_text(header)
        (work / f"{name}.h").write_text(header)
        (work / f"{name}_driver.c").write_text(driver)
        (work / f"{name}_weights.S").write_text(_weights_asm(name))
        with open(work / f"{name}_weights.bin", "wb") as f:
            for at, a in layout.blob:
                f.seek(at)
                f.write(a.tobytes())
            f.truncate(layout.blob_bytes)
        objs = []
        for fname, code in objects:
            (work / fname).write_bytes(code)
            objs.append(fname)
        for src in (f"{name}_driver.c", f"{name}_weights.S"):
            _run([cc, "-O2", "-fPIC", "-c", src], work)
        objs += [f"{name}_driver.o", f"{name}_weights.o"]
        _run([ar, "rcs", str(out.resolve() / f"lib{name}.a"), *objs], work)
        _run([cc, "-shared", "-o", str(out.resolve() / f"lib{name}.so"), *objs, *libs], work)
        shutil.copy(work / f"{name}_driver.c", out / f"{name}_driver.c")
    readme = _readme(name, libs, layout, cc)
    (out / "README.txt").write_text(readme)
    return {"header": out / f"{name}.h", "static": out / f"lib{name}.a",
            "shared": out / f"lib{name}.so", "driver": out / f"{name}_driver.c",
            "readme": out / "README.txt"}


def _readme(name: str, libs: list, layout: _Layout, cc: str) -> str:
    lib = " ".join(libs)
    return "\n".join([
        f"{name}: a model compiled ahead of time by braze {__version__}.",
        "",
        f"{name}.h         the API: {name}_run, shapes, dtypes, {name.upper()}_SCRATCH_BYTES",
        f"lib{name}.a      static library (kernels, driver, {layout.blob_bytes} bytes of "
        "weights in read-only data)",
        f"lib{name}.so     the same as a shared library",
        f"{name}_driver.c  the generated driver (for reading; it is already in both libraries)",
        "",
        "Link a program statically:",
        f"  {cc} -O2 main.c -I. lib{name}.a {lib}",
        "or against the shared library:",
        f"  {cc} -O2 main.c -I. -L. -l{name} {lib} -Wl,-rpath,'$ORIGIN'",
        ""])


def _run(cmd: list, cwd: Path) -> None:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise BrazeError(f"{' '.join(cmd)} failed ({done.returncode}): "
                         f"{done.stderr.strip()[-2000:]}")
