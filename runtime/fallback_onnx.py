"""ONNX host fallback: braze IR -> a standard ONNX model, run by onnxruntime.

`export_onnx(graph)` writes every primitive IR op as default-domain ONNX ops
(one table, `_EXPORTERS`), constants as initializers, and host nodes from their
payload (docs/CONTRACTS.md): the original NodeProto with its inputs and outputs
renamed to the IR's names, plus an Identity for each outer-scope name its
subgraphs capture under another name. The same exporter serves
`braze optimize` (a clean model stock onnxruntime loads) and the runtime's host
steps (`OnnxHostStep`: one InferenceSession per host cluster, created once).

The default-domain opset is the lowest that every exported op needs and at
least every host payload's (`BASE_OPSET`, raised by `_OPSET_NEEDS`).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import FunctionProto, TensorProto, helper, numpy_helper

from compiler import dtypes
from compiler.errors import CompileError
from compiler.ir import Graph, Node, Value

BASE_OPSET = 17  # Reduce* axes as attributes below 18, inputs from 18: both handled

_UNARY = {
    "neg": "Neg", "abs": "Abs", "sign": "Sign", "exp": "Exp", "log": "Log", "sqrt": "Sqrt",
    "reciprocal": "Reciprocal", "sin": "Sin", "cos": "Cos", "tan": "Tan", "asin": "Asin",
    "acos": "Acos", "atan": "Atan", "sinh": "Sinh", "cosh": "Cosh", "tanh": "Tanh",
    "asinh": "Asinh", "acosh": "Acosh", "atanh": "Atanh", "sigmoid": "Sigmoid", "erf": "Erf",
    "floor": "Floor", "ceil": "Ceil", "round": "Round", "isnan": "IsNaN", "isinf": "IsInf",
    "not": "Not", "bitnot": "BitwiseNot",
}
_BINARY = {
    "add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "pow": "Pow", "max": "Max",
    "min": "Min", "and": "And", "or": "Or", "xor": "Xor", "bitand": "BitwiseAnd",
    "bitor": "BitwiseOr", "bitxor": "BitwiseXor", "eq": "Equal", "lt": "Less",
    "le": "LessOrEqual", "gt": "Greater", "ge": "GreaterOrEqual",
}
_REDUCE = {"reduce_sum": "ReduceSum", "reduce_prod": "ReduceProd", "reduce_max": "ReduceMax",
           "reduce_min": "ReduceMin"}
# ONNX ops newer than BASE_OPSET -> the opset that introduced them
_OPSET_NEEDS = {"BitwiseNot": 18, "BitwiseAnd": 18, "BitwiseOr": 18, "BitwiseXor": 18}


def onnx_elem_type(dtype: str) -> int:
    """The ONNX element type of an IR dtype (CompileError for opaque)."""
    if dtype == "bf16":
        return TensorProto.BFLOAT16
    if dtype == "str":
        return TensorProto.STRING
    if dtype == "opaque":
        raise CompileError("opaque values have no ONNX tensor type")
    return helper.np_dtype_to_tensor_dtype(dtypes.to_numpy(dtype))


class _Emitter:
    """Accumulates ONNX nodes, initializers and the opsets they need."""

    def __init__(self, opset: int):
        self.nodes: list = []
        self.inits: list = []
        self.opset = opset
        self.other_opsets: dict[str, int] = {}
        self.names: set[str] = set()
        self.count = 0
        self.types: dict[str, onnx.TypeProto] = {}

    def fresh(self, hint: str) -> str:
        while True:
            self.count += 1
            name = f"{hint}__{self.count}"
            if name not in self.names:
                self.names.add(name)
                return name

    def add(self, op_type: str, inputs: list[str], outputs: list[str] | None = None,
            **attrs) -> str:
        outputs = outputs or [self.fresh(op_type.lower())]
        self.nodes.append(helper.make_node(op_type, inputs, outputs, **attrs))
        self.opset = max(self.opset, _OPSET_NEEDS.get(op_type, 0))
        return outputs[0]

    def const(self, array, hint: str = "c") -> str:
        name = self.fresh(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def ints(self, values, hint: str = "ints") -> str:
        return self.const(np.array(values, dtype=np.int64), hint)


# -- per-op exporters: fn(em, node, input names, output names) ---------------

def _unary(em, n, ins, outs):
    if n.op == "isinf":
        return em.add("IsInf", ins, outs)
    em.add(_UNARY[n.op], ins, outs)


def _binary(em, n, ins, outs):
    em.add(_BINARY[n.op], ins, outs)


def _max(em, n, ins, outs):
    """max(x, 0) is Relu: onnxruntime fuses Relu into the Conv before it, not Max."""
    zero = n.inputs[1].producer
    if (zero is not None and zero.op == "const" and zero.attrs["value"].size == 1
            and float(zero.attrs["value"].reshape(-1)[0]) == 0.0
            and n.outputs[0].type == n.inputs[0].type and n.inputs[0].dtype in dtypes.FLOATS):
        return em.add("Relu", ins[:1], outs)
    em.add("Max", ins, outs)


def _ne(em, n, ins, outs):
    em.add("Not", [em.add("Equal", ins)], outs)


def _mod(em, n, ins, outs, fmod: int):
    em.add("Mod", ins, outs, fmod=fmod)


def _expm1(em, n, ins, outs):
    one = em.const(np.array(1, dtypes.to_numpy(n.inputs[0].dtype)))
    em.add("Sub", [em.add("Exp", ins), one], outs)


def _log1p(em, n, ins, outs):
    one = em.const(np.array(1, dtypes.to_numpy(n.inputs[0].dtype)))
    em.add("Log", [em.add("Add", [ins[0], one])], outs)


def _shift(em, n, ins, outs):
    em.add("BitShift", ins, outs, direction="LEFT" if n.op == "shl" else "RIGHT")


def _bool_bitwise(em, n, ins, outs):
    if n.inputs[0].dtype == "bool":
        return em.add({"bitand": "And", "bitor": "Or", "bitxor": "Xor"}[n.op], ins, outs)
    em.add(_BINARY[n.op], ins, outs)


def _cast(em, n, ins, outs):
    em.add("Cast", ins, outs, to=onnx_elem_type(n.attrs["to"]))


def _reduce(em, n, ins, outs):
    axes, keep = list(n.attrs["axes"]), int(n.attrs["keepdims"])
    if not axes:
        return em.add("Identity", ins, outs)
    op = _REDUCE[n.op]
    if op == "ReduceSum" or em.opset >= 18:
        em.add(op, [ins[0], em.ints(axes, "axes")], outs, keepdims=keep)
    else:
        em.add(op, ins, outs, axes=axes, keepdims=keep)


def _arg(em, n, ins, outs):
    em.add("ArgMax" if n.op == "argmax" else "ArgMin", ins, outs, axis=n.attrs["axis"],
           keepdims=int(n.attrs["keepdims"]), select_last_index=int(n.attrs["select_last"]))


def _reshape(em, n, ins, outs):
    em.add("Reshape", [ins[0], em.ints(n.attrs["shape"], "shape")], outs)


def _transpose(em, n, ins, outs):
    em.add("Transpose", ins, outs, perm=list(n.attrs["perm"]))


def _broadcast(em, n, ins, outs):
    em.add("Expand", [ins[0], em.ints(n.attrs["shape"], "shape")], outs)


def _slice(em, n, ins, outs):
    starts, steps, sizes = (n.attrs[k] for k in ("starts", "steps", "sizes"))
    if any(s == 0 for s in sizes):  # an empty slice: Slice cannot say "0 elements" at index 0
        shape = np.array(sizes, np.int64)
        zero = em.const(np.zeros((), dtypes.to_numpy(n.inputs[0].dtype)))
        return em.add("Expand", [zero, em.ints(shape, "shape")], outs)
    # stop = start + size * step; a negative stop past the front must be "before 0"
    stops = [s + n_ * st if s + n_ * st >= 0 else -(2 ** 62) for s, st, n_ in
             zip(starts, steps, sizes)]
    axes = list(range(len(starts)))
    em.add("Slice", [ins[0], em.ints(starts, "starts"), em.ints(stops, "ends"),
                     em.ints(axes, "axes"), em.ints(steps, "steps")], outs)


def _concat(em, n, ins, outs):
    em.add("Concat", ins, outs, axis=n.attrs["axis"])


def _pad(em, n, ins, outs):
    mode = n.attrs["mode"]
    if mode == "wrap":
        em.opset = max(em.opset, 19)
    args = [ins[0], em.ints(n.attrs["pads"], "pads")]
    if mode == "constant":
        args.append(em.const(np.array(n.attrs["value"]).astype(
            dtypes.to_numpy(n.inputs[0].dtype)), "pad_value"))
    em.add("Pad", args, outs, mode=mode)


def _gather(em, n, ins, outs):
    em.add("Gather", ins, outs, axis=n.attrs["axis"])


def _select(em, n, ins, outs):
    em.add("Where", ins, outs)


def _matmul(em, n, ins, outs):
    em.add("MatMul", ins, outs)


def _window_attrs(n) -> dict:
    return {"strides": list(n.attrs["strides"]), "pads": list(n.attrs["pads"]),
            "dilations": list(n.attrs["dilations"])}


def _conv(em, n, ins, outs):
    em.add("Conv", ins, outs, group=n.attrs["group"], **_window_attrs(n))


def _max_pool(em, n, ins, outs):
    em.add("MaxPool", ins, outs, kernel_shape=list(n.attrs["kernel"]), **_window_attrs(n))


def _avg_pool(em, n, ins, outs):
    attrs = _window_attrs(n)
    if any(d != 1 for d in attrs["dilations"]):
        em.opset = max(em.opset, 19)
    else:
        del attrs["dilations"]
    em.add("AveragePool", ins, outs, kernel_shape=list(n.attrs["kernel"]),
           count_include_pad=int(n.attrs["count_include_pad"]), **attrs)


_EXPORTERS = {
    **{op: _unary for op in _UNARY},
    **{op: _binary for op in _BINARY},
    "bitand": _bool_bitwise, "bitor": _bool_bitwise, "bitxor": _bool_bitwise,
    "max": _max, "ne": _ne, "mod": lambda em, n, i, o: _mod(em, n, i, o, 0),
    "fmod": lambda em, n, i, o: _mod(em, n, i, o, 1), "expm1": _expm1, "log1p": _log1p,
    "shl": _shift, "shr": _shift, "cast": _cast, "select": _select,
    **{op: _reduce for op in _REDUCE}, "argmax": _arg, "argmin": _arg,
    "reshape": _reshape, "transpose": _transpose, "broadcast": _broadcast, "slice": _slice,
    "concat": _concat, "pad": _pad, "gather": _gather,
    "matmul": _matmul, "conv": _conv, "max_pool": _max_pool, "avg_pool": _avg_pool,
}


# -- host nodes -------------------------------------------------------------

def _merge_opsets(em: _Emitter, fn: FunctionProto) -> None:
    for imp in fn.opset_import:
        if imp.domain in ("", "ai.onnx"):
            em.opset = max(em.opset, imp.version)
        else:
            em.other_opsets[imp.domain] = max(em.other_opsets.get(imp.domain, 0), imp.version)


def _host(em: _Emitter, n: Node, ins: list[str], outs: list[str], defined: dict) -> None:
    """Re-create a host node: rename its direct inputs/outputs, alias captured names."""
    fn = FunctionProto()
    fn.ParseFromString(n.attrs["payload"])
    _merge_opsets(em, fn)
    for vi in fn.value_info:
        em.types[vi.name] = vi.type
    node = onnx.NodeProto()
    node.CopyFrom(fn.node[0])
    rename = dict(zip(fn.input, ins))
    direct = set(node.input)
    for orig, ir_name in rename.items():
        if orig in direct or orig == ir_name:
            continue
        if defined.get(orig, ir_name) != ir_name:
            raise CompileError(f"{n.describe()}: captured name {orig!r} clashes with another "
                               f"value of the exported graph")
        if orig not in defined:
            em.add("Identity", [ir_name], [orig])
            defined[orig] = ir_name
    node.input[:] = [rename.get(x, x) if x else "" for x in node.input]
    out_map = dict(zip(fn.output, outs))
    node.output[:] = [out_map.get(x, x) if x else "" for x in node.output]
    em.nodes.append(node)


# -- the graph ----------------------------------------------------------------

def _value_type(em: _Emitter, v: Value, orig: str | None = None) -> onnx.TypeProto:
    if v.dtype == "opaque":
        tp = em.types.get(orig or v.name) or em.types.get(v.name)
        if tp is None:
            raise CompileError(f"no ONNX type known for opaque value %{v.name}")
        return tp
    return helper.make_tensor_type_proto(onnx_elem_type(v.dtype), list(v.shape))


def export_onnx(graph: Graph, *, output_names: list[str] | None = None, opset: int | None = None,
                name: str = "braze") -> onnx.ModelProto:
    """A standard ONNX model computing `graph`; outputs renamed to `output_names` if given.

    The default-domain opset is at least `opset` (e.g. the source model's) and
    BASE_OPSET, unless the graph holds nothing but host nodes and constants: then
    it is the host payloads' own, so old ops (Scatter, Upsample) stay valid.
    """
    only_host = all(n.op in ("host", "const") for n in graph.nodes)
    em = _Emitter(0 if only_host else max(opset or 0, BASE_OPSET))
    em.names.update(v.name for v in graph.values())
    defined: dict[str, str] = {v.name: v.name for v in graph.values()}
    for n in graph.nodes:
        ins = [v.name for v in n.inputs]
        outs = [v.name for v in n.outputs]
        if n.op == "const":
            em.inits.append(numpy_helper.from_array(np.asarray(n.attrs["value"]), outs[0]))
        elif n.op == "host":
            _host(em, n, ins, outs, defined)
        else:
            try:
                exporter = _EXPORTERS[n.op]
            except KeyError:
                raise CompileError(f"{n.describe()}: no ONNX export for op {n.op}") from None
            exporter(em, n, ins, outs)
    out_names = _graph_outputs(em, graph, output_names)
    inputs = [helper.make_value_info(v.name, _value_type(em, v)) for v in graph.inputs]
    outputs = [helper.make_value_info(o, _value_type(em, v)) for o, v in
               zip(out_names, graph.outputs)]
    g = helper.make_graph(em.nodes, name, inputs, outputs, _used(em.inits, em.nodes, out_names))
    opsets = [helper.make_opsetid("", em.opset)]
    opsets += [helper.make_opsetid(d, v) for d, v in sorted(em.other_opsets.items())]
    model = helper.make_model(g, opset_imports=opsets, producer_name="braze")
    model.ir_version = _min_ir_version(em.opset)
    return model


def _used(inits: list, nodes: list, outputs: list[str]) -> list:
    """The initializers some node or graph output reads (a peephole may orphan one)."""
    read = set(outputs)
    _reads(nodes, read)
    return [t for t in inits if t.name in read]


def _reads(nodes, read: set) -> None:
    """Every name the nodes read, their subgraphs' nodes included (outer-scope reads)."""
    for node in nodes:
        read.update(node.input)
        for attr in node.attribute:
            for g in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                _reads(g.node, read)
                read.update(o.name for o in g.output)


def _min_ir_version(opset: int) -> int:
    """The IR version that onnx pairs with a default-domain opset."""
    for ir, op in ((10, 23), (9, 19), (8, 15), (7, 12), (6, 11), (5, 10), (4, 9)):
        if opset >= op:
            return ir
    return 3


def _graph_outputs(em: _Emitter, graph: Graph, wanted: list[str] | None) -> list[str]:
    """ONNX names for the graph outputs: each distinct, never an input.

    A wanted name is given to the producing value itself where that is safe (the
    value is computed here and no subgraph reads it by name); else an Identity.
    """
    names: list[str] = []
    inputs = {v.name for v in graph.inputs}
    in_place = not any(n.op == "host" for n in graph.nodes)
    for i, v in enumerate(graph.outputs):
        want = wanted[i] if wanted else v.name
        if want == v.name and want not in names and want not in inputs:
            names.append(want)
            continue
        if want in names or want in inputs:
            raise CompileError(f"output name {want!r} is used twice or names an input")
        if want in em.names:
            _rename_value(em, want, em.fresh(want))
        if in_place and v.name not in inputs and v.name not in names and v not in graph.outputs[
                i + 1:]:
            _rename_value(em, v.name, want)
        else:
            em.add("Identity", [v.name], [want])
        em.names.add(want)
        names.append(want)
    return names


def _rename_value(em: _Emitter, name: str, new: str) -> None:
    """Rename a value of the emitted graph everywhere it appears."""
    for node in em.nodes:
        node.input[:] = [new if x == name else x for x in node.input]
        node.output[:] = [new if x == name else x for x in node.output]
    for t in em.inits:
        if t.name == name:
            t.name = new


class OnnxHostStep:
    """One onnxruntime session running a braze sub-graph; created once, thread-safe."""

    def __init__(self, subgraph: Graph, threads: int = 2, opset: int | None = None):
        import onnxruntime as ort

        self.model = export_onnx(subgraph, opset=opset)
        self.input_names = [v.name for v in subgraph.inputs]
        self.output_names = [o.name for o in self.model.graph.output]
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.log_severity_level = 3
        # Host sessions alternate with braze's own (OpenMP) kernels on the same cores: an
        # intra-op pool left spinning after its call would steal them from the next step.
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            self.session = ort.InferenceSession(self.model.SerializeToString(), opts,
                                                providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime raises its own types (Fail, NotImplemented...)
            raise CompileError(f"onnxruntime cannot run this host cluster: {e}") from None

    def __call__(self, arrays: list) -> list:
        return self.session.run(self.output_names, dict(zip(self.input_names, arrays)))
