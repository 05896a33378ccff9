"""Division by a row-invariant divisor (a scalar constant, a row's reduction) goes through
the divisor's reciprocal (codegen/emitter.py `_div`); by a constant one correction step
follows, and results must equal IEEE division bit for bit, special values included."""

import numpy as np
import pytest

from compiler.codegen import compile_graph
from compiler.ir import Graph, TensorType
from runtime.cpu import CpuStep

SPECIAL = [np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-40, -3e-39, 3.4e38]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("divisor", [3.7, 255.0, -0.1, 7e-39, 0.0, np.inf])
def test_division_by_a_constant_is_exact(dtype, divisor):
    ir_dtype = "f32" if dtype == np.float32 else "f64"
    g = Graph()
    x = g.add_input("x", TensorType(ir_dtype, (16, 301)))
    g.outputs = [g.op("div", x, g.const(np.array(divisor, dtype)))]
    xs = np.random.default_rng(0).standard_normal((16, 301)).astype(dtype) * 100
    xs[0, :len(SPECIAL)] = SPECIAL
    got, = CpuStep(compile_graph(g)).run([xs])
    with np.errstate(all="ignore"):
        want = xs / dtype(divisor)
    np.testing.assert_array_equal(got, want)


def test_division_by_a_row_maximum_is_within_an_ulp():
    """A computed row divisor (softmax's sum) multiplies by its reciprocal, as torch's and
    onnxruntime's softmax do: within an ulp of the quotient, not exact."""
    g = Graph()
    x = g.add_input("x", TensorType("f32", (64, 1000)))
    g.outputs = [g.op("div", x, g.op("reduce_max", x, axes=(1,), keepdims=True))]
    xs = np.random.default_rng(1).uniform(0.001, 1000, (64, 1000)).astype(np.float32)
    got, = CpuStep(compile_graph(g)).run([xs])
    want = xs / xs.max(1, keepdims=True)
    assert np.all(np.abs(got - want) <= np.spacing(want))
