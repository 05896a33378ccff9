"""The `scatter` op (compiler/ops/scatter.py) and its CPU kernel (compiler/kernels/
scatter.py): data copied, then the updates applied at run-time flat positions in order.
Structure (its own kernel, operands read inline, never fused into a loop), numbers
against the numpy reference for every reduction with repeated positions, f32 / i64 /
bool data and i32 / i64 indices, a result cut into several items over threads, an index
out of range raising BrazeIndexError, the host forms (onnxruntime, torch) and the CUDA
refusal."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.codegen import compile_graph, supports
from compiler.errors import BrazeIndexError
from compiler.interp import evaluate
from compiler.ir import Graph, IRError, TensorType
from compiler.kernels import choice, scatter as scatter_kernel
from compiler.passes.fuse import plan
from compiler.passes.simplify import fold_constants
from compiler.text import parse_graph, print_graph
from runtime.cpu import CpuStep
from tests.compiler.host_forms import host_results

RNG = np.random.default_rng(0)
REDUCTIONS = ["none", "add", "mul", "max", "min"]
NP = {"f32": np.float32, "i64": np.int64, "i32": np.int32, "bool": np.bool_}


def _graph(shape, n, reduction="none", dtype="f32", index="i64") -> Graph:
    g = Graph("scatter")
    d = g.add_input("d", TensorType(dtype, shape))
    i = g.add_input("i", TensorType(index, (n,)))
    u = g.add_input("u", TensorType(dtype, (n,)))
    g.outputs = [g.op("scatter", d, i, u, name="put", reduction=reduction)]
    return g


def _values(shape, n, dtype, index, repeats=True):
    total = int(np.prod(shape))
    if dtype == "bool":
        d, u = RNG.random(shape) < 0.5, RNG.random(n) < 0.5
    elif dtype == "f32":
        d = RNG.standard_normal(shape).astype(np.float32)
        u = RNG.standard_normal(n).astype(np.float32)
    else:
        d = RNG.integers(-5, 6, shape).astype(NP[dtype])
        u = RNG.integers(-5, 6, n).astype(NP[dtype])
    i = RNG.integers(0, min(total, n // 2 + 1) if repeats else total, n).astype(NP[index])
    return [np.asarray(d), i, u]


# -- the op ----------------------------------------------------------------------

def test_reference_applies_updates_in_order():
    g = _graph((5,), 4)
    d = np.zeros(5, np.float32)
    i = np.array([1, 3, 1, 4])
    u = np.array([10, 20, 30, 40], np.float32)
    np.testing.assert_array_equal(evaluate(g, [d, i, u])[0], [0, 30, 0, 20, 40])
    for red, want in [("add", [0, 40, 0, 20, 40]), ("max", [0, 30, 0, 20, 40]),
                      ("mul", [0, 0, 0, 0, 0]), ("min", [0, 0, 0, 0, 0])]:
        np.testing.assert_array_equal(evaluate(_graph((5,), 4, red), [d, i, u])[0], want)
    with pytest.raises(IRError, match="out of range"):
        evaluate(g, [d, np.array([0, 1, 2, 5]), u])


def test_type_checks():
    g = Graph("bad")
    d = g.add_input("d", TensorType("f32", (4,)))
    i = g.add_input("i", TensorType("i64", (2,)))
    with pytest.raises(IRError, match="differ in shape"):
        g.op("scatter", d, i, g.add_input("u", TensorType("f32", (3,))))
    with pytest.raises(IRError, match="updates are i64"):
        g.op("scatter", d, i, g.add_input("v", TensorType("i64", (2,))))
    with pytest.raises(IRError, match="reduction"):
        g.op("scatter", d, i, g.add_input("w", TensorType("f32", (2,))), reduction="mean")
    b = g.add_input("b", TensorType("bool", (4,)))
    with pytest.raises(IRError, match="reduction add of bool"):
        g.op("scatter", b, i, g.add_input("c", TensorType("bool", (2,))), reduction="add")


def test_text_round_trip_and_constant_folding():
    g = _graph((3, 4), 5, "add")
    assert "reduction" in print_graph(g)
    back = parse_graph(print_graph(g))
    arrays = _values((3, 4), 5, "f32", "i64")
    np.testing.assert_array_equal(evaluate(back, arrays)[0], evaluate(g, arrays)[0])
    c = Graph("consts")
    d, i, u = (c.const(a) for a in arrays)
    c.outputs = [c.op("scatter", d, i, u, reduction="add")]
    assert fold_constants(c) and c.outputs[0].producer.op == "const"


# -- structure -------------------------------------------------------------------

def test_own_kernel_operands_inline_and_no_epilogue():
    """zeros.scatter_add(positions computed from an index, updates * 2), then a ReLU: the
    scatter kernel computes the zeros, positions and updates inline (no buffers), and
    the ReLU is a loop kernel of its own, never the scatter's epilogue."""
    g = Graph("gnn")
    idx = g.add_input("i", TensorType("i32", (6,)))
    src = g.add_input("s", TensorType("f32", (6, 4)))
    zeros = g.op("broadcast", g.const(np.array(0, np.float32)), shape=(3, 4))
    row = g.op("mul", g.op("cast", idx, to="i64"), g.const(np.array(4, np.int64)))
    flat = g.op("add", g.op("reshape", row, shape=(6, 1)), g.const(np.arange(4, dtype=np.int64)))
    upd = g.op("mul", src, g.const(np.array(2, np.float32)))
    y = g.op("scatter", zeros, flat, upd, reduction="add")
    g.outputs = [g.op("max", y, g.const(np.array(0, np.float32)))]
    kp = plan(g)
    assert [k.kind for k in kp.kernels] == ["contraction", "loop"]
    first = kp.kernels[0]
    assert first.impl.name == choice.SCATTER and first.root is y
    assert {n.op for n in first.nodes} >= {"broadcast", "cast", "mul", "add", "scatter"}
    assert set(kp.materialized) == {y, g.outputs[0]}
    i = RNG.integers(0, 3, 6).astype(np.int32)
    s = RNG.standard_normal((6, 4)).astype(np.float32)
    got, = CpuStep(compile_graph(g)).run([i, s])
    np.testing.assert_allclose(got, evaluate(g, [i, s])[0], rtol=1e-6)


