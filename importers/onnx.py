"""ONNX -> braze IR.

`import_onnx(model_or_path, input_shapes=None)` loads a model (external data
included, see importers.onnx_load), binds every input dim to a concrete size,
turns initializers into `const` nodes and converts each node, in topological
order, through the one converter table (importers.onnx_ops) picked by the
node's schema version at the model's opset. Converted nodes whose inputs are
all constant fold on the spot, so shape subgraphs disappear. A node without a
converter, or one its converter refuses, becomes a `host` node run by
onnxruntime (see importers.onnx_host) with the reason; unsupported is never an
import error, only an invalid model is (unknown op, cycle, dangling input).
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import os
from dataclasses import dataclass

import numpy as np
import onnx
import onnx.defs
import onnx.inliner
from onnx import NodeProto, TypeProto, helper

from compiler import dtypes
from compiler.errors import BrazeError, CompileError, InputError, InvalidModelError
from compiler.ir import Graph, IRError, TensorType, Value, graph_inputs_of, verify
from importers.onnx_host import HostTyper, captured_names, make_payload, onnx_schema
from importers.onnx_load import DEFAULT_DOMAINS, check_versions, load_model, node_name
from importers.onnx_ops import Fallback, lookup
from importers.onnx_ops.context import NodeContext, const_array
from importers.onnx_types import (
    NUMPY_DTYPES,
    array_from_tensor,
    dtype_of_elem,
    proto_from_tensor_type,
    tensor_from_array,
    tensor_type_from_proto,
)
from importers.onnx_validate import NodeChecker

__all__ = ["OnnxImport", "import_onnx", "load_model"]

# Constant inputs up to this many elements are shown to ONNX shape inference of
# host nodes (shape-like inputs are tiny; converting big weights costs time).
INFERENCE_CONST_LIMIT = 4096

# A graph input that a converter needs as a constant (axes, pads, a shape) and that
# has at most this many elements is reported in OnnxImport.value_inputs:
# the caller may specialize on its value, as it does on shapes.
VALUE_SPECIALIZE_ELEMENTS = 64
# ... of these dtypes: sizes, axes and pads (integers), and Resize's scales or Pad's
# constant value given as inputs (floats: each value compiles once, as a shape does).
VALUE_SPECIALIZE_DTYPES = ("i32", "i64", "f32", "f64")
# Values walked back from a wanted one to the graph inputs it is computed from, at most
# (a shape computation is a handful of nodes; a value that depends on a whole model
# is not worth specializing on).
WANTED_SEARCH_VALUES = 64

# ops that pass any value through unchanged, so they convert even for opaque
# or dynamically shaped inputs
PASS_THROUGH = frozenset({"Identity"})


@dataclass
class OnnxImport:
    """The result of importing an ONNX model (see docs/CONTRACTS.md)."""

    graph: Graph
    input_names: list[str]
    output_names: list[str]
    opset: int
    input_dtypes: list[str]
    # inputs whose values would let more nodes convert (see VALUE_SPECIALIZE_ELEMENTS)
    value_inputs: list[str] = dataclasses.field(default_factory=list)


def import_onnx(model_or_path, input_shapes: dict | None = None,
                input_values: dict | None = None) -> OnnxImport:
    """Import an ONNX model (path, bytes or ModelProto) as a statically shaped IR graph.

    `input_values` maps input names to arrays the graph is specialized on: those
    inputs become constants (and are not graph inputs).
    """
    model = load_model(model_or_path)
    opsets = check_versions(model)
    try:
        if model.functions:
            model = onnx.inliner.inline_local_functions(model)
        return _Importer(model, opsets, dict(input_values or {})).run(dict(input_shapes or {}))
    except BrazeError:
        raise
    except Exception as e:  # onnx's own errors and Python ones from a malformed model
        raise InvalidModelError(f"cannot import the model: {type(e).__name__}: "
                                f"{_first_line(e)}") from e


def describe(node: NodeProto, index: int) -> str:
    """'node "name" (Op)', or 'node #index (Op)' for an unnamed node."""
    where = f'"{node_name(node)}"' if node.name else f"#{index}"
    op = f"{node.domain}.{node.op_type}" if node.domain not in DEFAULT_DOMAINS else node.op_type
    return f"node {where} ({op})"


@functools.cache
def _ort_ops() -> frozenset:
    """(domain, op_type) of every op onnxruntime has a schema for (contrib ops included)."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

        return frozenset((s.domain, s.name) for s in ort_state.get_all_operator_schema())
    except (ImportError, AttributeError):
        return frozenset()


