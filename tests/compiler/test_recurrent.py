"""The recurrence kernel (compiler/kernels/recurrent.py) against the op's numpy reference
(compiler/ops/recurrence.py): every cell and direction, batch blocks with a tail, hidden
sizes that are not whole vectors, R packed at compile time or at run time, clip,
peepholes, sequence lengths; one kernel per node, and two threads give one's answer."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.codegen import compile_graph
from compiler.ir import Graph, TensorType
from compiler.kernels import choice, recurrent
from runtime.cpu import CpuStep
from tests.compiler.host_forms import host_results

GATES = {"lstm": 4, "gru": 3, "rnn": 1}


def _graph(cell, direction, t, batch, hid, *, lbr=False, const_r=True, clip=0.0,
           peep=False, seed=0, full=False):
    """(graph, its input arrays): a recurrence on an xw input (and R as an input unless
    const_r), random states, lengths 1..T."""
    rng = np.random.default_rng(seed)
    dirs = 2 if direction == "bidirectional" else 1
    gh = GATES[cell] * hid
    g = Graph("rec")
    xw = g.add_input("xw", TensorType("f32", (t * batch, dirs * gh)))
    r_val = (rng.standard_normal((dirs, gh, hid)) * min(0.3, hid ** -0.5)).astype(np.float32)
    r = g.const(r_val) if const_r else g.add_input("r", TensorType("f32", r_val.shape))
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    ins = [xw, r, g.const(f32(dirs, batch, hid)),
           g.const(np.full(batch, t, np.int32) if full else
                   rng.integers(1, t + 1, batch).astype(np.int32))]
    if cell == "lstm":
        ins += [g.const(f32(dirs, batch, hid)), g.const(f32(dirs, 3 * hid) * peep)]
    if cell == "gru":
        ins.append(g.const(f32(dirs, hid)))
    g.outputs = [g.op("recurrence", *ins, cell=cell, direction=direction, clip=clip,
                      linear_before_reset=lbr)]
    arrays = [f32(t * batch, dirs * gh)] + ([] if const_r else [r_val])
    return g, arrays


def _reference(g, arrays):
    node = g.nodes[-1]
    feeds = dict(zip(g.inputs, arrays))
    return node.opdef.evaluate(node, [feeds[v] if v in feeds else v.const_value
                                      for v in node.inputs])[0]


CASES = [(cell, direction, {}) for cell in GATES
         for direction in ("forward", "reverse", "bidirectional")] + [
    ("gru", "forward", {"lbr": True}), ("gru", "bidirectional", {"lbr": True, "clip": 0.7}),
    ("lstm", "reverse", {"peep": True}), ("lstm", "bidirectional", {"clip": 0.5}),
    ("rnn", "forward", {"const_r": False}), ("lstm", "bidirectional", {"const_r": False}),
    ("gru", "reverse", {"const_r": False}),
]


@pytest.mark.parametrize("cell,direction,kw", CASES)
@pytest.mark.parametrize("batch,hid", [(3, 20), (14, 37)])
def test_kernel_matches_reference(cell, direction, kw, batch, hid):
    g, arrays = _graph(cell, direction, 6, batch, hid, **kw)
    y, = CpuStep(compile_graph(g)).run(arrays)
    np.testing.assert_allclose(y, _reference(g, arrays), rtol=1e-5, atol=2e-6)


def test_one_kernel_reading_r_packed():
    g, arrays = _graph("lstm", "forward", 5, 1, 64)
    cg = compile_graph(g)
    [k] = cg.kernels
    assert k.impl.name == choice.RECURRENCE
    assert any(isinstance(key, tuple) and key[0] == "packed" for key in cg.slots)


def test_two_threads_match_one():
    g, arrays = _graph("gru", "bidirectional", 9, 14, 40, seed=3)
    one, = CpuStep(compile_graph(g), threads=1).run(arrays)
    two, = CpuStep(compile_graph(g), threads=2).run(arrays)
    np.testing.assert_array_equal(one, two)


@pytest.mark.parametrize("cell,direction,kw", [
    ("lstm", "bidirectional", {"peep": True, "clip": 0.5}), ("gru", "reverse", {"lbr": True}),
    ("gru", "forward", {}), ("rnn", "bidirectional", {"const_r": False})])
def test_host_forms_match_reference(cell, direction, kw):
    """Where braze does not compile a recurrence (the CUDA target), the host runs it:
    onnxruntime through its ONNX export (the ONNX op on the projected input), torch by
    the reference."""
    g, arrays = _graph(cell, direction, 6, 3, 20, **kw)
    want = _reference(g, arrays)
    on_ort, on_torch = host_results(g, arrays)
    np.testing.assert_allclose(on_ort, want, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(on_torch, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("cell,hid,kw", [("lstm", 128, {"peep": True}), ("rnn", 256, {}),
                                         ("gru", 160, {"lbr": True, "const_r": False}),
                                         ("lstm", 128, {"clip": 0.5, "batch": 3})])
@pytest.mark.parametrize("direction", ["forward", "reverse"])
@pytest.mark.parametrize("target", ["cpu", "cpu:x86-64-v3"])
def test_one_item_splits_its_units_over_the_team(cell, hid, kw, direction, target,
                                                 monkeypatch):
    """With the split on (from R of 256 KiB): one direction, one batch block, full
    lengths: the item's units split over the threads (a barrier per step), each
    thread's share of every gate in groups of panels (AVX-512's 32 columns and AVX2's
    16: shares that divide into the groups or leave a remainder); 1 and 2 threads give
    the reference's answer."""
    monkeypatch.setattr(recurrent, "SPLIT_MIN_R_BYTES", 1 << 18)
    kw = dict(kw)
    batch = kw.pop("batch", 1)
    g, arrays = _graph(cell, direction, 7, batch, hid, full=True, **kw)
    cg = compile_graph(g, target=target)
    [k] = cg.kernels
    assert choice.shape(k.contraction, k.impl).split
    # its threads meet at barriers: an OpenMP team, not braze_parallel's ranges
    assert 'call void @"GOMP_parallel"' in cg.llvm_ir
    assert 'call void @"braze_parallel"' not in cg.llvm_ir
    want = _reference(g, arrays)
    for threads in (1, 2):
        y, = CpuStep(cg, threads=threads).run(arrays)
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=2e-6)


def test_short_sequences_or_gru_second_product_do_not_split(monkeypatch):
    monkeypatch.setattr(recurrent, "SPLIT_MIN_R_BYTES", 1 << 18)
    for g, _ in (_graph("lstm", "forward", 5, 1, 128), _graph("gru", "forward", 5, 1, 160,
                                                               full=True)):
        [k] = compile_graph(g).kernels
        assert not choice.shape(k.contraction, k.impl).split


def test_split_by_default_from_the_size_of_r():
    """By default a one-item layer splits from R of SPLIT_MIN_R_BYTES (256 KiB) on: an
    LSTM of 256 units (1 MiB of R) splits, one of 64 (64 KiB) does not."""
    for hid, splits in ((256, True), (64, False)):
        g, _ = _graph("lstm", "forward", 5, 1, hid, full=True)
        [k] = compile_graph(g).kernels
        assert choice.shape(k.contraction, k.impl).split is splits
