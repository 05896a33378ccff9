"""compiler/passes/split_rows.py: a long single row reduced in two stages."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.codegen import compile_graph
from compiler.interp import evaluate
from compiler.ir import Graph, TensorType, verify
from compiler.passes.split_rows import SPLIT_MIN_ELEMENTS, split_long_rows
from runtime.cpu import CpuStep


def _row_sum(shape, op="reduce_sum", axes=(-1,), keepdims=True) -> Graph:
    g = Graph("rows")
    x = g.add_input("x", TensorType("f32", shape))
    axes = tuple(a % len(shape) for a in axes)
    g.outputs = [g.op(op, g.op("exp", x), axes=axes, keepdims=keepdims)]
    return g


@pytest.mark.parametrize("op", ["reduce_sum", "reduce_max", "reduce_min"])
@pytest.mark.parametrize("keepdims", [True, False])
def test_one_long_row_reduces_in_two_stages(op, keepdims):
    """One row of 200704 (a 1-group GroupNorm's sample at 56 x 56 x 64): 16 rows of
    12544 first (threaded), then their 16 partial results; the same numbers."""
    shape = (1, 1, 200704)
    g = _row_sum(shape, op, keepdims=keepdims)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    want = evaluate(_row_sum(shape, op, keepdims=keepdims), [x])[0]
    assert split_long_rows(g, "cpu")
    verify(g)
    reductions = [n for n in g.nodes if n.op == op]
    assert [n.inputs[0].shape for n in reductions] == [(1, 1, 16, 12544), (1, 1, 16, 1)]
    assert g.outputs[0].shape == want.shape
    compiled = compile_graph(g)
    assert [tuple(k.root.shape) for k in compiled.kernels if k.kind == "row"][0] == \
        (1, 1, 16, 1)
    got = CpuStep(compiled).run([x])[0]
    np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize("shape,axes,target,why", [
    ((2, 1, 200704), (-1,), "cpu", "two rows: each thread has one"),
    ((1, SPLIT_MIN_ELEMENTS // 2), (-1,), "cpu", "a short row"),
    ((1, 200704, 2), (1,), "cpu", "not the last axis"),
    ((1, 200707), (-1,), "cpu", "no part count divides the row"),
    ((1, 200704), (-1,), "cuda", "not a CPU target"),
])
def test_other_reductions_stay_whole(shape, axes, target, why):
    g = _row_sum(shape, axes=axes)
    assert not split_long_rows(g, target), why
