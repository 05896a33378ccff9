"""import_onnx: structure of the decompositions, folding, host nodes, and numerics
against onnxruntime (float32: rtol 1e-4, atol 1e-5; integers and bools exact)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import FunctionProto, TensorProto, helper, numpy_helper

from compiler.interp import evaluate
from importers.onnx import import_onnx
from importers.onnx_ops import lookup
from tests.importers.onnx_node_cases import host_eval

RTOL, ATOL = 1e-4, 1e-5
F = TensorProto.FLOAT


def _vi(name, shape, elem=F):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _single(op, in_shapes, out_shape=None, opset=17, inits=(), n_out=1, **attrs):
    """A model of one node reading x0, x1.. (and initializers) and writing y0, y1.."""
    names = [f"x{i}" for i in range(len(in_shapes))] + [t.name for t in inits]
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, names, outs, name=f"{op.lower()}0", **attrs)
    inputs = [_vi(f"x{i}", s) for i, s in enumerate(in_shapes)]
    return _model([node], inputs, [helper.make_empty_tensor_value_info(o) for o in outs], inits,
                  opset)


def _run_both(model, feeds):
    """(onnxruntime outputs, braze import + interp outputs) and the import."""
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)
    imp = import_onnx(model, {k: v.shape for k, v in feeds.items()})
    got = evaluate(imp.graph, feeds, host_eval)
    return want, got, imp


def _check(model, feeds):
    want, got, imp = _run_both(model, feeds)
    for w, g in zip(want, got):
        assert w.shape == g.shape and w.dtype == g.dtype
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)
        else:
            np.testing.assert_array_equal(g, w)
    return imp


def _ops(imp):
    return [n.op for n in imp.graph.nodes if n.op != "const"]


rng = np.random.default_rng(0)


def _rand(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


# -- structure of the decompositions ------------------------------------------

def test_softmax_is_stable_primitives():
    imp = _check(_single("Softmax", [(2, 5)], axis=-1, opset=13), {"x0": _rand(2, 5) * 50})
    assert _ops(imp) == ["reduce_max", "sub", "exp", "reduce_sum", "div"]


def test_softmax_before_13_coerces_to_2d():
    imp = _check(_single("Softmax", [(2, 3, 4)], axis=1, opset=11), {"x0": _rand(2, 3, 4)})
    assert imp.graph.nodes[-1].op == "div"
    assert next(n for n in imp.graph.nodes if n.op == "reduce_max").attrs["axes"] == (1, 2)


def test_log_softmax():
    imp = _check(_single("LogSoftmax", [(3, 4)], opset=13), {"x0": _rand(3, 4)})
    assert "log" in _ops(imp)


def test_batch_norm_is_mul_add_of_channel_constants():
    c = 4
    inits = [_init("g", rng.uniform(0.5, 2, c).astype(np.float32)), _init("b", _rand(c)),
             _init("m", _rand(c)), _init("v", rng.uniform(0.5, 2, c).astype(np.float32))]
    imp = _check(_single("BatchNormalization", [(2, c, 3, 3)], inits=inits),
                 {"x0": _rand(2, c, 3, 3)})
    assert _ops(imp) == ["mul", "add"]
    mul, add = [n for n in imp.graph.nodes if n.op != "const"]
    assert mul.inputs[1].producer.op == "const" and mul.inputs[1].shape == (c, 1, 1)
    assert add.inputs[1].producer.op == "const" and add.inputs[1].shape == (c, 1, 1)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(approximate):
    imp = _check(_single("Gelu", [(3, 7)], opset=20, approximate=approximate),
                 {"x0": _rand(3, 7) * 3})
    assert ("tanh" in _ops(imp)) == (approximate == "tanh")
    assert ("erf" in _ops(imp)) == (approximate == "none")


def test_layer_norm():
    inits = [_init("s", _rand(6)), _init("b", _rand(6))]
    imp = _check(_single("LayerNormalization", [(2, 3, 6)], inits=inits, epsilon=1e-3),
                 {"x0": _rand(2, 3, 6)})
    assert "host" not in _ops(imp)


def test_shape_subgraph_folds_to_a_reshape():
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape: one reshape remains."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    inits = [_init("zero", np.array(0, np.int64)), _init("axes", np.array([0], np.int64)),
             _init("minus1", np.array([-1], np.int64))]
    model = _model(nodes, [_vi("x", [2, 3, 4])], [_vi("y", [2, 12])], inits, opset=13)
    imp = _check(model, {"x": _rand(2, 3, 4)})
    assert _ops(imp) == ["reshape"] and imp.graph.nodes[-1].attrs["shape"] == (2, 12)


def test_non_constant_shape_input_makes_a_host_node():
    model = _model([helper.make_node("Reshape", ["x", "s"], ["y"], name="r0")],
                   [_vi("x", [2, 3]), _vi("s", [2], TensorProto.INT64)], [_vi("y", None)])
    imp = import_onnx(model)
    (node,) = imp.graph.nodes
    assert node.op == "host" and node.attrs["reason"] == "its shape input is not a constant"
    assert node.outputs[0].shape == (None, None)


def test_data_dependent_output_forces_consumers_to_host():
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Neg", ["nz"], ["y"])]
    model = _model(nodes, [_vi("x", [4])], [_vi("y", None, TensorProto.INT64)])
    imp = _check(model, {"x": np.array([1, 0, 2, 0], np.float32)})
    nz, neg = imp.graph.nodes
    assert nz.outputs[0].shape == (1, None)
    assert neg.op == "host" and "data-dependent shape" in neg.attrs["reason"]


# -- versions ---------------------------------------------------------------

def test_converter_picked_by_schema_version_never_guessed():
    assert lookup("", "Add", 14)[0] is not None
    fn, reason = lookup("", "Add", 6)
    assert fn is None and reason == "no braze converter for Add version 6 (covers 7..28)"
    imp = import_onnx(_single("Add", [(2,), (2,)], opset=6))
    assert imp.graph.nodes[0].attrs["reason"].startswith("no braze converter for Add version 6")


def test_no_converter_gives_host_node_with_reason():
    node = helper.make_node("LinearClassifier", ["x0"], ["y0", "y1"], domain="ai.onnx.ml",
                            classlabels_ints=[0, 1, 2], coefficients=_rand(3, 4).ravel().tolist(),
                            intercepts=[0.1, -0.2, 0.3])
    g = helper.make_graph([node], "g", [_vi("x0", [5, 4])],
                          [helper.make_empty_tensor_value_info(o) for o in ("y0", "y1")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid("ai.onnx.ml", 1)])
    want, got, imp = _run_both(model, {"x0": _rand(5, 4)})
    (node,) = [n for n in imp.graph.nodes if n.op == "host"]
    assert node.attrs["reason"] == "no braze converter for ai.onnx.ml.LinearClassifier"
    assert [o.type for o in node.outputs] == [o.type for o in imp.graph.outputs]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w)


# -- host payload contract ----------------------------------------------------

def test_host_payload_is_a_one_node_function_with_outer_names():
    """If with a branch reading outer-scope 'x': inputs = own inputs, then captures."""
    then = helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "then", [], [_vi("t", None)])
    other = helper.make_graph([helper.make_node("Abs", ["x"], ["e"])], "else", [],
                              [_vi("e", None)])
    nodes = [helper.make_node("If", ["c"], ["y"], name="if0", then_branch=then,
                              else_branch=other)]
    model = _model(nodes, [_vi("c", [], TensorProto.BOOL), _vi("x", [3])], [_vi("y", [3])])
    imp = _check(model, {"c": np.array(True), "x": _rand(3)})
    (node,) = imp.graph.nodes
    fn = FunctionProto.FromString(node.attrs["payload"])
    assert list(fn.input) == ["c", "x"] and [v.name for v in node.inputs] == ["c", "x"]
    assert list(fn.output) == ["y"] and len(fn.node) == 1 and fn.node[0] == nodes[0]
    assert [(o.domain, o.version) for o in fn.opset_import] == [("", 17)]
    assert node.attrs["framework"] == "onnx" and node.attrs["op_type"] == "If"
    assert node.outputs[0].shape == (3,)


# -- inputs, initializers, names, external data -----------------------------

def test_old_ir_initializers_listed_as_inputs_are_constants():
    w = _rand(3, 3)
    model = _model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                   [_vi("x", [2, 3]), _vi("w", [3, 3])], [_vi("y", [2, 3])], [_init("w", w)],
                   opset=7)
    model.ir_version = 3
    imp = import_onnx(model)
    assert imp.input_names == ["x"] and [v.name for v in imp.graph.inputs] == ["x"]
    assert imp.graph.nodes[0].op == "const" and imp.graph.nodes[0].outputs[0].name == "w"
    x = _rand(2, 3)
    np.testing.assert_allclose(evaluate(imp.graph, [x])[0], x @ w, rtol=RTOL)


def test_names_are_kept():
    nodes = [helper.make_node("Relu", ["in.put"], ["mid"]), helper.make_node("Neg", ["mid"], ["o"]),
             helper.make_node("Identity", ["in.put"], ["o2"])]
    model = _model(nodes, [_vi("in.put", [2])], [_vi("o", [2]), _vi("o2", [2])])
    imp = import_onnx(model)
    assert imp.input_names == ["in.put"] and imp.graph.inputs[0].name == "in.put"
    assert imp.output_names == ["o", "o2"]
    assert [v.name for v in imp.graph.outputs] == ["o", "in.put"]
    assert "mid" in {o.name for n in imp.graph.nodes for o in n.outputs}
    assert imp.opset == 17 and imp.input_dtypes == ["f32"]


def test_external_data_model(tmp_path):
    w, b = _rand(8, 4), _rand(4)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])]
    model = _model(nodes, [_vi("x", [2, 8])], [_vi("y", [2, 4])], [_init("w", w), _init("b", b)])
    path = tmp_path / "ext.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    assert (tmp_path / "weights.bin").stat().st_size == (w.size + b.size) * 4
    imp = import_onnx(path)
    x = _rand(2, 8)
    np.testing.assert_allclose(evaluate(imp.graph, [x])[0], x @ w + b, rtol=RTOL, atol=ATOL)


def test_large_constant_of_shape_is_a_broadcast_not_a_literal():
    shape = _init("shape", np.array([1100, 1000], np.int64))
    imp = import_onnx(_single("ConstantOfShape", [], inits=[shape],
                              value=numpy_helper.from_array(np.array([2.0], np.float32))))
    assert _ops(imp) == ["broadcast"] and imp.graph.outputs[0].shape == (1100, 1000)


# -- numerics of the decompositions against onnxruntime ------------------------

def _i64(name, values):
    return _init(name, np.array(values, np.int64))


NUMERIC_CASES = {
    "conv_same_upper": (_single("Conv", [(1, 2, 7, 7), (3, 2, 3, 3)], auto_pad="SAME_UPPER",
                                strides=[2, 2]), [(1, 2, 7, 7), (3, 2, 3, 3)]),
    "conv_same_lower": (_single("Conv", [(1, 2, 6, 6), (4, 1, 2, 2)], auto_pad="SAME_LOWER",
                                group=2), [(1, 2, 6, 6), (4, 1, 2, 2)]),
    "maxpool_ceil": (_single("MaxPool", [(1, 1, 6, 6)], kernel_shape=[3, 3], strides=[2, 2],
                             ceil_mode=1, opset=12), [(1, 1, 6, 6)]),
    "avgpool_pads": (_single("AveragePool", [(1, 2, 5, 5)], kernel_shape=[3, 3],
                             pads=[1, 1, 1, 1], count_include_pad=0), [(1, 2, 5, 5)]),
    "global_avg": (_single("GlobalAveragePool", [(2, 3, 4, 4)]), [(2, 3, 4, 4)]),
    "matmul_1d_left": (_single("MatMul", [(4,), (2, 4, 3)]), [(4,), (2, 4, 3)]),
    "matmul_1d_right": (_single("MatMul", [(2, 3, 4), (4,)]), [(2, 3, 4), (4,)]),
    "gemm_trans": (_single("Gemm", [(4, 3), (5, 4), (5,)], transA=1, transB=1, alpha=0.5,
                           beta=2.0), [(4, 3), (5, 4), (5,)]),
    "slice_negative_step": (_single("Slice", [(5, 6)], inits=[_i64("s", [-1, 4]),
                                                           _i64("e", [-10, 0]),
                                                           _i64("a", [0, 1]),
                                                           _i64("st", [-2, -1])]), [(5, 6)]),
    "slice_v1_attrs": (_single("Slice", [(4, 5)], opset=9, starts=[1, -3], ends=[100, -1]),
                       [(4, 5)]),
    "pad_negative": (_single("Pad", [(4, 5)], inits=[_i64("p", [1, -1, -2, 2])],
                             mode="constant"), [(4, 5)]),
    "pad_reflect": (_single("Pad", [(4, 5)], inits=[_i64("p", [1, 2, 2, 1])], mode="reflect"),
                    [(4, 5)]),
    "pad_v2_edge": (_single("Pad", [(3, 4)], opset=10, pads=[0, 1, 2, 0], mode="edge"),
                    [(3, 4)]),
    "split_uneven": (_single("Split", [(7, 2)], opset=18, n_out=3, num_outputs=3), [(7, 2)]),
    "split_attr": (_single("Split", [(6,)], opset=11, n_out=2, split=[2, 4]), [(6,)]),
    "squeeze_v11": (_single("Squeeze", [(1, 3, 1)], opset=11, axes=[-1]), [(1, 3, 1)]),
    "unsqueeze_v13": (_single("Unsqueeze", [(3, 2)], inits=[_i64("a", [0, -1])]), [(3, 2)]),
    "tile": (_single("Tile", [(2, 3)], inits=[_i64("r", [2, 3])]), [(2, 3)]),
    "expand": (_single("Expand", [(3, 1)], inits=[_i64("s", [2, 1, 4])]), [(3, 1)]),
    "clip_v6": (_single("Clip", [(10,)], opset=6, min=-0.5, max=0.5), [(10,)]),
    "clip_v13": (_single("Clip", [(10,)], opset=13,
                         inits=[_init("lo", np.float32(-0.3)), _init("hi", np.float32(0.2))]),
                 [(10,)]),
    "reduce_l2_axes_input": (_single("ReduceL2", [(3, 4)], opset=18,
                                     inits=[_i64("a", [-1])], keepdims=0), [(3, 4)]),
    "reduce_log_sum_exp": (_single("ReduceLogSumExp", [(3, 4)], opset=13, axes=[0]), [(3, 4)]),
    "reduce_mean_all": (_single("ReduceMean", [(3, 4)], opset=13), [(3, 4)]),
    "argmax_last": (_single("ArgMax", [(3, 4)], axis=-1, select_last_index=1), [(3, 4)]),
    "hardswish": (_single("HardSwish", [(20,)], opset=14), [(20,)]),
    "softplus": (_single("Softplus", [(20,)]), [(20,)]),
    "selu": (_single("Selu", [(20,)]), [(20,)]),
    "prelu": (_single("PRelu", [(2, 3, 4)], inits=[_init("s", _rand(3, 1))]), [(2, 3, 4)]),
    "instance_norm": (_single("InstanceNormalization", [(2, 3, 5)],
                              inits=[_init("s", _rand(3)), _init("b", _rand(3))]), [(2, 3, 5)]),
    "flatten_neg": (_single("Flatten", [(2, 3, 4)], axis=-1, opset=13), [(2, 3, 4)]),
    "depth_to_space_crd": (_single("DepthToSpace", [(1, 8, 2, 3)], blocksize=2, mode="CRD"),
                           [(1, 8, 2, 3)]),
}


@pytest.mark.parametrize("name", sorted(NUMERIC_CASES))
def test_numerics_match_onnxruntime_with_no_host_node(name):
    model, shapes = NUMERIC_CASES[name]
    feeds = {f"x{i}": _rand(*s) * 2 for i, s in enumerate(shapes)}
    imp = _check(model, feeds)
    assert "host" not in _ops(imp), [n.attrs["reason"] for n in imp.graph.nodes if n.op == "host"]


def test_mixed_type_pow_and_integer_mod():
    nodes = [helper.make_node("Pow", ["a", "b"], ["p"]),
             helper.make_node("Mod", ["i", "j"], ["m"])]
    model = _model(nodes, [_vi("a", [3]), _vi("b", [3], TensorProto.INT64),
                           _vi("i", [4], TensorProto.INT32), _vi("j", [4], TensorProto.INT32)],
                   [_vi("p", [3]), _vi("m", [4], TensorProto.INT32)], opset=15)
    imp = _check(model, {"a": np.array([1.5, 2, 3], np.float32), "b": np.array([2, 3, -1]),
                         "i": np.array([7, -7, 7, -7], np.int32),
                         "j": np.array([3, 3, -3, -3], np.int32)})
    assert "host" not in _ops(imp)
