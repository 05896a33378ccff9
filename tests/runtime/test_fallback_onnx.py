"""IR -> ONNX export: every primitive op, in every dtype the IR allows it (bf16 aside: numpy
has no bfloat16), runs on onnxruntime as compiler.interp computes it."""

import numpy as np
import onnx
import pytest
from onnx import helper

from compiler import dtypes
from compiler.interp import evaluate
from compiler.ir import Graph, Node, TensorType
from compiler.ops import facets
from compiler.ops.elementwise import BINARY, UNARY
from runtime.fallback_onnx import MIN_OPSET, OnnxHostStep, choose_opset, export_onnx
from runtime.onnx_carriers import carrier
from tests.tolerances import assert_close

RNG = np.random.default_rng(0)
SCALARS = sorted(dtypes.SCALARS - {"bf16"})
NUMERIC = sorted(dtypes.NUMERIC - {"bf16"})
FLOATS = ["f16", "f32", "f64"]

# Input domains: "full" spans an integer type's whole range (wrapping, sign bits, u64 order);
# "small" makes ties and equal elements likely; the rest keep ops inside their domain.
_POSITIVE = {"log", "sqrt", "reciprocal", "log1p", "pow", "shl", "shr"}
_NONZERO = {"div", "mod", "fmod"}
_UNIT = {"asin", "acos", "atanh"}
# Integer sums, products and matmuls stay small: onnxruntime's saturate where numpy wraps.
_SMALL = {"eq", "ne", "lt", "le", "gt", "ge", "max", "min", "matmul", "max_pool", "cast",
          "reduce_sum", "reduce_prod"}


def _data(dtype: str, shape, domain: str = "full"):
    np_dtype = dtypes.to_numpy(dtype)
    if dtype == "bool":
        return RNG.integers(0, 2, shape).astype(bool)
    if np_dtype.kind in "iu":
        info = np.iinfo(np_dtype)
        lo, hi = {"full": (info.min, info.max), "positive": (1, 3), "nonzero": (-3, 3),
                  "small": (-3, 3), "unit": (-3, 3)}[domain]
        x = RNG.integers(max(lo, info.min), hi, shape, endpoint=True, dtype=np_dtype)
        return np.where(x == 0, np_dtype.type(1), x) if domain == "nonzero" else x
    if domain == "positive":
        return RNG.uniform(0.2, 0.9, shape).astype(np_dtype)
    if domain == "nonzero":
        return (RNG.uniform(0.5, 3, shape) * RNG.choice([-1, 1], shape)).astype(np_dtype)
    if domain == "small":
        return (RNG.integers(-2, 3, shape) / 2).astype(np_dtype)
    return RNG.uniform(-0.9, 0.9, shape).astype(np_dtype) * (1 if domain == "unit" else 3)


def _domain(op: str) -> str:
    for ops, name in ((_POSITIVE, "positive"), (_NONZERO, "nonzero"), (_UNIT, "unit"),
                      (_SMALL, "small")):
        if op in ops:
            return name
    return "full"


def _cumsum(node, args):
    """host_eval for the test's host nodes (ONNX CumSum along axis 0)."""
    return [np.cumsum(args[0], axis=0).astype(args[0].dtype)]


def _check(build, specs, domain="full", opset=None):
    """Build a graph over inputs `specs` [(dtype, shape)], export, run on onnxruntime."""
    g = Graph()
    ins = [g.add_input(f"in{i}", TensorType(d, s)) for i, (d, s) in enumerate(specs)]
    g.outputs = [build(g, *ins)]
    arrays = [_data(d, s, domain) for d, s in specs]
    model = export_onnx(g, opset=opset)
    onnx.checker.check_model(model, full_check=True)
    got = OnnxHostStep(g, threads=1, opset=opset)(arrays)[0]
    want = evaluate(g, arrays, _cumsum)[0]
    # a node computed in a narrower carrier (f64 as f32) is held to the carrier's tolerance
    c = carrier(g.outputs[0].producer)
    assert_close(got, want, c.dtype if c is not None and c.dtype in FLOATS else None)
    return model


def _one(dtype: str, shape=()):
    return np.ones(shape, dtypes.to_numpy(dtype))


