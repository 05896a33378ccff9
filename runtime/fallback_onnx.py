"""ONNX host fallback: braze IR -> a standard ONNX model, run by onnxruntime.

`export_onnx(graph)` writes every primitive IR op as default-domain ONNX ops
(one table, `_EXPORTERS`), constants as initializers, and host nodes from their
payload (docs/CONTRACTS.md): the original NodeProto with its inputs and outputs
renamed to the IR's names, plus an Identity for each outer-scope name its
subgraphs capture under another name. The same exporter serves
`braze optimize` (a clean model stock onnxruntime loads) and the runtime's host
steps (`OnnxHostStep`: one InferenceSession per host cluster, created once).

The default-domain opset is chosen before anything is emitted (`choose_opset`):
the host payloads' own where the mapping is valid there, else the lowest the
mapping needs. Where onnxruntime has no kernel for an op's dtype, the node is
computed in a carrier dtype (runtime/onnx_carriers.py).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import FunctionProto, TensorProto, helper, numpy_helper

from compiler import dtypes
from compiler.ops import facets
from compiler.errors import CompileError, host_op_error
from compiler.ir import Graph, Node, Value
from runtime import onnx_recurrence
from runtime.onnx_carriers import Carrier, carrier, data_dtype, retyped
from runtime.ort_errors import ort_message, where

# The default-domain opset when neither the caller nor a host payload asks for one.
BASE_OPSET = 17
# The lowest opset the mapping is valid at: Add/Sub/Mul/Div take 8- and 16-bit
# integers from 14 (Reduce* axes as attributes below 18, as inputs from 18: both handled).
MIN_OPSET = 14

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
_BITWISE = ("bitnot", "bitand", "bitor", "bitxor")  # Bitwise* ops: opset 18


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
        self.inits: dict[str, np.ndarray] = {}  # written into the model once, at the end
        self.opset = opset
        self.other_opsets: dict[str, int] = {}
        self.names: set[str] = set()
        self.count = 0
        self.types: dict[str, onnx.TypeProto] = {}
        # recurrence node -> the projection its export absorbs (onnx_recurrence.py)
        self.projections: dict = {}

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
        return outputs[0]

    def const(self, array, hint: str = "c") -> str:
        name = self.fresh(hint)
        self.inits[name] = np.asarray(array)
        return name

    def ints(self, values, hint: str = "ints") -> str:
        return self.const(np.array(values, dtype=np.int64), hint)


# -- per-op exporters: fn(em, node, input names, output names) ---------------

def _unary(em, n, ins, outs):
    em.add(_UNARY[n.op], ins, outs)


def _neg(em, n, ins, outs):
    """ONNX Neg takes no unsigned type: 0 - x wraps as numpy's negation does."""
    if n.inputs[0].dtype in dtypes.UNSIGNED:
        zero = em.const(np.zeros((), dtypes.to_numpy(n.inputs[0].dtype)), "zero")
        return em.add("Sub", [zero, ins[0]], outs)
    em.add("Neg", ins, outs)


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


def _fmod(em, n, ins, outs):
    em.add("Mod", ins, outs, fmod=1)


def _mod(em, n, ins, outs):
    """Floor modulo (the sign of the divisor). onnxruntime floor-mods integers only (before
    opset 28), so floats take fmod and add the divisor where the signs differ, as numpy."""
    if n.inputs[0].dtype not in dtypes.FLOATS:
        return em.add("Mod", ins, outs, fmod=0)
    r = em.add("Mod", ins, fmod=1)
    zero = em.const(np.zeros((), dtypes.to_numpy(n.inputs[0].dtype)), "zero")
    signs_differ = em.add("Xor", [em.add("Less", [r, zero]), em.add("Less", [ins[1], zero])])
    nonzero = em.add("Not", [em.add("Equal", [r, zero])])
    fix = em.add("And", [signs_differ, nonzero])
    em.add("Where", [fix, em.add("Add", [r, ins[1]]), r], outs)


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


def _bitcast(em, n, ins, outs):
    em.add("BitCast", ins, outs, to=onnx_elem_type(n.attrs["to"]))


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


