"""IR -> ONNX export: every primitive op runs on onnxruntime as compiler.interp computes it."""

import numpy as np
import onnx
import pytest

from compiler.interp import evaluate
from compiler.ir import Graph, TensorType
from compiler.ops.elementwise import BINARY, UNARY
from runtime.fallback_onnx import OnnxHostStep, export_onnx

RNG = np.random.default_rng(0)
NP = {"f32": np.float32, "f64": np.float64, "i32": np.int32, "i64": np.int64,
      "bool": np.bool_, "u8": np.uint8}


def _data(dtype, shape, positive=False):
    if dtype == "bool":
        return RNG.integers(0, 2, shape).astype(bool)
    if dtype.startswith(("i", "u")):
        lo = 1 if positive else -3
        return RNG.integers(lo if dtype.startswith("i") else 1, 4, shape).astype(NP[dtype])
    x = RNG.uniform(0.2 if positive else -0.9, 0.9, shape)
    return x.astype(NP[dtype])


def _check(build, specs, positive=False):
    g = Graph()
    ins = [g.add_input(f"in{i}", TensorType(d, s)) for i, (d, s) in enumerate(specs)]
    g.outputs = [build(g, *ins)]
    arrays = [_data(d, s, positive) for d, s in specs]
    model = export_onnx(g)
    onnx.checker.check_model(model)
    got = OnnxHostStep(g, threads=1)(arrays)[0]
    want = evaluate(g, arrays)[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_array_equal(got, want)


def _first_dtype(allowed):
    for d in ("f32", "i32", "u8", "bool"):
        if d in allowed:
            return d


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(op):
    dtype = _first_dtype(UNARY[op][0])
    positive = op in ("log", "sqrt", "acosh", "log1p", "reciprocal")
    if op == "acosh":
        return _check(lambda g, x: g.op(op, g.op("add", x, g.const(np.float32(1)))),
                      [(dtype, (3, 4))], positive)
    _check(lambda g, x: g.op(op, x), [(dtype, (3, 4))], positive)


@pytest.mark.parametrize("op", sorted(BINARY) + ["mod", "fmod"])
def test_binary_broadcasting(op):
    allowed = BINARY.get(op, (frozenset({"i32", "f32"}),))[0]
    dtype = "i32" if op in ("mod", "div", "fmod") and "i32" in allowed else _first_dtype(allowed)
    positive = op in ("pow", "mod", "fmod", "div", "shl", "shr")
    _check(lambda g, a, b: g.op(op, a, b), [(dtype, (3, 4)), (dtype, (4,))], positive)


@pytest.mark.parametrize("build,specs", [
    (lambda g, x: g.op("reduce_sum", x, axes=(1,), keepdims=False), [("f32", (3, 4, 5))]),
    (lambda g, x: g.op("reduce_max", x, axes=(0, 2), keepdims=True), [("f32", (3, 4, 5))]),
    (lambda g, x: g.op("reduce_prod", x, axes=(2,), keepdims=True), [("i64", (3, 4, 5))]),
    (lambda g, x: g.op("argmin", x, axis=1, keepdims=False), [("f32", (3, 4))]),
    (lambda g, x: g.op("cast", x, to="i32"), [("f32", (3, 4))]),
    (lambda g, c, a, b: g.op("select", c, a, b),
     [("bool", (3, 1)), ("f32", (3, 4)), ("f32", (4,))]),
    (lambda g, x: g.op("reshape", x, shape=(2, 6)), [("f32", (3, 4))]),
    (lambda g, x: g.op("transpose", x, perm=(2, 0, 1)), [("f32", (2, 3, 4))]),
    (lambda g, x: g.op("broadcast", x, shape=(2, 3, 4)), [("f32", (3, 1))]),
    (lambda g, x: g.op("slice", x, starts=(2, 0), steps=(-1, 2), sizes=(3, 2)),
     [("f32", (3, 4))]),
    (lambda g, x: g.op("slice", x, starts=(0, 0), steps=(1, 1), sizes=(0, 4)),
     [("f32", (3, 4))]),
    (lambda g, a, b: g.op("concat", a, b, axis=1), [("f32", (2, 3)), ("f32", (2, 1))]),
    (lambda g, x: g.op("pad", x, pads=(1, 0, 0, 2), mode="reflect"), [("f32", (3, 4))]),
    (lambda g, x: g.op("pad", x, pads=(1, 0, 0, 2), value=7.0), [("i64", (3, 4))]),
    (lambda g, x, i: g.op("gather", x, i, axis=1), [("f32", (3, 4)), ("i64", (2, 2))]),
    (lambda g, a, b: g.op("matmul", a, b), [("f32", (2, 3, 4)), ("f32", (4, 5))]),
    (lambda g, x, w: g.op("conv", x, w, strides=(2, 1), pads=(1, 1, 0, 1), dilations=(1, 1),
                          group=2), [("f32", (1, 4, 5, 5)), ("f32", (6, 2, 3, 3))]),
    (lambda g, x: g.op("max_pool", x, kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1),
                       dilations=(1, 1)), [("f32", (1, 2, 6, 6))]),
    (lambda g, x: g.op("avg_pool", x, kernel=(2, 2), strides=(1, 1), pads=(0, 0, 1, 1),
                       dilations=(1, 1), count_include_pad=False), [("f32", (1, 2, 4, 4))]),
])
def test_other_ops(build, specs):
    _check(build, specs)


def test_relu_peephole_and_output_names():
    g = Graph()
    x = g.add_input("x", TensorType("f32", (4,)))
    g.outputs = [g.op("max", x, g.const(np.float32(0), "zero")), x]
    model = export_onnx(g, output_names=["relu_out", "same_x"])
    assert [n.op_type for n in model.graph.node] == ["Relu", "Identity"]
    assert [o.name for o in model.graph.output] == ["relu_out", "same_x"]
    assert not model.graph.initializer  # the orphaned zero is pruned