class _Importer:
    def __init__(self, model: onnx.ModelProto, opsets: dict[str, int], values: dict):
        self.model = model
        self.values = values
        self.value_inputs: list[str] = []
        self.opsets = opsets
        self.graph = Graph("main")
        self.env: dict[str, Value] = {}
        self.onnx_types: dict[Value, TypeProto] = {}  # ONNX types of host outputs and opaque inputs
        self.bindings: dict[str, int] = {}
        g = model.graph
        self.declared = {v.name: v.type for v in list(g.value_info) + list(g.output)}
        self.typer: HostTyper | None = None
        self.checker = NodeChecker(model)

    def run(self, input_shapes: dict) -> OnnxImport:
        if not self.model.graph.output:  # (onnxruntime loads it, then refuses every run)
            raise InvalidModelError("the graph declares no outputs: there is nothing to "
                                    "compute")
        inputs = self._add_inputs(input_shapes)
        self.typer = HostTyper(self.model, self.opsets, self._bound_input_types(inputs))
        self._add_initializers()
        for index, node in self._ordered_nodes():
            self._convert(index, node)
        outputs = [o.name for o in self.model.graph.output]
        for name in outputs:
            if name not in self.env:
                raise InvalidModelError(f"graph output {name!r} is produced by no node, "
                                        f"input or initializer")
        self.graph.outputs = [self.env[name] for name in outputs]
        self._check_output_types()
        self.graph.remove_dead()
        verify(self.graph)
        _check_sizes(self.graph)
        return OnnxImport(self.graph, [v.name for v in inputs], outputs, self.opsets.get("", 0),
                          [v.dtype for v in inputs], self.value_inputs)

    def _check_output_types(self) -> None:
        """A graph output declared with an element type its producer does not give is an
        invalid model (onnxruntime refuses it)."""
        for vi, v in zip(self.model.graph.output, self.graph.outputs):
            tt = vi.type.tensor_type if vi.type.WhichOneof("value") == "tensor_type" else None
            if tt is not None and not tt.elem_type:
                raise InvalidModelError(f"graph output {vi.name!r} has no element type "
                                        f"(elem_type 0, UNDEFINED)")
            if tt is None or v.dtype == "opaque":
                continue
            declared = dtype_of_elem(tt.elem_type)
            if declared != v.dtype:
                raise InvalidModelError(f"graph output {vi.name!r} is declared "
                                        f"{onnx.TensorProto.DataType.Name(tt.elem_type)}, "
                                        f"but its producer gives {v.dtype}")

    # -- inputs and initializers ------------------------------------------

    def _real_inputs(self) -> list:
        inits = {t.name for t in self.model.graph.initializer}
        inits |= {t.values.name for t in self.model.graph.sparse_initializer}
        return [vi for vi in self.model.graph.input if vi.name not in inits]

    def _add_inputs(self, input_shapes: dict) -> list[Value]:
        real = self._real_inputs()
        unknown = set(input_shapes) - {vi.name for vi in real}
        if unknown:
            raise InputError(f"input_shapes names {sorted(unknown)}, which are not model "
                             f"inputs; the inputs are {[vi.name for vi in real]}")
        for vi in real:  # bind symbolic dims from the given shapes first
            if vi.name in input_shapes:
                self._bind_given(vi, input_shapes[vi.name])
        values = []
        for vi in real:
            t = self._input_type(vi, input_shapes.get(vi.name))
            if vi.name in self.values:
                self.env[vi.name] = self._value_input(vi.name, t)
                continue
            v = self.graph.add_input(vi.name, t)
            if t.dtype == "opaque":
                self.onnx_types[v] = vi.type
            self.env[vi.name] = v
            values.append(v)
        return values

    def _value_input(self, name: str, t: TensorType) -> Value:
        """A specialized input: a constant holding the value the caller gave."""
        arr = np.array(self.values[name])
        if arr.shape != t.shape or dtypes.from_numpy(arr.dtype) != t.dtype:
            raise InputError(f"input_values[{name!r}] is {arr.dtype}{list(arr.shape)}; "
                             f"the input is {t}")
        arr.setflags(write=False)
        return self.graph.add_node("const", [], {"value": arr}, out_names=[name]).output

    def _bind_given(self, vi, given) -> None:
        given = tuple(int(d) for d in given)
        tt = vi.type.tensor_type
        if vi.type.WhichOneof("value") != "tensor_type":
            raise InputError(f"input {vi.name!r} is not a tensor; it takes no shape")
        if not tt.HasField("shape"):
            return
        if len(tt.shape.dim) != len(given):
            raise InputError(f"input {vi.name!r} has rank {len(tt.shape.dim)}, "
                             f"but input_shapes gives {given}")
        for d, g in zip(tt.shape.dim, given):
            if d.HasField("dim_value") and d.dim_value != g:
                raise InputError(f"input {vi.name!r} has shape {_dims(tt)}; "
                                 f"input_shapes gives {given}")
            if d.dim_param:
                if self.bindings.setdefault(d.dim_param, g) != g:
                    raise InputError(f"dim {d.dim_param!r} is bound to both "
                                     f"{self.bindings[d.dim_param]} and {g} (input {vi.name!r})")

    def _input_type(self, vi, given) -> TensorType:
        if vi.type.WhichOneof("value") != "tensor_type":
            return TensorType("opaque", ())
        if not vi.type.tensor_type.elem_type:
            raise InvalidModelError(f"input {vi.name!r} has no element type "
                                    f"(elem_type 0, UNDEFINED)")
        dtype = dtype_of_elem(vi.type.tensor_type.elem_type)
        if given is not None:
            return TensorType(dtype, tuple(int(d) for d in given))
        t = tensor_type_from_proto(vi.type, self.bindings)
        if not vi.type.tensor_type.HasField("shape") or not t.static:
            raise InvalidModelError(
                f"input {vi.name!r} has shape {_dims(vi.type.tensor_type)} with unknown dims; "
                f"pass input_shapes={{{vi.name!r}: (...)}} with concrete sizes")
        return t

    def _bound_input_types(self, inputs: list[Value]) -> dict[str, TypeProto]:
        out = {}
        for v in inputs:
            tp = self.onnx_types.get(v) or proto_from_tensor_type(v.type)
            if tp is not None:
                out[v.name] = tp
        return out

    def _add_initializers(self) -> None:
        for t in self.model.graph.initializer:
            if not t.name or not t.data_type:
                raise InvalidModelError(f"initializer {t.name!r} has no "
                                        f"{'name' if not t.name else 'element type'}")
            arr = array_from_tensor(t)
            if arr is None:
                node = helper.make_node("Constant", [], [t.name], value=t)
                self._host(node, f"initializer {t.name!r}",
                           f"element type {onnx.TensorProto.DataType.Name(t.data_type)} "
                           f"has no numpy form in braze")
                continue
            v = self.graph.add_node("const", [], {"value": arr}, out_names=[t.name]).output
            self.env[t.name] = v
        for t in self.model.graph.sparse_initializer:
            node = helper.make_node("Constant", [], [t.values.name], sparse_value=t)
            self._host(node, f"initializer {t.values.name!r}", "sparse initializer")

    # -- nodes --------------------------------------------------------------

    def _ordered_nodes(self) -> list[tuple[int, NodeProto]]:
        """Nodes in a stable topological order; InvalidModelError on a dangling input or cycle."""
        nodes = list(self.model.graph.node)
        producer: dict[str, int] = {}
        for i, n in enumerate(nodes):
            bad = [x for x in list(n.input) + list(n.output) if isinstance(x, bytes)]
            if bad:
                raise InvalidModelError(f"{describe(n, i)}: value name {bad[0]!r} is not "
                                        f"valid UTF-8")
            for out in n.output:
                if out and (out in producer or out in self.env):
                    raise InvalidModelError(f"{describe(n, i)} defines {out!r}, "
                                            f"which is already defined")
                if out:
                    producer[out] = i
        waiting = [0] * len(nodes)
        readers: dict[int, list[int]] = {}
        for i, n in enumerate(nodes):
            for name in set(list(n.input) + captured_names(n)) - {""}:
                if name in self.env:
                    continue
                if name not in producer:
                    raise InvalidModelError(f"{describe(n, i)} reads {name!r}, which no node, "
                                            f"graph input or initializer defines")
                waiting[i] += 1
                readers.setdefault(producer[name], []).append(i)
        return self._kahn(nodes, waiting, readers)

    @staticmethod
    def _kahn(nodes, waiting, readers) -> list[tuple[int, NodeProto]]:
        ready = [i for i, w in enumerate(waiting) if w == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            i = heapq.heappop(ready)
            order.append((i, nodes[i]))
            for r in readers.get(i, []):
                waiting[r] -= 1
                if waiting[r] == 0:
                    heapq.heappush(ready, r)
        if len(order) < len(nodes):
            stuck = min(i for i, w in enumerate(waiting) if w > 0)
            raise InvalidModelError(f"the graph has a cycle: {describe(nodes[stuck], stuck)} "
                                    f"depends on its own output")
        return order

    def _schema_version(self, node: NodeProto, desc: str) -> int | None:
        """The node's ONNX schema version; None for an op only onnxruntime knows."""
        domain = "" if node.domain in DEFAULT_DOMAINS else node.domain
        if domain in onnx.defs.C.schema_version_map():
            if not onnx.defs.has(node.op_type, domain):
                raise InvalidModelError(f"{desc}: unknown op {node.op_type} in domain {domain!r}")
            if domain not in self.opsets:
                raise InvalidModelError(f"{desc}: the model imports no opset of domain "
                                        f"{domain or 'ai.onnx'!r}")
            schema = onnx_schema(node, self.opsets)
            if schema is None:
                raise InvalidModelError(f"{desc}: op {node.op_type} does not exist at opset "
                                        f"{self.opsets[domain]} of domain {domain or 'ai.onnx'!r}")
            return schema.since_version
        if (domain, node.op_type) in _ort_ops():
            return None
        raise InvalidModelError(f"{desc}: unknown op {node.op_type} in domain {domain!r} "
                                f"(neither ONNX nor onnxruntime defines it)")

    def _convert(self, index: int, node: NodeProto) -> None:
        desc = describe(node, index)
        version = self._schema_version(node, desc)
        self._validate(node, desc, version)
        domain = "" if node.domain in DEFAULT_DOMAINS else node.domain
        if version is None:
            fn, reason = None, f"no braze converter for {domain}.{node.op_type}"
        else:
            fn, reason = lookup(domain, node.op_type, version)
        inputs = [self.env[name] if name else None for name in node.input]
        if fn is not None and node.op_type not in PASS_THROUGH:
            reason = _unconvertible(inputs)
        ir_failed = False
        if fn is not None and not reason:
            start = len(self.graph.nodes)
            try:
                outs = fn(NodeContext(self.graph, node, version, inputs, desc))
                self._bind(node, outs, start)
                return
            except Fallback as f:
                reason = f.reason
                self._note_wanted(f.wants)
            except IRError as e:
                reason, ir_failed = f"braze's IR rejects the conversion: {e}", True
            except BrazeError:
                raise
            except Exception as e:  # a converter tripping over a malformed node
                raise InvalidModelError(f"{desc}: cannot be converted "
                                        f"({type(e).__name__}: {e})") from e
        self._host(node, desc, reason, ir_failed)

    def _validate(self, node: NodeProto, desc: str, version: int | None) -> None:
        """InvalidModelError for a node onnxruntime would refuse (importers.onnx_validate)."""
        names = [n for n in node.input if n]
        values = {n: self.env[n] for n in names}
        types = {n: tp for n, v in values.items()
                 if (tp := self.onnx_types.get(v) or proto_from_tensor_type(v.type))}
        schema = onnx_schema(node, self.opsets) if version is not None else None
        self.checker.check(node, desc, schema, types,
                           lambda name: const_array(values.get(name)))

    def _bind(self, node: NodeProto, outs: list, start: int) -> None:
        """Map the node's ONNX outputs to the converter's values, giving new ones ONNX names."""
        new = {id(o) for n in self.graph.nodes[start:] for o in n.outputs}
        renamed = set()
        for i, name in enumerate(node.output):
            if not name:
                continue
            if i >= len(outs) or outs[i] is None:
                raise Fallback(f"braze does not produce its output {i} ({name!r})")
        for i, name in enumerate(node.output):
            if not name:
                continue
            v = outs[i]
            if id(v) in new and id(v) not in renamed:
                try:
                    self.graph.rename(v, name)
                    renamed.add(id(v))
                except IRError:
                    pass  # the name is taken (by a braze-made value): keep the fresh one
            self.env[name] = v

    def _note_wanted(self, v: Value | None) -> None:
        """Record the small integer or float graph inputs a value a converter wanted as a constant
        is computed from (the value itself, or e.g. pads computed from a size input by
        Max, Sub, Div and Concat, as ONNX's function expansions do): with their values
        known, that computation folds. Nothing when anything else feeds it."""
        leaves = None if v is None else graph_inputs_of(v, WANTED_SEARCH_VALUES)
        if leaves is None or not all(
                u.dtype in VALUE_SPECIALIZE_DTYPES and u.type.static
                and u.type.size <= VALUE_SPECIALIZE_ELEMENTS for u in leaves):
            return
        self.value_inputs.extend(u.name for u in leaves if u.name not in self.value_inputs)

    # -- host nodes ---------------------------------------------------------

    def _host(self, node: NodeProto, desc: str, reason: str, ir_failed: bool = False) -> None:
        """Add `node` as a host node with the reason; its output types from ONNX inference."""
        in_names = list(dict.fromkeys(n for n in node.input if n))
        in_names += [n for n in captured_names(node) if n not in in_names]
        in_vals = [self.env[n] for n in in_names]
        in_types = {n: tp for n, v in zip(in_names, in_vals)
                    if (tp := self.onnx_types.get(v) or proto_from_tensor_type(v.type))}
        in_data = {n: tensor_from_array(a, n) for n, v in zip(in_names, in_vals)
                   if (a := const_array(v)) is not None and a.size <= INFERENCE_CONST_LIMIT
                   and a.dtype != object}
        found, error = self.typer.infer(node, in_types, in_data)
        if error and ir_failed:
            raise InvalidModelError(f"{desc}: {error}")
        out_names = [o for o in node.output if o]
        protos = [found.get(o) or self.declared.get(o) for o in out_names]
        out_types = [tensor_type_from_proto(tp, self.bindings) if tp is not None
                     else TensorType("opaque", ()) for tp in protos]
        types = dict(in_types)
        types.update({o: tp for o, tp in zip(out_names, protos) if tp is not None})
        payload = make_payload(node, in_names, out_names, self.model.opset_import, types)
        attrs = {"framework": "onnx", "domain": node.domain, "op_type": node.op_type,
                 "payload": payload, "reason": reason}
        n = self.graph.add_node("host", in_vals, attrs, name=node_name(node), out_names=out_names,
                                out_types=out_types)
        for name, v, tp in zip(out_names, n.outputs, protos):
            self.env[name] = v
            if tp is not None:
                self.onnx_types[v] = tp


def _unconvertible(inputs: list) -> str:
    """Why no converter may touch these inputs ("" if it may)."""
    for v in inputs:
        if v is None:
            continue
        if not v.type.static:
            return f"input %{v.name} has a data-dependent shape {v.type}"
        if v.dtype not in NUMPY_DTYPES:
            return f"input %{v.name} has dtype {v.dtype}, which braze does not compute with"
    return ""


def _check_sizes(graph: Graph) -> None:
    """CompileError for a tensor larger than the memory this machine has available now
    (a model whose pads or shapes ask for one would fail allocating it at every call, or
    get the process killed by the kernel's out-of-memory killer)."""
    limit = _memory_bytes()
    for n in graph.nodes:
        for v in n.outputs:
            if v.dtype != "opaque" and v.type.static:
                size = v.type.size * dtypes.itemsize(v.dtype)
                if size > limit:
                    raise CompileError(f"{n.describe()}: its result %{v.name} {v.type} takes "
                                       f"{size / 2**30:.1f} GiB, more than the "
                                       f"{limit / 2**30:.1f} GiB of memory this machine has "
                                       "available")


def _memory_bytes() -> int:
    """The memory available to new allocations (Linux's MemAvailable), else the machine's
    physical memory, else 1 TiB."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 40


def _first_line(e: Exception) -> str:
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    return lines[0] if lines else ""


def _dims(tt) -> str:
    """An ONNX tensor type's shape as text: (N, 3, ?)."""
    if not tt.HasField("shape"):
        return "(unknown rank)"
    dims = [str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?")
            for d in tt.shape.dim]
    return "(" + ", ".join(dims) + ")"