def _cases(table):
    """Every op and dtype the ONNX export writes (not the ops with a stated reason to have
    no export: compiler/ops/facets.py STATED)."""
    return [(op, d) for op, (allowed, _, _) in sorted(table.items())
            if (op, "onnx_export") not in facets.STATED
            for d in sorted(allowed) if d != "bf16"]


@pytest.mark.parametrize("op,dtype", _cases(UNARY))
def test_unary(op, dtype):
    if op == "acosh":  # defined from 1 up
        _check(lambda g, x: g.op(op, g.op("add", x, g.const(_one(x.dtype)))),
                      [(dtype, (3, 4))], "positive")
    else:
        _check(lambda g, x: g.op(op, x), [(dtype, (3, 4))], _domain(op))


@pytest.mark.parametrize("op,dtype", _cases(BINARY))
def test_binary_broadcasting(op, dtype):
    _check(lambda g, a, b: g.op(op, a, b), [(dtype, (3, 4)), (dtype, (4,))], _domain(op))


def _reduce(op):
    return lambda g, x: g.op(op, x, axes=(1,), keepdims=False)


_SQUARE = {"strides": (1, 1), "pads": (1, 0, 0, 1), "dilations": (1, 1)}
_BY_DTYPE = {
    "reduce_sum": (NUMERIC, _reduce("reduce_sum")),
    "reduce_prod": (NUMERIC, _reduce("reduce_prod")),
    "reduce_max": (NUMERIC, _reduce("reduce_max")),
    "reduce_min": (NUMERIC, _reduce("reduce_min")),
    "argmax": (NUMERIC, lambda g, x: g.op("argmax", x, axis=1, keepdims=False)),
    "argmin": (NUMERIC, lambda g, x: g.op("argmin", x, axis=0, select_last=True)),
    "reshape": (SCALARS, lambda g, x: g.op("reshape", x, shape=(4, 3))),
    "transpose": (SCALARS, lambda g, x: g.op("transpose", x, perm=(1, 0))),
    "broadcast": (SCALARS, lambda g, x: g.op("broadcast", x, shape=(2, 3, 4))),
    "slice": (SCALARS, lambda g, x: g.op("slice", x, starts=(2, 1), steps=(-1, 2),
                                         sizes=(2, 2))),
    "concat": (SCALARS, lambda g, x: g.op("concat", x, x, axis=1)),
    "pad": (SCALARS, lambda g, x: g.op("pad", x, pads=(1, 0, 0, 2), value=1.0)),
    "pad_reflect": (SCALARS, lambda g, x: g.op("pad", x, pads=(1, 0, 0, 2), mode="reflect")),
    "pad_edge": (SCALARS, lambda g, x: g.op("pad", x, pads=(1, 0, 0, 2), mode="edge")),
    "pad_wrap": (SCALARS, lambda g, x: g.op("pad", x, pads=(1, 0, 0, 2), mode="wrap")),
    "gather": (SCALARS, lambda g, x: g.op("gather", x, g.const(np.array([2, 0, 2])), axis=1)),
    "select": (SCALARS, lambda g, x: g.op("select", g.const(np.array([True, False] * 2)),
                                          x, g.op("neg", x) if x.dtype in dtypes.SIGNED
                                          else g.op("reshape", x, shape=(3, 4)))),
    "matmul": (NUMERIC, lambda g, x: g.op("matmul", x, g.op("transpose", x, perm=(1, 0)))),
    "max_pool": (NUMERIC, lambda g, x: g.op("max_pool", g.op("reshape", x, shape=(1, 1, 3, 4)),
                                            kernel=(2, 2), **_SQUARE)),
    "conv": (FLOATS, lambda g, x: g.op("conv", g.op("reshape", x, shape=(1, 1, 3, 4)),
                                       g.const(_one(x.dtype, (2, 1, 2, 2))), **_SQUARE,
                                       group=1)),
    "avg_pool": (FLOATS, lambda g, x: g.op("avg_pool", g.op("reshape", x, shape=(1, 1, 3, 4)),
                                           kernel=(2, 2), count_include_pad=False, **_SQUARE)),
}


@pytest.mark.parametrize("case,dtype", [(c, d) for c, (ds, _) in _BY_DTYPE.items() for d in ds])
def test_every_dtype(case, dtype):
    _check(_BY_DTYPE[case][1], [(dtype, (3, 4))], _domain(case))