def _attention(em, n, ins, outs):
    """attention as the decomposed pattern (Transpose, MatMul, Mul, Add, Softmax, MatMul);
    causal as an additive -inf constant above the diagonal."""
    q, k, v = n.inputs[:3]
    rank = len(q.shape)
    kt = em.add("Transpose", [ins[1]], perm=list(range(rank - 2)) + [rank - 1, rank - 2])
    s = em.add("MatMul", [ins[0], kt])
    dt = dtypes.to_numpy(q.dtype)
    s = em.add("Mul", [s, em.const(np.array(n.attrs["scale"], dt), "scale")])
    if len(ins) == 4:
        s = em.add("Add", [s, ins[3]])
    if n.attrs["causal"]:
        t, keys = q.shape[-2], k.shape[-2]
        causal = np.where(np.tril(np.ones((t, keys), bool)), 0.0, -np.inf).astype(dt)
        s = em.add("Add", [s, em.const(causal, "causal")])
    p = em.add("Softmax", [s], axis=-1)
    if not n.attrs["empty_rows_zero"]:
        return em.add("MatMul", [p, ins[2]], outs)
    y = em.add("MatMul", [p, ins[2]])  # an empty row's softmax is NaN: zeros instead
    em.add("Where", [em.add("IsNaN", [y]), em.const(np.array(0.0, dt), "zero"), y],
           outs)


def _scatter(em, n, ins, outs):
    """scatter as ScatterElements along the one axis of the flattened data (reduction:
    opset 16 for add and mul, 18 for max and min; onnxruntime applies the updates in order)."""
    data, indices = n.inputs[:2]
    flat = [data.type.size]
    d = em.add("Reshape", [ins[0], em.ints(flat, "shape")])
    i = ins[1] if indices.dtype == "i64" else em.add("Cast", [ins[1]], to=TensorProto.INT64)
    i = em.add("Reshape", [i, em.ints([-1], "shape")])
    u = em.add("Reshape", [ins[2], em.ints([-1], "shape")])
    red = n.attrs["reduction"]
    attrs = {"reduction": red} if red != "none" else {}
    y = em.add("ScatterElements", [d, i, u], axis=0, **attrs)
    em.add("Reshape", [y, em.ints(list(data.shape), "shape")], outs)


def _recurrence(em, n, ins, outs):
    """ONNX's LSTM/GRU/RNN (runtime/onnx_recurrence.py): on X with the projection
    absorbed where export_onnx found one, else on xw."""
    onnx_recurrence.export(em, n, ins, outs, em.projections.get(n))


def _window_attrs(n) -> dict:
    return {"strides": list(n.attrs["strides"]), "pads": list(n.attrs["pads"]),
            "dilations": list(n.attrs["dilations"])}


def _windowed(em, n, ins, outs, op_type: str, **attrs):
    """A conv/pool node; channels-last ones (layout pass) between two Transposes."""
    if n.attrs["layout"] != "NHWC":
        return em.add(op_type, ins, outs, **attrs)
    rank = len(n.inputs[0].shape)
    x = em.add("Transpose", [ins[0]], perm=[0, rank - 1] + list(range(1, rank - 1)))
    y = em.add(op_type, [x] + ins[1:], **attrs)
    em.add("Transpose", [y], outs, perm=[0] + list(range(2, rank)) + [1])


def _conv(em, n, ins, outs):
    _windowed(em, n, ins, outs, "Conv", group=n.attrs["group"], **_window_attrs(n))


def _max_pool(em, n, ins, outs):
    _windowed(em, n, ins, outs, "MaxPool", kernel_shape=list(n.attrs["kernel"]),
              **_window_attrs(n))


def _avg_pool(em, n, ins, outs):
    attrs = _window_attrs(n)
    if all(d == 1 for d in attrs["dilations"]):
        del attrs["dilations"]  # AveragePool takes dilations from opset 19 only
    _windowed(em, n, ins, outs, "AveragePool", kernel_shape=list(n.attrs["kernel"]),
              count_include_pad=int(n.attrs["count_include_pad"]), **attrs)


_EXPORTERS = facets.attach("onnx_export", {
    **{op: _unary for op in _UNARY},
    **{op: _binary for op in _BINARY},
    "bitand": _bool_bitwise, "bitor": _bool_bitwise, "bitxor": _bool_bitwise,
    "max": _max, "ne": _ne, "neg": _neg, "mod": _mod, "fmod": _fmod, "expm1": _expm1,
    "log1p": _log1p,
    "shl": _shift, "shr": _shift, "cast": _cast, "bitcast": _bitcast, "select": _select,
    **{op: _reduce for op in _REDUCE}, "argmax": _arg, "argmin": _arg,
    "reshape": _reshape, "transpose": _transpose, "broadcast": _broadcast, "slice": _slice,
    "concat": _concat, "pad": _pad, "gather": _gather, "scatter": _scatter,
    "matmul": _matmul, "attention": _attention, "recurrence": _recurrence, "conv": _conv,
    "max_pool": _max_pool, "avg_pool": _avg_pool,
})


