"""Every op braze compiles, in every dtype it takes, against compiler.interp.evaluate.

Integers and bools must match exactly; floats within FLOAT_ULPS (libm and
numpy's own float32 loops differ by an ulp or two; the fast exp/log/tanh/
sigmoid/erf are held to their stated bounds in test_codegen_math.py). Several
ops share one compiled graph (one output each) to keep compile time down; a
failure names the op.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler import dtypes
from compiler.codegen import compile_graph, supports
from compiler.errors import DivisionByZeroError
from compiler.interp import evaluate
from compiler.ir import Graph, TensorType
from compiler.ops.elementwise import BINARY, UNARY
from runtime.cpu import CpuStep
from tests.compiler.test_codegen_math import ulp_error

FLOAT_ULPS = 4
TINY = 1e-37  # below this, results count as equal (flushed or denormal differences)
CODEGEN_DTYPES = ("bool", "i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64", "f32", "f64")


def data(dtype: str, shape: tuple, rng, special: bool = True) -> np.ndarray:
    """Random values with the edge cases of the dtype mixed in."""
    n = int(np.prod(shape))
    if dtype == "bool":
        return rng.random(shape) < 0.5
    npd = dtypes.to_numpy(dtype)
    if dtype in dtypes.FLOATS:
        x = rng.standard_normal(n) * np.exp2(rng.integers(-8, 8, n))
        if special:
            edge = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 1e30, -1e30, 1.0, -1.0,
                    0.5, 2.5, -2.5]
            x[rng.integers(0, n, len(edge) * 2)] = edge * 2
        return x.astype(npd).reshape(shape)
    info = np.iinfo(npd)
    x = rng.integers(info.min, info.max, n, dtype=npd, endpoint=True)
    small = rng.integers(max(info.min, -9), 10, n).astype(npd)
    x = np.where(rng.random(n) < 0.5, small, x)
    if special:
        edge = [0, 1, info.max, info.min] + ([-1] if info.min < 0 else [])
        x[rng.integers(0, n, len(edge))] = edge
    return x.astype(npd).reshape(shape)


def assert_matches(got, want, label: str, ulps: int = FLOAT_ULPS) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, label
    if got.dtype.kind == "f":
        with np.errstate(all="ignore"):
            _assert_close(got, want, label, ulps)
    else:
        np.testing.assert_array_equal(got, want, err_msg=label)


def _assert_close(got, want, label: str, ulps: int) -> None:
    if got.dtype == np.float64:
        close = np.isclose(got, want, rtol=ulps * 2.3e-16, atol=TINY, equal_nan=True)
    else:
        close = (ulp_error(got, want) <= ulps) | (np.abs(got - want) <= TINY)
    bad = np.flatnonzero(~close.ravel())
    assert not len(bad), f"{label}: {len(bad)} differ, e.g. got {got.ravel()[bad[:4]]} " \
                         f"want {want.ravel()[bad[:4]]}"


def check_graph(g: Graph, inputs: list, ulps: int = FLOAT_ULPS, threads: int = 2) -> None:
    got = CpuStep(compile_graph(g), threads=threads).run(inputs)
    want = evaluate(g, inputs)
    for v, a, b in zip(g.outputs, got, want):
        assert_matches(a, b, f"%{v.name} = {v.producer.op if v.producer else 'input'}", ulps)


def _ops_for(table: dict, dtype: str) -> list[str]:
    return [op for op, (allowed, _, _) in table.items() if dtype in allowed]


@pytest.mark.parametrize("dtype", CODEGEN_DTYPES)
def test_unary_ops(dtype):
    rng = np.random.default_rng(1)
    g = Graph(f"unary_{dtype}")
    x = g.add_input("x", TensorType(dtype, (3, 67)))
    outs = []
    for op in _ops_for(UNARY, dtype):
        node = g.add_node(op, [x], name=op)
        assert supports(node) is None, (op, supports(node))
        outs.append(node.outputs[0])
    if not outs:
        pytest.skip(f"no unary op takes {dtype}")
    g.outputs = outs
    check_graph(g, [data(dtype, (3, 67), rng)])


@pytest.mark.parametrize("dtype", CODEGEN_DTYPES)
def test_binary_ops_broadcasting(dtype):
    rng = np.random.default_rng(2)
    g = Graph(f"binary_{dtype}")
    x = g.add_input("x", TensorType(dtype, (4, 5, 33)))
    y = g.add_input("y", TensorType(dtype, (5, 1)))
    outs = []
    for op in _ops_for(BINARY, dtype):
        node = g.add_node(op, [x, y], name=op)
        reason = supports(node)
        if reason is not None:
            assert op == "pow" and dtype not in dtypes.FLOATS, (op, reason)
            g.nodes.remove(node)
            continue
        outs.append(node.outputs[0])
    g.outputs = outs
    y_data = data(dtype, (5, 1), rng)
    if dtype not in dtypes.FLOATS:  # an integer divisor of 0 raises (test_integer_division_edges)
        y_data[y_data == 0] = 1
    check_graph(g, [data(dtype, (4, 5, 33), rng), y_data])


def test_integer_division_edges():
    g = Graph("intdiv")
    x = g.add_input("x", TensorType("i32", (8,)))
    y = g.add_input("y", TensorType("i32", (8,)))
    g.outputs = [g.op(op, x, y) for op in ("div", "mod", "fmod")]
    lo = np.iinfo(np.int32).min
    xs = np.array([7, -7, 7, -7, lo, lo, 5, -5], np.int32)
    ys = np.array([2, 2, -2, -2, -1, -1, 3, -3], np.int32)
    check_graph(g, [xs, ys])
    got = CpuStep(compile_graph(g)).run([xs, ys])
    np.testing.assert_array_equal(got[0][:4], [3, -3, -3, 3])  # truncates toward zero
    np.testing.assert_array_equal(got[1][:4], [1, 1, -1, -1])  # sign of the divisor
    # a divisor of 0 raises, as onnxruntime and torch do (compiler/codegen/faults.py)
    with pytest.raises(DivisionByZeroError, match="integer division by zero"):
        CpuStep(compile_graph(g)).run([xs, np.where(np.arange(8) == 5, 0, ys).astype(np.int32)])


@pytest.mark.parametrize("src", CODEGEN_DTYPES)
def test_casts(src):
    rng = np.random.default_rng(3)
    g = Graph(f"cast_{src}")
    x = g.add_input("x", TensorType(src, (129,)))
    g.outputs = [g.op("cast", x, to=dst) for dst in CODEGEN_DTYPES]
    if src in dtypes.FLOATS:  # float -> int is defined only in range: numpy's own
        a = rng.uniform(0, 127, 129).astype(dtypes.to_numpy(src))
        a[:8] = [0.0, -0.0, 0.5, 1.5, 126.9, 1e-40, 3.0, 100.25]
        with np.errstate(invalid="ignore"):
            check_graph(g, [a])
        g.outputs = [g.op("cast", x, to=dst) for dst in ("f32", "f64", "bool")]
        with np.errstate(all="ignore"):
            a[:3] = [np.nan, np.inf, -1e300]
            check_graph(g, [a])
    else:
        check_graph(g, [data(src, (129,), rng)])


@pytest.mark.parametrize("dtype", ["f32", "f64", "i32", "i64", "u8", "i8", "u64"])
@pytest.mark.parametrize("axes", [(0,), (2,), (0, 2), (1, 2), (0, 1, 2)])
def test_reductions(dtype, axes):
    rng = np.random.default_rng(4)
    shape = (3, 5, 37)
    g = Graph(f"reduce_{dtype}")
    x = g.add_input("x", TensorType(dtype, shape))
    ops = ["reduce_sum", "reduce_max", "reduce_min"] + (["reduce_prod"] if len(axes) < 2 else [])
    g.outputs = [g.op(op, x, axes=axes, keepdims=keep) for op in ops for keep in (True, False)]
    a = data(dtype, shape, rng, special=False)
    if dtype in dtypes.FLOATS:
        a[0, 1, 3] = np.nan
        got = CpuStep(compile_graph(g)).run([a])
        for v, o, w in zip(g.outputs, got, evaluate(g, [a])):
            # sums reassociate (vector partial sums): compare against the summed magnitudes
            scale = np.sum(np.abs(np.nan_to_num(a)), axis=axes, keepdims=v.producer.attrs[
                "keepdims"]) if v.producer.op == "reduce_sum" else np.abs(w)
            tol = 64 * np.finfo(a.dtype).eps * scale + TINY
            ok = (np.abs(o - w) <= tol) | (np.isnan(o) & np.isnan(w)) | (o == w)
            assert ok.all(), f"{v.producer.op} {axes}: {o[~ok][:4]} vs {w[~ok][:4]}"
    else:
        check_graph(g, [a])


@pytest.mark.parametrize("dtype", ["f32", "f64", "i32", "u8"])
def test_argmax_argmin(dtype):
    rng = np.random.default_rng(5)
    shape = (4, 6, 19)
    g = Graph("arg")
    x = g.add_input("x", TensorType(dtype, shape))
    g.outputs = [g.op(op, x, axis=axis, keepdims=keep, select_last=last)
                 for op in ("argmax", "argmin") for axis in (0, 1, 2)
                 for keep in (True, False) for last in (False, True)]
    a = rng.integers(0, 4, shape).astype(dtypes.to_numpy(dtype))  # many ties
    if dtype in dtypes.FLOATS:
        a[1, 2, 3] = a[1, 2, 7] = np.nan
    check_graph(g, [a])


def _movement_graph(dtype: str):
    g = Graph(f"move_{dtype}")
    x = g.add_input("x", TensorType(dtype, (4, 6, 5)))
    idx = g.add_input("i", TensorType("i64", (3, 2)))
    one = g.const(np.array(1).astype(dtypes.to_numpy(dtype)) if dtype != "bool"
                  else np.array(True))
    combine = "or" if dtype == "bool" else "add"
    outs = [
        g.op("transpose", x, perm=(2, 0, 1)),
        g.op(combine, g.op("transpose", x, perm=(1, 0, 2)), one),
        g.op("reshape", x, shape=(8, 15)),
        g.op("reshape", g.op("transpose", x, perm=(0, 2, 1)), shape=(20, 6)),
        # kept first and last dims around a split middle, and a channel shuffle
        g.op("reshape", x, shape=(4, 2, 3, 5)),
        g.op("reshape", g.op("transpose", g.op("reshape", x, shape=(4, 6, 5, 1)),
                             perm=(0, 2, 1, 3)), shape=(4, 5, 6)),
        g.op("reshape", g.op("transpose", g.op("reshape", x, shape=(4, 2, 3, 5)),
                             perm=(0, 2, 1, 3)), shape=(4, 6, 5)),
        g.op("broadcast", g.op("slice", x, starts=(0, 1, 4), steps=(1, 2, 1),
                               sizes=(4, 3, 1)), shape=(2, 4, 3, 7)),
        g.op("slice", x, starts=(3, 5, 0), steps=(-1, -2, 2), sizes=(4, 3, 3)),
        g.op("concat", x, g.op("slice", x, starts=(0, 0, 1), steps=(1, 1, 1),
                                 sizes=(4, 6, 2)), x, axis=2),
        g.op("concat", g.op("transpose", g.op("transpose", x, perm=(1, 0, 2)),
                            perm=(1, 0, 2)), x, axis=1),
        g.op("gather", x, idx, axis=1),
        g.op("gather", x, idx, axis=2),
        g.op("select", g.op("eq", x, one), x, g.op("transpose", g.op(
            "transpose", x, perm=(1, 0, 2)), perm=(1, 0, 2))),
    ]
    for mode in ("constant", "edge", "reflect", "wrap"):
        outs.append(g.op("pad", x, pads=(1, 0, 2, 2, 3, 1), mode=mode, value=3.0))
    g.outputs = outs
    return g


@pytest.mark.parametrize("dtype", ["f32", "f64", "i32", "i64", "u8", "bool"])
def test_movement_ops(dtype):
    rng = np.random.default_rng(6)
    g = _movement_graph(dtype)
    idx = rng.integers(-6, 5, (3, 2))
    check_graph(g, [data(dtype, (4, 6, 5), rng), idx])


def test_reshape_passes_the_channel_dims_of_a_shuffle_through():
    """A channel shuffle over NHWC's last dim splits only C: N, H and W are groups of
    their own, so their indices pass through (compiler/codegen/emitter.reshape_groups)."""
    from compiler.codegen.emitter import reshape_groups

    groups = reshape_groups((1, 6, 6, 8), (1, 6, 6, 2, 4))
    assert groups[:3] == [((0, 1), (0, 1)), ((1, 2), (1, 2)), ((2, 3), (2, 3))]
    assert groups[3] == ((3, 4), (3, 5))


def test_constants_scalar_and_tensor():
    g = Graph("consts")
    x = g.add_input("x", TensorType("f32", (3, 4)))
    w = g.const(np.arange(12, dtype=np.float32).reshape(3, 4))
    c = g.const(np.float32(2.5))
    g.outputs = [g.op("mul", g.op("add", x, w), c), w]
    a = np.ones((3, 4), np.float32)
    check_graph(g, [a])


_SHAPES = st.lists(st.integers(1, 5), min_size=1, max_size=4)


@st.composite
def broadcast_chains(draw):
    out = tuple(draw(_SHAPES))
    dtype = draw(st.sampled_from(["f32", "i32", "f64", "i64"]))
    n_in = draw(st.integers(1, 4))
    shapes = []
    for _ in range(n_in):
        rank = draw(st.integers(0, len(out)))
        dims = out[len(out) - rank:]
        shapes.append(tuple(d if draw(st.booleans()) else 1 for d in dims))
    shapes[0] = out
    ops = draw(st.lists(st.sampled_from(["add", "sub", "mul", "max", "min"]),
                        min_size=1, max_size=6))
    return dtype, shapes, ops, draw(st.integers(0, 2 ** 32 - 1))


@settings(max_examples=25, deadline=None)
@given(broadcast_chains())
def test_random_broadcasting_chains(case):
    dtype, shapes, ops, seed = case
    rng = np.random.default_rng(seed)
    g = Graph("chain")
    ins = [g.add_input(f"x{i}", TensorType(dtype, s)) for i, s in enumerate(shapes)]
    acc = ins[0]
    for k, op in enumerate(ops):
        acc = g.op(op, acc, ins[(k + 1) % len(ins)])
    g.outputs = [acc]
    check_graph(g, [data(dtype, s, rng, special=False) for s in shapes])


@pytest.mark.parametrize("dtype", ["f32", "f64", "i32", "i64", "u8"])
@pytest.mark.parametrize("a_shape,b_shape", [((5, 7), (7, 33)), ((2, 1, 3, 4), (3, 4, 9)),
                                             ((1, 1), (1, 1)), ((3, 0), (0, 4))])
def test_matmul(dtype, a_shape, b_shape):
    rng = np.random.default_rng(7)
    g = Graph("mm")
    a = g.add_input("a", TensorType(dtype, a_shape))
    b = g.add_input("b", TensorType(dtype, b_shape))
    node = g.add_node("matmul", [a, b])
    assert supports(node) is None
    g.outputs = [g.op("add", node.outputs[0], b if b_shape == (1, 1) else
                      g.const(np.ones((), dtypes.to_numpy(dtype))))]
    x, y = data(dtype, a_shape, rng, special=False), data(dtype, b_shape, rng, special=False)
    if dtype in dtypes.FLOATS:
        got, want = CpuStep(compile_graph(g)).run([x, y])[0], evaluate(g, [x, y])[0]
        np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == "f32" else 1e-12, atol=1e-3)
    else:
        check_graph(g, [x, y])