@pytest.mark.parametrize("src", SCALARS)
def test_cast_to_every_dtype(src):
    for dst in SCALARS:
        unsigned = dst in dtypes.UNSIGNED and src in FLOATS  # negative float -> unsigned: UB
        _check(lambda g, x, dst=dst: g.op("cast", x, to=dst), [(src, (3, 4))],
               "positive" if unsigned else _domain("cast"))


def test_u64_order_survives_the_signed_carrier():
    g = Graph()
    x = g.add_input("x", TensorType("u64", (4,)))
    g.outputs = [g.op("reduce_max", x, axes=(0,)), g.op("argmin", x, axis=0)]
    arrays = [np.array([2**63 + 5, 7, 2**64 - 1, 2**63], np.uint64)]
    got = OnnxHostStep(g, threads=1)(arrays)
    assert got[0] == 2**64 - 1 and got[1] == 1


@pytest.mark.parametrize("build,specs", [
    (lambda g, x: g.op("reduce_max", x, axes=(0, 2), keepdims=True), [("f32", (3, 4, 5))]),
    (lambda g, x: g.op("reduce_sum", x, axes=(), keepdims=True), [("f32", (3, 4))]),
    (lambda g, c, a, b: g.op("select", c, a, b),
     [("bool", (3, 1)), ("f32", (3, 4)), ("f32", (4,))]),
    (lambda g, x: g.op("slice", x, starts=(0, 0), steps=(1, 1), sizes=(0, 4)),
     [("f32", (3, 4))]),
    (lambda g, x: g.op("slice", x, starts=(2, 3), steps=(-1, -2), sizes=(3, 2)),
     [("f32", (3, 4))]),
    (lambda g, a, b: g.op("concat", a, b, axis=1), [("f32", (2, 3)), ("f32", (2, 1))]),
    (lambda g, x, i: g.op("gather", x, i, axis=1), [("f32", (3, 4)), ("i64", (2, 2))]),
    (lambda g, a, b: g.op("matmul", a, b), [("f32", (2, 3, 4)), ("f32", (4, 5))]),
    (lambda g, x, w: g.op("conv", x, w, strides=(2, 1), pads=(1, 1, 0, 1), dilations=(1, 1),
                          group=2), [("f32", (1, 4, 5, 5)), ("f32", (6, 2, 3, 3))]),
    (lambda g, x, w, b: g.op("conv", x, w, b, strides=(1, 1), pads=(0, 0, 0, 0),
                             dilations=(2, 2), group=1),
     [("f32", (1, 2, 6, 6)), ("f32", (3, 2, 2, 2)), ("f32", (3,))]),
    (lambda g, x: g.op("max_pool", x, kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1),
                       dilations=(1, 1)), [("f32", (1, 2, 6, 6))]),
    (lambda g, x: g.op("avg_pool", x, kernel=(2, 2), strides=(1, 1), pads=(0, 0, 1, 1),
                       dilations=(2, 2), count_include_pad=True), [("f32", (1, 2, 5, 5))]),
])
def test_other_shapes_and_attributes(build, specs):
    _check(build, specs, "positive")


def test_gather_indices_i32_and_negative():
    _check(lambda g, x: g.op("gather", x, g.const(np.array([[-1, 0]], np.int32)), axis=0),
           [("f32", (3, 4))])


def test_relu_peephole_and_output_names():
    g = Graph()
    x = g.add_input("x", TensorType("f32", (4,)))
    g.outputs = [g.op("max", x, g.const(np.float32(0), "zero")), x]
    model = export_onnx(g, output_names=["relu_out", "same_x"])
    assert [n.op_type for n in model.graph.node] == ["Relu", "Identity"]
    assert [o.name for o in model.graph.output] == ["relu_out", "same_x"]
    assert not model.graph.initializer  # the orphaned zero is pruned