def _export_node(em: _Emitter, n: Node, ins: list[str], outs: list[str]) -> None:
    """Emit one primitive node, in a carrier dtype where onnxruntime lacks its own."""
    try:
        exporter = _EXPORTERS[n.op]
    except KeyError:
        raise CompileError(f"{n.describe()}: no ONNX export for op {n.op}") from None
    c = carrier(n)
    if c is None:
        return exporter(em, n, ins, outs)
    view, old = retyped(n, c.dtype), data_dtype(n)
    args = [name if v is w else _carry_in(em, name, c)
            for name, v, w in zip(ins, n.inputs, view.inputs)]
    results = [name if o.dtype == w.dtype else em.fresh(name)
               for name, o, w in zip(outs, n.outputs, view.outputs)]
    exporter(em, view, args, results)
    for name, tmp in zip(outs, results):
        if tmp != name:
            _carry_out(em, tmp, name, c, old)


_SIGN_BIT = np.array(np.iinfo(np.int64).min, np.int64)


def _carry_in(em: _Emitter, name: str, c: Carrier) -> str:
    cast = em.add("Cast", [name], to=onnx_elem_type(c.dtype))
    return em.add("BitwiseXor", [cast, em.const(_SIGN_BIT, "sign_bit")]) if c.flip_sign else cast


def _carry_out(em: _Emitter, name: str, out: str, c: Carrier, dtype: str) -> None:
    if c.flip_sign:
        name = em.add("BitwiseXor", [name, em.const(_SIGN_BIT, "sign_bit")])
    em.add("Cast", [name], [out], to=onnx_elem_type(dtype))


# -- the opset ----------------------------------------------------------------

def _node_opset(n: Node) -> int:
    """The lowest default-domain opset at which `n` exports as the mapping writes it."""
    c = carrier(n)
    if n.op in ("shl", "shr") and n.inputs[0].dtype in dtypes.SIGNED:
        return 28  # BitShift takes signed integers from schema version 28
    if n.op == "bitcast":
        return 26  # BitCast is new in opset 26
    if (n.op in _BITWISE and n.inputs[0].dtype != "bool") or (c is not None and c.flip_sign):
        return 18
    if n.op == "pad" and n.attrs["mode"] == "wrap":
        return 19
    if n.op == "avg_pool" and any(d != 1 for d in n.attrs["dilations"]):
        return 19
    if n.op == "scatter" and n.attrs["reduction"] != "none":  # ScatterElements' reduction
        return 18 if n.attrs["reduction"] in ("max", "min") else 16
    return MIN_OPSET


def choose_opset(graph: Graph, payloads: dict, requested: int | None = None) -> int:
    """The default-domain opset: the host payloads' own (else `requested`, else BASE_OPSET),
    raised only as far as the primitive ops' mapping needs."""
    host = max((imp.version for fn in payloads.values() for imp in fn.opset_import
                if imp.domain in ("", "ai.onnx")), default=0)
    need = max((_node_opset(n) for n in graph.nodes if n.op not in ("host", "const")),
               default=0)
    return max(host or requested or BASE_OPSET, need)


# -- host nodes -------------------------------------------------------------

def _payload(n: Node) -> FunctionProto:
    fn = FunctionProto()
    fn.ParseFromString(n.attrs["payload"])
    return fn


def _merge_other_opsets(em: _Emitter, fn: FunctionProto) -> None:
    for imp in fn.opset_import:
        if imp.domain not in ("", "ai.onnx"):
            em.other_opsets[imp.domain] = max(em.other_opsets.get(imp.domain, 0), imp.version)


