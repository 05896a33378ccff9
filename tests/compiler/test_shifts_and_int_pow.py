"""ONNX BitShift on every integer dtype (version 28: signed ones, arithmetic right shifts,
amounts that are negative or at least the bit width) and Pow of an integer base, compiled
by braze (no fallback) and evaluated by the IR's numpy reference (import + interp, and
constant folding), all against onnxruntime, exactly."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from bridge import compile_onnx
from compiler.errors import InvalidModelError
from compiler.interp import evaluate
from importers.onnx import import_onnx

INTS = (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)


def _model(op, dtypes_, shapes, opset, inits=(), **attrs):
    """One `op` node reading x, y (an initializer where `inits` names it) into z."""
    names = ("x", "y")
    given = {t.name for t in inits}
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.dtype(d)), s)
              for n, d, s in zip(names, dtypes_, shapes) if n not in given]
    out = helper.make_tensor_value_info("z", helper.np_dtype_to_tensor_dtype(np.dtype(dtypes_[0])),
                                        None)
    g = helper.make_graph([helper.make_node(op, list(names), ["z"], **attrs)], "g", inputs,
                          [out], list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _check(model, feeds: dict):
    """braze compiled and braze's numpy reference both equal onnxruntime, bit for bit."""
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = compile_onnx(model, allow_fallback=False)(**feeds)[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    imported = import_onnx(model, {k: v.shape for k, v in feeds.items()})
    assert not any(n.op == "host" for n in imported.graph.nodes)
    (ref,) = evaluate(imported.graph, feeds)
    np.testing.assert_array_equal(ref, want)
    return want


def _shift_operands(dt):
    """x (a column) against every amount (a row): negative, 0, 1, width-1, width, more."""
    info, width = np.iinfo(dt), np.dtype(dt).itemsize * 8
    xs = [0, 1, 3, 5, info.max, info.max // 3, info.min]
    amounts = [0, 1, 2, width - 1, width, width + 1, 2 * width, info.max]
    if info.min < 0:
        xs += [-1, -2, -5, info.min + 1]
        amounts += [-1, -2, -width, info.min]
    else:
        amounts += [info.max - 1, 1 << (width - 1)]  # "negative" if read as signed
    return np.array(xs, dt).reshape(-1, 1), np.array(amounts, dt)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dt", INTS, ids=lambda d: np.dtype(d).name)
def test_bitshift_matches_onnxruntime(dt, direction):
    x, y = _shift_operands(dt)
    model = _model("BitShift", (dt, dt), (x.shape, y.shape), 28, direction=direction)
    z = _check(model, {"x": x, "y": y})
    width = np.dtype(dt).itemsize * 8
    wide = (y < 0) | (y >= width) if np.dtype(dt).kind == "i" else y >= width
    fill = np.where(x < 0, -1, 0) if direction == "RIGHT" else np.zeros_like(x)
    np.testing.assert_array_equal(z[:, wide], np.broadcast_to(fill, z[:, wide].shape))


def test_unsigned_shift_by_width_or_more_is_zero_before_version_28():
    """onnxruntime gives 0 where LLVM's shl/lshr alone would give poison (braze selected 0
    there before signed shifts too)."""
    for dt in (np.uint8, np.uint64):
        x, y = _shift_operands(dt)
        for direction in ("LEFT", "RIGHT"):
            model = _model("BitShift", (dt, dt), (x.shape, y.shape), 18, direction=direction)
            z = _check(model, {"x": x, "y": y})
            assert not z[:, y >= np.dtype(dt).itemsize * 8].any()


def test_signed_bitshift_before_version_28_is_invalid():
    model = _model("BitShift", (np.int32, np.int32), ((3,), (3,)), 18, direction="LEFT")
    with pytest.raises(InvalidModelError, match="BitShift does not take"):
        import_onnx(model, {"x": (3,), "y": (3,)})


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bitshift_of_constants_folds(direction):
    x, y = _shift_operands(np.int16)
    inits = [numpy_helper.from_array(x, "x"), numpy_helper.from_array(y, "y")]
    model = _model("BitShift", (np.int16, np.int16), (x.shape, y.shape), 28, inits,
                   direction=direction)
    imported = import_onnx(model, {})
    assert [n.op for n in imported.graph.nodes] == ["const"]
    _check(model, {})


# -- Pow of an integer base ----------------------------------------------------------

def _pow_operands(dt, et):
    """Every base against every exponent: 0, 1, 2, 3, negative, large, fractional."""
    big = 46341 if dt == np.int32 else 3037000500  # its square just overflows dt
    xs = np.array([0, 1, -1, 2, -2, 3, -3, 7, 10, 1290, -1290, big, -big, 2097152], dt)
    ys = [0, 1, 2, 3, 4, -1, -2, -3, 5, 31, 32, 33, 62, 63, 64, 100]
    if np.dtype(et).kind == "f":
        ys += [0.5, 1.5, -0.5, 1 / 3, 2.5, np.inf, -np.inf, np.nan]
    return xs.reshape(-1, 1), np.array(ys, et)


@pytest.mark.parametrize("dt,et", [(np.int32, np.int32), (np.int32, np.int64),
                                   (np.int32, np.float32), (np.int32, np.float64),
                                   (np.int64, np.int64), (np.int64, np.int32),
                                   (np.int64, np.float32), (np.int64, np.float64)],
                         ids=lambda d: np.dtype(d).name)
def test_integer_pow_matches_onnxruntime(dt, et):
    """onnxruntime's pow in float64, truncated, its minimum out of range or NaN (0 to a
    negative power, 2^31 in int32, (-2)^0.5); x*x, x*x*x (wrapping) for a y of one element
    against a row of x (a column of x takes the float64 path)."""
    x, y = _pow_operands(dt, et)
    z = _check(_model("Pow", (dt, et), (x.shape, y.shape), 15), {"x": x, "y": y})
    info = np.iinfo(dt)
    column = {float(v) if np.dtype(et).kind == "f" else int(v): i for i, v in enumerate(y)}
    assert (z[:, column[0]] == 1).all()
    assert z[list(x[:, 0]).index(2), column[-1]] == 0  # 2^-1 truncates
    assert z[list(x[:, 0]).index(-1), column[-3]] == -1
    assert z[list(x[:, 0]).index(0), column[-1]] == info.min  # inf
    row = x.reshape(-1)
    for k in (2, 3):  # one exponent for a row of x: onnxruntime multiplies, wrapping
        power = _check(_model("Pow", (dt, et), (row.shape, ()), 15),
                       {"x": row, "y": np.array(k, et)})
        with np.errstate(over="ignore"):
            np.testing.assert_array_equal(power, row ** k)


@pytest.mark.parametrize("xs,ys", [((), ()), ((1,), ()), ((4,), (1,)), ((2, 4), (2, 1)),
                                   ((2, 4), (1, 4)), ((4, 1), (1, 3)), ((3,), (2, 1)),
                                   ((2, 1, 4), (2, 3, 1)), ((3, 1), ()), ((3, 1), (1,)),
                                   ((3, 1), (1, 1)), ((3, 2, 1), (3, 1, 1))])
def test_integer_pow_squares_where_onnxruntime_does(xs, ys):
    """Overflowing squares tell onnxruntime's two paths apart: wrapped or INT32_MIN."""
    rng = np.random.default_rng(len(xs) * 10 + len(ys))
    x = rng.choice([46341, -46341, 3, 1290], size=xs).astype(np.int32)
    y = rng.choice([2, 3, 2, 5], size=ys).astype(np.int32)
    _check(_model("Pow", (np.int32, np.int32), (xs, ys), 15), {"x": x, "y": y})
    inits = [numpy_helper.from_array(y, "y")]  # the same with y a constant
    _check(_model("Pow", (np.int32, np.int32), (xs, ys), 15, inits), {"x": x})


@pytest.mark.parametrize("k", [-1, 0, 1, 2, 3, 4, 0.5])
def test_integer_pow_by_a_constant(k):
    """A constant exponent (the float64 pow's may be rewritten into multiplies or 1 / x)."""
    et = np.float32 if k == 0.5 else np.int32
    x = _pow_operands(np.int32, et)[0]
    for shape in (x.shape, (x.size,)):
        inits = [numpy_helper.from_array(np.array(k, et), "y")]
        _check(_model("Pow", (np.int32, et), (shape, ()), 15, inits), {"x": x.reshape(shape)})


@pytest.mark.parametrize("et", [np.int64, np.float32])
def test_integer_pow_of_constants_folds(et):
    x, y = _pow_operands(np.int64, et)
    inits = [numpy_helper.from_array(x, "x"), numpy_helper.from_array(y, "y")]
    model = _model("Pow", (np.int64, et), (x.shape, y.shape), 15, inits)
    imported = import_onnx(model, {})
    assert [n.op for n in imported.graph.nodes] == ["const"]
    _check(model, {})