def test_mean_over_spatial_dims_is_written_as_global_average_pool():
    g = Graph()
    x = g.add_input("x", TensorType("f32", (2, 3, 4, 5)))
    s = g.op("reduce_sum", x, axes=(2, 3), keepdims=True)
    g.outputs = [g.op("div", s, g.const(np.float32(20), "count"))]
    model = export_onnx(g)
    assert [n.op_type for n in model.graph.node] == ["GlobalAveragePool"]
    xv = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
    got = OnnxHostStep(g, threads=1)([xv])[0]
    assert_close(got, xv.mean(axis=(2, 3), keepdims=True))
    other = Graph()  # a sum read elsewhere too stays a ReduceSum and a Div
    x = other.add_input("x", TensorType("f32", (2, 3, 4, 5)))
    s = other.op("reduce_sum", x, axes=(2, 3), keepdims=True)
    other.outputs = [other.op("div", s, other.const(np.float32(20), "count")), s]
    assert "GlobalAveragePool" not in [n.op_type for n in export_onnx(other).graph.node]


# -- opsets and host nodes ------------------------------------------------------------------

def _host_node(g: Graph, x, op_type="CumSum", opset=14, captured=()):
    """A host node wrapping ONNX `op_type`(x, axis=0) as importers/onnx.py writes one."""
    axis = g.const(np.array(0, np.int64), "axis")
    node = helper.make_node(op_type, ["orig_x", "orig_axis"], ["orig_y"])
    fn = helper.make_function("braze.host", op_type, ["orig_x", "orig_axis", *captured],
                              ["orig_y"], [node], [helper.make_opsetid("", opset)])
    return g.add_node("host", [x, axis], {
        "framework": "onnx", "domain": "", "op_type": op_type, "reason": "test",
        "payload": fn.SerializeToString()}, name="host0", out_types=[x.type]).output


def test_host_payload_opset_is_kept_where_the_mapping_is_valid():
    g = Graph()
    x = g.add_input("x", TensorType("f32", (5,)))
    g.outputs = [g.op("exp", _host_node(g, x, opset=15))]
    model = _check(lambda g_, x_: g_.op("exp", _host_node(g_, x_, opset=15)), [("f32", (5,))])
    assert model.opset_import[0].version == 15
    assert export_onnx(g, opset=20).opset_import[0].version == 15


def test_opset_is_raised_only_as_far_as_the_mapping_needs():
    g = Graph()
    x = g.add_input("x", TensorType("i32", (3, 4)))
    r = g.op("reduce_max", x, axes=(1,))  # its ONNX form changes at 18: chosen before emitting
    g.outputs = [g.op("bitand", r, r)]
    assert choose_opset(g, {}, 15) == 18
    model = _check(lambda g_, x_: g_.op("bitand", *[g_.op("reduce_max", x_, axes=(1,))] * 2),
                   [("i32", (3, 4))], opset=15)
    assert model.opset_import[0].version == 18
    g2 = Graph()
    y = g2.add_input("y", TensorType("f32", (3,)))
    g2.outputs = [g2.op("exp", y)]
    assert choose_opset(g2, {}, 11) == MIN_OPSET and choose_opset(g2, {}) == 17
    _check(lambda g_, y_: g_.op("exp", y_), [("f32", (3,))], opset=11)


def test_host_node_alone_keeps_an_old_opset():
    g = Graph()
    x = g.add_input("x", TensorType("f32", (5,)))
    g.outputs = [_host_node(g, x, opset=11)]
    model = export_onnx(g, opset=17)
    assert model.opset_import[0].version == 11
    x_val = RNG.standard_normal(5).astype(np.float32)
    np.testing.assert_allclose(OnnxHostStep(g, threads=1)([x_val])[0], np.cumsum(x_val),
                               rtol=1e-6)


def test_old_opset_model_with_initializers_is_valid():
    """IR version 3 (opsets below 9) would want every initializer listed as a graph input."""
    g = Graph()
    x = g.add_input("x", TensorType("f32", (3,)))
    c = g.const(np.arange(3, dtype=np.float32), "c")
    node = helper.make_node("Add", ["orig_x", "orig_c"], ["orig_y"])
    fn = helper.make_function("braze.host", "Add", ["orig_x", "orig_c"], ["orig_y"], [node],
                              [helper.make_opsetid("", 7)])
    g.outputs = [g.add_node("host", [x, c], {
        "framework": "onnx", "op_type": "Add", "payload": fn.SerializeToString()},
        out_types=[x.type]).output]
    model = export_onnx(g)
    assert model.opset_import[0].version == 7 and model.ir_version >= 4
    onnx.checker.check_model(model, full_check=True)
    np.testing.assert_array_equal(OnnxHostStep(g, threads=1)([np.ones(3, np.float32)])[0],
                                  [1, 2, 3])