def _host(em: _Emitter, n: Node, fn: FunctionProto, ins: list[str], outs: list[str],
          defined: dict) -> None:
    """Re-create a host node: rename its direct inputs/outputs, alias captured names."""
    _merge_other_opsets(em, fn)
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

    The default-domain opset is the host payloads' (so old ops such as Scatter or
    Upsample stay valid), else `opset` (e.g. the source model's), else BASE_OPSET;
    raised where the primitive ops' mapping needs more (choose_opset).
    """
    payloads = {n: _payload(n) for n in graph.nodes if n.op == "host"}
    em = _Emitter(choose_opset(graph, payloads, opset))
    em.names.update(v.name for v in graph.values())
    defined: dict[str, str] = {v.name: v.name for v in graph.values()}
    pools = _global_average_pools(graph)
    absorbed = {p.inputs[0].producer for p in pools}
    em.projections = onnx_recurrence.projections(graph)
    absorbed |= {m for p in em.projections.values() for m in p.nodes}
    for n in graph.nodes:
        ins = [v.name for v in n.inputs]
        outs = [v.name for v in n.outputs]
        if n in absorbed:
            continue  # its one reader, a mean's division, writes GlobalAveragePool
        if n.op == "const":
            em.inits[outs[0]] = np.asarray(n.attrs["value"])
        elif n.op == "host":
            _host(em, n, payloads[n], ins, outs, defined)
        elif n in pools:
            em.add("GlobalAveragePool", [n.inputs[0].producer.inputs[0].name], outs)
        else:
            _export_node(em, n, ins, outs)
    out_names = _graph_outputs(em, graph, output_names)
    inputs = [helper.make_value_info(v.name, _value_type(em, v)) for v in graph.inputs]
    outputs = [helper.make_value_info(o, _value_type(em, v)) for o, v in
               zip(out_names, graph.outputs)]
    # built in place: copying a message (make_graph, make_model) fails beyond 2 GiB
    model = onnx.ModelProto(ir_version=_min_ir_version(em.opset), producer_name="braze")
    model.opset_import.add(domain="", version=em.opset)
    for d, v in sorted(em.other_opsets.items()):
        model.opset_import.add(domain=d, version=v)
    g = model.graph
    g.name = name
    g.node.extend(em.nodes)
    g.input.extend(inputs)
    g.output.extend(outputs)
    read = set(out_names)
    _reads(em.nodes, read)
    for init_name, array in em.inits.items():
        if init_name in read:  # a peephole may orphan one
            _fill_tensor(g.initializer.add(), init_name, array)
    return model


def _global_average_pools(graph: Graph) -> set[Node]:
    """div(reduce_sum(x, spatial axes, keepdims), count) nodes whose sum has no other
    reader: a GlobalAveragePool (as the importer decomposed it), written back as one."""
    users = graph.users()
    found = set()
    for n in graph.nodes:
        if n.op != "div" or n.outputs[0].dtype not in dtypes.FLOATS:
            continue
        r, c = (u.producer for u in n.inputs)
        if r is None or c is None or r.op != "reduce_sum" or c.op != "const":
            continue
        x = r.inputs[0]
        spatial = tuple(range(2, len(x.shape)))
        count = float(np.prod([x.shape[d] for d in spatial]))
        if (len(x.shape) >= 3 and tuple(r.attrs["axes"]) == spatial and r.attrs["keepdims"]
                and c.attrs["value"].size == 1 and float(c.attrs["value"].reshape(-1)[0]) == count
                and len(users.get(r.outputs[0], [])) == 1 and r.outputs[0] not in graph.outputs):
            found.add(n)
    return found


def _fill_tensor(t: onnx.TensorProto, name: str, array: np.ndarray) -> None:
    """Write `array` into `t` as raw little-endian bytes (strings through numpy_helper)."""
    if array.dtype == object or array.dtype.kind in "US":
        t.CopyFrom(numpy_helper.from_array(array, name))
        return
    t.name = name
    t.data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
    t.dims.extend(array.shape)
    t.raw_data = np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes()


def weight_bytes(graph: Graph) -> int:
    """Bytes of constant data in `graph` (what its exported model's initializers hold)."""
    return sum(n.attrs["value"].nbytes for n in graph.nodes if n.op == "const")


def _reads(nodes, read: set) -> None:
    """Every name the nodes read, their subgraphs' nodes included (outer-scope reads)."""
    for node in nodes:
        read.update(node.input)
        for attr in node.attribute:
            for g in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                _reads(g.node, read)
                read.update(o.name for o in g.output)


def _min_ir_version(opset: int) -> int:
    """The IR version that onnx pairs with a default-domain opset; at least 4, where
    initializers need not be listed as graph inputs."""
    for ir, op in ((10, 23), (9, 19), (8, 15), (7, 12), (6, 11), (5, 10)):
        if opset >= op:
            return ir
    return 4


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
    if name in em.inits:
        em.inits[new] = em.inits.pop(name)


# A serialized ModelProto must stay under protobuf's 2 GiB; larger host models go through
# a file with external data (margin left for the graph itself).
INLINE_MODEL_BYTES = 2**31 - 2**26


class OnnxHostStep:
    """One onnxruntime session running a braze sub-graph; created once, thread-safe.

    The session runs sequentially (inter-op 1) on `threads` intra-op threads that
    do not spin, since host steps alternate with braze's own kernels on the same
    cores; with `spin` (a model the host runs whole) they do, as in onnxruntime alone:
    a recurrent op's hundreds of small parallel sections each woke sleeping threads
    (a 2-layer LSTM, 256 wide, 128 steps: 5.35 ms a call against 3.26 ms in
    onnxruntime alone). `model` keeps the exported ONNX model for inspection (over 2 GiB, its
    weights went to onnxruntime through a file that is gone: the graph only).
    onnxruntime's errors become BrazeErrors: CompileError when the session cannot
    be made, HostOpError (naming the failing node) when a call fails.
    """

    def __init__(self, subgraph: Graph, threads: int = 2, opset: int | None = None,
                 spin: bool = False):
        self.model = export_onnx(subgraph, opset=opset)
        self.input_names = [v.name for v in subgraph.inputs]
        self.output_names = [o.name for o in self.model.graph.output]
        self._nodes = [n for n in subgraph.nodes if n.op != "const"]
        try:
            self.session = _session(self.model, _session_options(threads, spin),
                                    weight_bytes(subgraph) > INLINE_MODEL_BYTES)
        except Exception as e:  # onnxruntime raises its own types (Fail, NotImplemented...)
            raise CompileError(f"onnxruntime cannot run host step {where(e, self._nodes)}: "
                               f"{ort_message(e)}") from None
        self._run = _binding_run(self.session)

    def __call__(self, arrays: list) -> list:
        try:
            return self._run(self.output_names, dict(zip(self.input_names, arrays)))
        except Exception as e:  # onnxruntime's Fail, InvalidArgument, RuntimeException...
            raise host_op_error(f"onnxruntime failed running {where(e, self._nodes)}: "
                                f"{ort_message(e)}", e) from e


def _binding_run(session):
    """`run(output names, feed)` of onnxruntime's C++ binding where the installed version
    has one, else the public `InferenceSession.run`. The public one re-checks the feed's
    names in Python (about 1 us a call, 4% of a small LSTM's 26 us); braze's feed is made
    from the session's own input names, so the check never fails."""
    inner = getattr(session, "_sess", None)
    if not callable(getattr(inner, "run", None)):
        return session.run
    return lambda names, feed: inner.run(names, feed, None)


def _session_options(threads: int, spin: bool = False):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # 4 = fatal only: a failing node's error comes back as braze's one-line HostOpError,
    # so onnxruntime's own (coloured, multi-line) log of it would only repeat it on stderr
    opts.log_severity_level = 4
    # An intra-op pool left spinning after its call would steal the cores from the
    # braze kernel that runs next.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    return opts


def _session(model: onnx.ModelProto, opts, large: bool):
    """An InferenceSession for `model`; a `large` one (too large to serialize in one piece)
    goes through a temporary file with external data."""
    import onnxruntime as ort

    providers = ["CPUExecutionProvider"]
    if not large:
        return ort.InferenceSession(model.SerializeToString(), opts, providers=providers)
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory(prefix="braze-host-") as d:
        path = Path(d) / "host.onnx"
        save_onnx(model, path, external=True, in_place=True)  # no second copy of the weights
        return ort.InferenceSession(str(path), opts, providers=providers)


def save_onnx(model: onnx.ModelProto, path, external: bool | None = None,
              in_place: bool = False) -> None:
    """Write `model` to `path`; weights in one side file (`<name>.data`) when `external`
    (default: when the model is too large to serialize in one piece). With external data
    and `in_place`, `model` itself is left pointing at the side file; else it is unchanged."""
    from pathlib import Path

    path = Path(path)
    if external is None:
        external = _initializer_bytes(model) > INLINE_MODEL_BYTES
    if not external:
        onnx.save_model(model, str(path))
        return
    if not in_place:
        copy = onnx.ModelProto()
        copy.CopyFrom(model)  # saving with external data edits the model it is given
        model = copy
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=path.name + ".data", size_threshold=1024)


def _initializer_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the main graph's initializers, from their dims (reading the data copies it)."""
    total = 0
    for t in model.graph.initializer:
        itemsize = 1 if t.data_type == onnx.TensorProto.STRING else np.dtype(
            helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
        total += int(np.prod(t.dims, dtype=np.int64)) * itemsize
    return total
