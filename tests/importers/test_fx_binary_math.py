"""torch importer: atan2 and hypot (IR ops calling libm's atan2 / hypot per element) and
fmax / fmin (maximum / minimum where a NaN operand gives the other), with nothing on
torch, against eager: signed zeros, infinities and NaN in every pairing, float32 and
float64, broadcasting, integer operands promoted; structure: the IR ops they import as."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from compiler.codegen import compile_graph
from compiler.interp import evaluate
from compiler.ir import verify
from importers.fx import import_fx
from runtime.cpu import CpuStep

from tests.importers import fx_compare
from tests.importers.fx_compare import close, compiled

seeded = fx_compare.seeded  # autouse: a fixed seed for every test here

SPECIALS = [0.0, -0.0, 1.0, -1.0, 2.5, -3e-39, float("inf"), float("-inf"), float("nan"),
            1e30, -1e-30]


def _pairs(dtype):
    """Every special against every special (and random values), as two tensors."""
    ys, xs = zip(*itertools.product(SPECIALS, SPECIALS))
    y = torch.cat([torch.tensor(ys, dtype=dtype), torch.randn(64, dtype=dtype) * 10])
    x = torch.cat([torch.tensor(xs, dtype=dtype), torch.randn(64, dtype=dtype) * 10])
    return y, x


FNS = {"atan2": torch.atan2, "hypot": torch.hypot, "fmax": torch.fmax, "fmin": torch.fmin}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", sorted(FNS))
def test_matches_eager_on_specials(name, dtype):
    y, x = _pairs(dtype)
    fn = FNS[name]
    got = compiled(lambda a, b: fn(a, b) * 1.0)(y, x)
    want = fn(y, x)
    if name in ("fmax", "fmin"):
        close(got, want, rtol=0, atol=0)  # a selection: equal bits up to zero's sign
    else:  # libm's answer: eager's own kernels are within an ulp of it
        close(got, want, rtol=2e-7 if dtype == torch.float32 else 1e-15, atol=0)
    # the angle's quadrant follows the zeros' signs, as C's atan2
    if name == "atan2":
        assert torch.equal(torch.signbit(got[~got.isnan()]), torch.signbit(want[~want.isnan()]))


@pytest.mark.parametrize("name", sorted(FNS))
def test_broadcast_and_int_operands_promote(name):
    fn = FNS[name]
    a = torch.randint(-5, 5, (3, 1), dtype=torch.int32)
    b = torch.randn(4)
    close(compiled(lambda a, b: fn(a, b))(a, b), fn(a, b), rtol=2e-7, atol=0)


def test_fmax_fmin_on_integers():
    a, b = torch.randint(-9, 9, (5, 4)), torch.randint(-9, 9, (4,))
    close(compiled(lambda a, b: (torch.fmax(a, b), torch.fmin(a, b)))(a, b),
          (torch.fmax(a, b), torch.fmin(a, b)), rtol=0, atol=0)


def test_imports_as_the_ir_ops():
    args = (torch.randn(4), torch.randn(4))
    for fn, ops in [(torch.atan2, {"atan2"}), (torch.hypot, {"hypot"}),
                    (torch.fmax, {"max", "isnan", "select"})]:
        imp = import_fx(make_fx(fn)(*args), list(args))
        verify(imp.graph)
        assert ops <= {n.op for n in imp.graph.nodes}, fn


@pytest.mark.parametrize("op", ["atan2", "hypot"])
@pytest.mark.parametrize("target", ["cpu", "cpu:x86-64-v3"])
def test_ir_op_compiles_to_the_reference(op, target):
    """The IR op alone, against its numpy reference (np.arctan2 / np.hypot)."""
    from compiler.ir import Graph, TensorType

    g = Graph(op)
    y, x = (g.add_input(n, TensorType("f64", (len(SPECIALS) ** 2,))) for n in "yx")
    g.outputs = [g.op(op, y, x)]
    ys, xs = (np.array(v, np.float64) for v in zip(*itertools.product(SPECIALS, SPECIALS)))
    got, = CpuStep(compile_graph(g, target=target)).run([ys, xs])
    want, = evaluate(g, [ys, xs])
    np.testing.assert_array_equal(got, want)