def test_captured_outer_scope_name_gets_an_identity():
    g = Graph()
    x = g.add_input("x", TensorType("f32", (5,)))
    w = g.add_input("w", TensorType("f32", (5,)))
    axis = g.const(np.array(0, np.int64), "axis")
    then = helper.make_graph([helper.make_node("Add", ["orig_x", "orig_w"], ["t"])], "then",
                             [], [helper.make_tensor_value_info("t", onnx.TensorProto.FLOAT, [5])])
    other = helper.make_graph([helper.make_node("Identity", ["orig_x"], ["e"])], "else",
                              [], [helper.make_tensor_value_info("e", onnx.TensorProto.FLOAT, [5])])
    cond = g.op("gt", g.op("reduce_sum", axis, axes=()), g.const(np.array(-1, np.int64)))
    node = helper.make_node("If", ["orig_c"], ["orig_y"], then_branch=then, else_branch=other)
    fn = helper.make_function("braze.host", "If", ["orig_c", "orig_x", "orig_w"], ["orig_y"],
                              [node], [helper.make_opsetid("", 17)])
    g.outputs = [g.add_node("host", [cond, x, w], {
        "framework": "onnx", "domain": "", "op_type": "If", "reason": "test",
        "payload": fn.SerializeToString()}, name="if0", out_types=[x.type]).output]
    model = export_onnx(g)
    onnx.checker.check_model(model, full_check=True)
    aliases = [n.output[0] for n in model.graph.node
               if n.op_type == "Identity" and n.output[0].startswith("orig_")]
    assert sorted(aliases) == ["orig_w", "orig_x"]
    a, b = RNG.standard_normal((2, 5)).astype(np.float32)
    np.testing.assert_allclose(OnnxHostStep(g, threads=1)([a, b])[0], a + b, rtol=1e-6)


def test_unknown_op_is_a_compile_error():
    from compiler.errors import CompileError
    from runtime.fallback_onnx import _export_node

    n = Node("nosuch", [], {}, "n0")
    with pytest.raises(CompileError, match="no ONNX export for op nosuch"):
        _export_node(None, n, [], [])


# -- saving and large models ----------------------------------------------------------------

def _gather_last(n: int) -> tuple[Graph, np.ndarray]:
    """y = w[n - 1] + x over a constant w of n float32 (w[n - 1] = 3, else 0)."""
    w = np.zeros(n, np.float32)
    w[-1] = 3
    g = Graph()
    x = g.add_input("x", TensorType("f32", (1,)))
    last = g.op("gather", g.const(w, "w"), g.const(np.array([n - 1])), axis=0)
    g.outputs = [g.op("add", last, x)]
    return g, w


def test_save_with_external_data_leaves_the_model_unchanged(tmp_path):
    from runtime.fallback_onnx import save_onnx

    g, _ = _gather_last(4096)
    model = export_onnx(g)
    before = model.SerializeToString()
    save_onnx(model, tmp_path / "m.onnx", external=True)
    assert model.SerializeToString() == before
    assert (tmp_path / "m.onnx.data").stat().st_size == 4096 * 4
    import onnxruntime as ort

    sess = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    assert sess.run(None, {"x": np.ones(1, np.float32)})[0] == 4


@pytest.mark.slow
def test_model_over_2gib_runs_and_saves(tmp_path):
    """Over protobuf's 2 GiB: host sessions and save_onnx go through external data."""
    from runtime.fallback_onnx import INLINE_MODEL_BYTES, save_onnx

    n = INLINE_MODEL_BYTES // 4 + 2**24
    g, w = _gather_last(n)
    assert OnnxHostStep(g, threads=1)([np.ones(1, np.float32)])[0] == 4
    model = export_onnx(g)
    save_onnx(model, tmp_path / "big.onnx")
    assert (tmp_path / "big.onnx.data").stat().st_size >= w.nbytes
    import onnxruntime as ort

    sess = ort.InferenceSession(str(tmp_path / "big.onnx"), providers=["CPUExecutionProvider"])
    assert sess.run(None, {"x": np.ones(1, np.float32)})[0] == 4
