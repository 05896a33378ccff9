"""What onnxruntime refuses, braze refuses at import with InvalidModelError naming the
node (importers/onnx_validate.py and the converters' own checks); what onnxruntime
runs, braze runs with the same answer. Each bad case first checks that onnxruntime
really refuses it, so the expectation cannot drift from the reference."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import bridge
from compiler.errors import BrazeError, InvalidModelError

F = T.FLOAT


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(*i) for i in inputs],
                          [helper.make_tensor_value_info(*o) for o in outputs],
                          [numpy_helper.from_array(a, n) for n, a in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _feeds(m):
    inits = {t.name for t in m.graph.initializer}
    rng = np.random.default_rng(0)
    out = {}
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dt = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        shape = [max(d.dim_value, 1) for d in tt.shape.dim]
        out[vi.name] = (rng.standard_normal(shape) * 3).astype(dt)
    return out


def _ort(m):
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    s = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return s.run(None, _feeds(m))


POOL_X = ("x", F, [1, 1, 6, 6])
W = np.ones((2, 1, 3, 3), np.float32)
BAD = {
    "maxpool_zero_kernel": (_model([helper.make_node("MaxPool", ["x"], ["y"], name="p0",
                                                     kernel_shape=[0, 0])],
                                   [POOL_X], [("y", F, None)]), ["p0", "kernel_shape"]),
    "maxpool_no_kernel": (_model([helper.make_node("MaxPool", ["x"], ["y"], name="p0")],
                                 [POOL_X], [("y", F, None)]), ["p0", "kernel_shape"]),
    "avgpool_negative_stride": (_model([helper.make_node(
        "AveragePool", ["x"], ["y"], name="p0", kernel_shape=[2, 2], strides=[-1, 1])],
        [POOL_X], [("y", F, None)]), ["p0", "strides"]),
    "conv_zero_dilation": (_model([helper.make_node("Conv", ["x", "w"], ["y"], name="c0",
                                                    dilations=[0, 1])],
                                  [POOL_X], [("y", F, None)], [("w", W)]), ["c0", "dilations"]),
    "conv_channels": (_model([helper.make_node("Conv", ["x", "w"], ["y"], name="c0")],
                             [("x", F, [1, 3, 6, 6])], [("y", F, None)], [("w", W)]),
                      ["c0", "channels"]),
    "window_too_large": (_model([helper.make_node("MaxPool", ["x"], ["y"], name="p0",
                                                  kernel_shape=[9, 9])],
                                [POOL_X], [("y", F, None)]), ["p0", "larger"]),
    "int_div_const_zero": (_model([helper.make_node("Div", ["a", "k"], ["y"], name="d0")],
                                  [("a", T.INT32, [3])], [("y", T.INT32, [3])],
                                  [("k", np.array([1, 0, 2], np.int32))]), ["d0", "zero"]),
    "int_mod_const_zero": (_model([helper.make_node("Mod", ["a", "k"], ["y"], name="d0")],
                                  [("a", T.INT64, [3])], [("y", T.INT64, [3])],
                                  [("k", np.array([0, 0, 2], np.int64))]), ["d0", "zero"]),
    "unknown_attribute": (_model([helper.make_node("Relu", ["x"], ["y"], name="r0", axis=1)],
                                 [("x", F, [2, 3])], [("y", F, None)]), ["r0", "axis"]),
    "mixed_types": (_model([helper.make_node("Add", ["x", "b"], ["y"], name="a0")],
                           [("x", F, [2, 3])], [("y", F, None)],
                           [("b", np.ones(3, np.float64))]), ["a0", "double"]),
    "flatten_axis": (_model([helper.make_node("Flatten", ["x"], ["y"], name="f0", axis=-3)],
                            [("x", F, [2, 3])], [("y", F, None)]), ["f0", "axis"]),
    "transpose_perm": (_model([helper.make_node("Transpose", ["x"], ["y"], name="t0",
                                                perm=[0])],
                              [("x", F, [2, 3])], [("y", F, None)]), ["t0", "perm"]),
    "gemm_bias": (_model([helper.make_node("Gemm", ["x", "w", "c"], ["y"], name="g0")],
                         [("x", F, [2, 3])], [("y", F, None)],
                         [("w", np.ones((3, 4), np.float32)), ("c", np.ones(3, np.float32))]),
                  ["g0", "broadcast"]),
    "reshape_size": (_model([helper.make_node("Reshape", ["x", "s"], ["y"], name="r0")],
                            [("x", F, [2, 3])], [("y", F, None)],
                            [("s", np.array([4, 2], np.int64))]), ["r0", "reshape"]),
    "output_type": (_model([helper.make_node("Relu", ["x"], ["y"], name="r0")],
                           [("x", F, [2, 3])], [("y", T.INT32, [2, 3])]), ["'y'", "INT32"]),
    "avgpool_pad_not_under_kernel": (_model([helper.make_node(
        "AveragePool", ["x"], ["y"], name="p0", kernel_shape=[3, 3], pads=[1, 1, 3, 1])],
        [POOL_X], [("y", F, None)]), ["p0", "pads"]),
    # an input the schema fixes to one type (axes: tensor(int64)) given another
    "unsqueeze_axes_double": (_model([helper.make_node("Unsqueeze", ["x", "ax"], ["y"],
                                                       name="u0")],
                                     [("x", F, [2, 3])], [("y", F, None)],
                                     [("ax", np.array([0.0]))]), ["u0", "double"]),
    "reducesum_axes_float": (_model([helper.make_node("ReduceSum", ["x", "ax"], ["y"],
                                                      name="s0")],
                                    [("x", F, [2, 3])], [("y", F, None)],
                                    [("ax", np.array([1.0], np.float32))]), ["s0", "float"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_onnxruntime_and_braze_both_refuse(case):
    model, words = BAD[case]
    with pytest.raises(Exception):  # noqa: B017 - onnxruntime's classes vary by case
        _ort(model)
    with pytest.raises(InvalidModelError) as info:
        bridge.compile_onnx(model)(**_feeds(model))
    message = str(info.value)
    assert "\n" not in message
    for w in words:
        assert w.lower() in message.lower(), (w, message)


def test_flags_outside_zero_and_one_are_refused():
    """keepdims=-1: the spec allows 0 or 1; onnxruntime reads -1 as 0 where a truthy
    reading gives 1, so braze refuses rather than pick one."""
    m = _model([helper.make_node("ReduceMax", ["x"], ["y"], name="r0", keepdims=-1)],
               [("x", F, [2, 3])], [("y", F, None)])
    assert _ort(m)[0].shape == ()  # onnxruntime: keepdims off
    with pytest.raises(InvalidModelError, match='"r0".*keepdims is -1'):
        bridge.compile_onnx(m)(**_feeds(m))


def test_python_errors_in_a_converter_become_braze_errors(monkeypatch):
    """A converter tripping over a node raises InvalidModelError naming the node, with the
    original exception as its cause."""
    import importers.onnx as onnx_importer

    m = _model([helper.make_node("Relu", ["x"], ["y"], name="r0")],
               [("x", F, [2, 3])], [("y", F, [2, 3])])

    def broken(cx):
        raise TypeError("'NoneType' object is not iterable")

    monkeypatch.setattr(onnx_importer, "lookup", lambda domain, op, version: (broken, ""))
    with pytest.raises(InvalidModelError, match='node "r0" \\(Relu\\).*TypeError') as info:
        bridge.compile_onnx(m)(**_feeds(m))
    assert isinstance(info.value.__cause__, TypeError)


def test_node_name_that_is_not_utf8_still_runs():
    """onnxruntime accepts a node name protobuf cannot decode; braze answers the same."""
    m = _model([helper.make_node("Relu", ["x"], ["y"], name="r0")], [("x", F, [2, 3])],
               [("y", F, [2, 3])])
    data = m.SerializeToString().replace(b"r0", b"\xbc0", 1)
    bad = onnx.ModelProto()
    bad.ParseFromString(data)
    assert isinstance(bad.graph.node[0].name, bytes)
    feeds = _feeds(bad)
    np.testing.assert_array_equal(bridge.compile_onnx(data)(**feeds)[0], _ort(bad)[0])


@pytest.mark.parametrize("divisor", [np.array([3, 5, 7], np.int32)])
def test_valid_integer_division_still_matches(divisor):
    m = _model([helper.make_node("Div", ["a", "k"], ["q"], name="d0"),
                helper.make_node("Mod", ["a", "k"], ["y"], name="m0")],
               [("a", T.INT32, [3])], [("q", T.INT32, [3]), ("y", T.INT32, [3])],
               [("k", divisor)])
    a = np.array([-7, 8, 100], np.int32)
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for got, want in zip(bridge.compile_onnx(m)(a), s.run(None, {"a": a})):
        np.testing.assert_array_equal(got, want)


def test_every_import_error_is_a_braze_error():
    assert issubclass(InvalidModelError, BrazeError)
