"""Einsum diagonals, bool and empty-set ReduceMax/Min/LogSumExp, BitCast, Det,
BatchNormalization in training mode, DynamicQuantizeLinear, Compress with a constant
condition and CausalConvWithState: imported with no host node, compiled with
allow_fallback=False, and compared with onnxruntime (float32 rtol 1e-4 / atol 1e-5,
float64 1e-9; integers, bools and quantized bytes exact)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import bridge
from importers.onnx import import_onnx
from importers.onnx_ops.linalg import DET_MAX_N
from importers.onnx_types import elem_of_dtype
from compiler import dtypes

RNG = np.random.default_rng(0)
TOL = {np.dtype(np.float32): (1e-4, 1e-5), np.dtype(np.float64): (1e-9, 1e-12)}


def _model(op, feeds: dict, n_out=1, opset=17, inits=None, **attrs):
    """One `op` node reading the feeds (graph inputs) and the initializers, in order."""
    inits = inits or {}
    node = helper.make_node(op, list(feeds) + list(inits), [f"y{i}" for i in range(n_out)],
                            **attrs)
    inputs = [helper.make_tensor_value_info(n, elem_of_dtype(dtypes.from_numpy(a.dtype)),
                                            list(a.shape)) for n, a in feeds.items()]
    graph = helper.make_graph([node], "g", inputs,
                              [helper.make_empty_tensor_value_info(f"y{i}")
                               for i in range(n_out)],
                              [numpy_helper.from_array(a, n) for n, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _hosts(model, feeds) -> list[str]:
    imp = import_onnx(model, {k: v.shape for k, v in feeds.items()})
    return [n.attrs["reason"] for n in imp.graph.nodes if n.op == "host"]


def _check(model, feeds):
    """No host node; braze compiled with nothing on the host equals onnxruntime."""
    assert _hosts(model, feeds) == []
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    got = bridge.compile_onnx(model, allow_fallback=False)(**feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        g = np.asarray(g)
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        if w.dtype.kind == "f":
            rtol, atol = TOL[w.dtype]
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
        else:
            np.testing.assert_array_equal(g, w)
    return got


def _rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


# -- Einsum with a letter repeated in one operand ---------------------------------

@pytest.mark.parametrize("eq, shapes", [
    ("...ii->...i", [(3, 5, 5)]),
    ("ii->", [(4, 4)]),                      # a trace
    ("iij->ji", [(3, 3, 2)]),
    ("iii->i", [(3, 3, 3)]),
    ("bii,bj->bij", [(2, 3, 3), (2, 4)]),
    ("ij,jj->i", [(2, 3), (3, 3)]),
])
def test_einsum_diagonal(eq, shapes):
    feeds = {f"x{i}": _rand(*s, dtype=np.float64) for i, s in enumerate(shapes)}
    _check(_model("Einsum", feeds, equation=eq, opset=12), feeds)


def test_einsum_diagonal_is_one_strided_slice():
    feeds = {"x0": _rand(3, 5, 5)}
    imp = import_onnx(_model("Einsum", feeds, equation="...ii->...i", opset=12))
    (sl,) = [n for n in imp.graph.nodes if n.op == "slice"]
    assert sl.attrs["steps"] == (1, 6) and sl.outputs[0].shape == (3, 5)


# -- ReduceMax / ReduceMin on bools and empty sets, ReduceLogSumExp on empty sets --

@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_max_min_bool(op, keepdims):
    feeds = {"x0": RNG.random((4, 3, 2)) < 0.5}
    _check(_model(op, feeds, opset=20, inits={"axes": np.array([1], np.int64)},
                  keepdims=keepdims), feeds)


@pytest.mark.parametrize("op, dtype", [("ReduceMax", np.float32), ("ReduceMin", np.float32),
                                       ("ReduceMax", np.int32), ("ReduceMin", np.int32),
                                       ("ReduceLogSumExp", np.float32)])
def test_reduce_over_an_empty_set_gives_the_spec_value(op, dtype):
    feeds = {"x0": np.zeros((2, 0, 4), dtype)}
    got = _check(_model(op, feeds, opset=18, inits={"axes": np.array([1], np.int64)}),
                 feeds)[0]
    assert got.shape == (2, 1, 4)


def test_reduce_min_of_an_empty_bool_set_is_true():
    model = _model("ReduceMin", {"x0": np.zeros((0, 3), bool)}, opset=20,
                   inits={"axes": np.array([0], np.int64)}, keepdims=0)
    imp = import_onnx(model, {"x0": (0, 3)})
    (out,) = imp.graph.outputs
    assert [n.op for n in imp.graph.nodes if n.op != "const"] == []
    assert out.producer.attrs["value"].tolist() == [True] * 3


# -- BitCast --------------------------------------------------------------------------

@pytest.mark.parametrize("src, dst", [(np.float32, np.int32), (np.int32, np.float32),
                                      (np.float64, np.int64), (np.uint16, np.int16),
                                      (np.int8, np.uint8), (np.uint32, np.float32)])
def test_bitcast(src, dst):
    raw = RNG.integers(0, 2 ** 8, size=(3, 4 * np.dtype(src).itemsize), dtype=np.uint8)
    x = raw.view(src)
    if np.dtype(src).kind == "f" or np.dtype(dst).kind == "f":  # no NaN payloads
        x = (_rand(3, 4) * 100).astype(src) if np.dtype(src).kind == "f" else \
            (_rand(3, 4) * 100).astype(dst).view(src)
    feeds = {"x0": x}
    to = elem_of_dtype(dtypes.from_numpy(dst))
    got = _check(_model("BitCast", feeds, opset=26, to=to), feeds)[0]
    np.testing.assert_array_equal(got, x.view(dst))


def test_bitcast_is_one_ir_op():
    feeds = {"x0": _rand(2, 3)}
    imp = import_onnx(_model("BitCast", feeds, opset=26, to=6))
    assert [n.op for n in imp.graph.nodes] == ["bitcast"]
    assert imp.graph.outputs[0].dtype == "i32"


# -- Det ------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(1, 1), (2, 2), (3, 3), (4, 3, 3), (2, 2, 5, 5),
                                   (DET_MAX_N, DET_MAX_N)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_det(shape, dtype):
    feeds = {"x0": _rand(*shape, dtype=dtype)}
    model = _model("Det", feeds, opset=11)
    if dtype is np.float32:
        _check(model, feeds)
        return
    # onnxruntime's Det is float32 only: float64 against numpy's LU
    assert _hosts(model, feeds) == []
    got = bridge.compile_onnx(model, allow_fallback=False)(**feeds)[0]
    np.testing.assert_allclose(got, np.linalg.det(feeds["x0"]), rtol=1e-9, atol=1e-12)


def test_det_pivots_and_singular_matrices():
    x = np.array([[[0, 1, 2], [3, 4, 5], [6, 7, 9]],     # a zero first pivot
                  [[1, 2, 3], [2, 4, 6], [1, 0, 1]],     # two equal rows: det 0
                  [[0, 0, 1], [0, 1, 0], [1, 0, 0]],     # a permutation: det -1
                  [[0, 2, 3], [0, 4, 6], [0, 0, 1]]],    # a zero column
                 np.float32)
    got = _check(_model("Det", {"x0": x}, opset=11), {"x0": x})[0]
    np.testing.assert_allclose(got, np.linalg.det(x.astype(np.float64)), atol=1e-5)


def test_det_of_a_large_matrix_stays_on_the_host_with_a_reason():
    n = DET_MAX_N + 1
    feeds = {"x0": _rand(n, n)}
    (reason,) = _hosts(_model("Det", feeds, opset=11), feeds)
    assert reason == f"Det of {n} x {n} matrices (braze unrolls n up to DET_MAX_N = " \
                     f"{DET_MAX_N})"


# -- BatchNormalization in training mode --------------------------------------------

@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (4, 3), (2, 3, 7)])
def test_batch_norm_training_mode(shape):
    c = shape[1]
    feeds = {"x0": _rand(*shape), "scale": _rand(c), "bias": _rand(c), "mean": _rand(c),
             "var": np.abs(_rand(c)) + 0.1}
    _check(_model("BatchNormalization", feeds, n_out=3, opset=15, training_mode=1,
                  momentum=0.7, epsilon=1e-2), feeds)


# -- DynamicQuantizeLinear --------------------------------------------------------------

@pytest.mark.parametrize("x", [
    np.array([0, 2, -3, -2.5, 1.34, 0.5], np.float32),
    np.array([-1.0, -2.1, -1.3, -2.5, -3.34, -4.0], np.float32),        # zero point 255
    np.array([[1, 2.1, 1.3], [2.5, 3.34, 4.0]], np.float32),            # zero point 0
    np.array([[-1, -2, -3], [-4, -5, -6]], np.float32),                 # -3 / scale ties
    np.array([0.0, 0.025, -0.005, 1, 2, 3], np.float32),
    np.zeros((2, 3), np.float32),                                       # scale 1
    _rand(4, 33) * 10,
])
def test_dynamic_quantize_linear(x):
    _check(_model("DynamicQuantizeLinear", {"x0": x}, n_out=3, opset=11), {"x0": x})


def test_dynamic_quantize_linear_rounds_ties_to_even():
    # scale 6 / 255; x / scale is -127.5 (-128, zero point 255: 127) and -42.5 (-42: 213)
    x = np.array([-1.0, -3.0, -6.0, 0.0], np.float32)
    y, scale, zp = _check(_model("DynamicQuantizeLinear", {"x0": x}, n_out=3, opset=11),
                          {"x0": x})
    assert zp == 255 and y.tolist() == [213, 127, 0, 255]


# -- Compress -------------------------------------------------------------------------

@pytest.mark.parametrize("cond, axis", [([1, 0, 1], 0), ([0, 1], 1), ([1, 0, 1], -2),
                                        ([0, 1, 1, 0, 1], None), ([1], 0), ([0, 0, 0], 0)])
def test_compress_with_a_constant_condition(cond, axis):
    feeds = {"x0": _rand(3, 2)}
    attrs = {} if axis is None else {"axis": axis}
    model = _model("Compress", feeds, opset=11, inits={"cond": np.array(cond, bool)}, **attrs)
    _check(model, feeds)


def test_compress_with_a_run_time_condition_stays_on_the_host():
    feeds = {"x0": _rand(3, 2), "cond": np.array([1, 0, 1], bool)}
    (reason,) = _hosts(_model("Compress", feeds, opset=11, axis=0), feeds)
    assert reason == ("its condition is computed at run time: the output's shape would "
                      "depend on the data")


# -- CausalConvWithState ------------------------------------------------------------

@pytest.mark.parametrize("k, length, bias, state, activation", [
    (4, 8, False, False, "none"),
    (4, 8, True, True, "silu"),
    (3, 1, True, True, "swish"),          # one decode step
    (5, 2, False, False, "none"),         # shorter than the state
    (1, 6, True, False, "silu"),          # no state at all
])
def test_causal_conv_with_state(k, length, bias, state, activation):
    b, c = 2, 3
    feeds = {"x0": _rand(b, c, length), "w": _rand(c, 1, k)}
    names = ["x0", "w", "bias" if bias else "", "state" if state else ""]
    if bias:
        feeds["bias"] = _rand(c)
    if state:
        feeds["state"] = _rand(b, c, k - 1)
    model = _model("CausalConvWithState", feeds, n_out=2, opset=27, activation=activation)
    del model.graph.node[0].input[:]
    model.graph.node[0].input.extend(names)
    _check(model, feeds)


def test_causal_conv_with_a_constant_weight_is_elementwise_taps():
    feeds = {"x0": _rand(1, 4, 6)}
    model = _model("CausalConvWithState", feeds, n_out=2, opset=27,
                   inits={"w": _rand(4, 1, 3)})
    _check(model, feeds)
    imp = import_onnx(model)
    ops = [n.op for n in imp.graph.nodes if n.op != "const"]
    assert "conv" not in ops and ops.count("mul") == 3