def test_cuda_refuses_with_a_reason():
    g = _graph((4,), 2)
    assert "scatter" in supports(g.nodes[-1], "cuda")
    assert supports(g.nodes[-1], "cpu") is None


# -- numbers ---------------------------------------------------------------------

@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype,index", [("f32", "i64"), ("i64", "i32")])
def test_matches_reference_with_repeated_positions(reduction, dtype, index):
    shape, n = (6, 5), 40  # ~2 writes per touched position
    g = _graph(shape, n, reduction, dtype, index)
    arrays = _values(shape, n, dtype, index)
    assert len(np.unique(arrays[1])) < n
    got, = CpuStep(compile_graph(g)).run(arrays)
    want = evaluate(g, arrays)[0]
    if dtype == "f32":
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)  # same order of adds
    else:
        np.testing.assert_array_equal(got, want)


def test_bool_data_and_a_scalar():
    g = _graph((7,), 5, "none", "bool")
    arrays = _values((7,), 5, "bool", "i64")
    np.testing.assert_array_equal(CpuStep(compile_graph(g)).run(arrays)[0],
                                  evaluate(g, arrays)[0])
    g = _graph((), 3, "add")
    arrays = [np.array(1.5, np.float32), np.zeros(3, np.int64), np.ones(3, np.float32)]
    assert CpuStep(compile_graph(g)).run(arrays)[0] == np.float32(4.5)


def test_nan_propagates_through_max():
    g = _graph((3,), 2, "max")
    d = np.array([0, 1, 2], np.float32)
    got, = CpuStep(compile_graph(g)).run([d, np.array([0, 2]), np.array([np.nan, 5],
                                                                         np.float32)])
    assert np.isnan(got[0]) and got[1] == 1 and got[2] == 5


@pytest.mark.parametrize("threads", [1, 2])
def test_a_large_result_splits_into_items_that_keep_the_order(threads, monkeypatch):
    """Each item owns a run of rows and walks every update: repeated positions still
    end in update order whichever thread owns them."""
    monkeypatch.setattr(scatter_kernel, "COPY_BLOCK", 1 << 12)
    shape, n = (256, 256), 48
    g = _graph(shape, n, "none")
    [k] = plan(g).kernels
    assert choice.shape(k.contraction, k.impl).items == 16
    program = compile_graph(g)
    assert 'call void @"braze_parallel"' in program.llvm_ir
    d = RNG.standard_normal(shape).astype(np.float32)
    i = np.concatenate([RNG.integers(0, d.size, n - 8), [5, 5, 16000, 16000] * 2])
    u = np.arange(n, dtype=np.float32)
    got, = CpuStep(program, threads=threads).run([d, i, u])
    np.testing.assert_array_equal(got, evaluate(g, [d, i, u])[0])
    assert got.reshape(-1)[5] == n - 3 and got.reshape(-1)[16000] == n - 1


@pytest.mark.parametrize("bad", [30, -1, 1 << 40])
def test_an_index_out_of_range_raises_index_error(bad):
    g = _graph((5, 6), 4)
    step = CpuStep(compile_graph(g))
    d, i, u = _values((5, 6), 4, "f32", "i64")
    step.run([d, i, u])
    i[2] = bad
    with pytest.raises(BrazeIndexError, match="scatter") as e:
        step.run([d, i, u])
    assert isinstance(e.value, IndexError)
    step.run([d, np.zeros(4, np.int64), u])  # the fault word was cleared


def test_constant_positions_in_range_need_no_check():
    g = Graph("c")
    d = g.add_input("d", TensorType("f32", (8,)))
    u = g.add_input("u", TensorType("f32", (3,)))
    g.outputs = [g.op("scatter", d, g.const(np.array([1, 7, 1])), u, reduction="add")]
    from compiler.codegen import faults

    assert faults.FAULTS not in compile_graph(g).slots
    d0, u0 = np.zeros(8, np.float32), np.array([1, 2, 3], np.float32)
    np.testing.assert_array_equal(CpuStep(compile_graph(g)).run([d0, u0])[0],
                                  [0, 4, 0, 0, 0, 0, 0, 2])


# -- host forms ------------------------------------------------------------------

@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_host_forms_match_reference(reduction):
    torch = pytest.importorskip("torch")
    from runtime.fallback_torch import TorchHostStep

    g = _graph((4, 5), 12, reduction, "f32", "i32")
    arrays = _values((4, 5), 12, "f32", "i32")
    want = evaluate(g, arrays)[0]
    on_ort, on_torch = host_results(g, arrays)
    np.testing.assert_allclose(on_ort, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(on_torch, want, rtol=1e-6, atol=1e-6)
    arrays[1][0] = 20  # out of range: an IndexError on the host too
    with pytest.raises(IndexError):
        TorchHostStep(g, {})([torch.from_numpy(a) for a in arrays])
