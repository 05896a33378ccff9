"""compiler/passes/padding.py: which axes carry the length, what the pass inserts, what it
refuses (and why), and that the padded graph computes, for every length up to the bucket,
what the graph built at that exact length computes (reference interpreter)."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.interp import evaluate
from compiler.ir import Graph, TensorType, verify
from compiler.passes.padding import VALID, PaddingRefused, length_axes, pad_length
from tests.tolerances import assert_close

BUCKET = 8
RNG = np.random.default_rng(0)
W = RNG.standard_normal((6, 6)).astype(np.float32)


def _softmax_over_length(n: int) -> Graph:
    """softmax of x [2, n, 6] over the length (axis 1), as the importers decompose it."""
    g = Graph("softmax")
    x = g.add_input("x", TensorType("f32", (2, n, 6)))
    m = g.op("reduce_max", x, axes=[1], keepdims=True)
    e = g.op("exp", g.op("sub", x, m))
    g.outputs = [g.op("div", e, g.op("reduce_sum", e, axes=[1], keepdims=True))]
    return g


def _attention(n: int, causal_const: bool = False) -> Graph:
    """Self-attention over x [1, n, 6] (one head), projections by matmul, optional causal
    mask built as a constant of the length (as an importer folds torch.triu)."""
    g = Graph("attention")
    x = g.add_input("x", TensorType("f32", (1, n, 6)))
    w = g.const(W, name="w")
    q, k, v = (g.op("matmul", x, w) for _ in range(3))
    mask = []
    if causal_const:
        i = np.arange(n)
        mask = [g.const(np.where(i[None, :] > i[:, None], -np.inf, 0).astype(np.float32),
                        name="causal")]
    a = g.op("attention", q, k, v, *mask, scale=0.5)
    g.outputs = [g.op("add", a, x)]
    return g


def _gram(n: int) -> Graph:
    """x^T @ x over the length: an output with no length axis, summed over padded rows."""
    g = Graph("gram")
    x = g.add_input("x", TensorType("f32", (n, 6)))
    g.outputs = [g.op("matmul", g.op("transpose", g.op("tanh", x), perm=[1, 0]), x)]
    return g


TABLE = RNG.standard_normal((16, 6)).astype(np.float32)


def _positions(n: int) -> Graph:
    """x + table[0..n-1]: positional embeddings gathered by a constant range."""
    g = Graph("positions")
    x = g.add_input("x", TensorType("f32", (1, n, 6)))
    idx = g.const(np.arange(n, dtype=np.int64).reshape(1, n), name="positions")
    g.outputs = [g.op("add", x, g.op("gather", g.const(TABLE, name="table"), idx, axis=0))]
    return g


def _padded(build, bucket: int = BUCKET):
    g = build(bucket)
    padding = pad_length(g, build(bucket - 1), bucket, bucket - 1)
    verify(g)
    return g, padding


def _run_padded(g: Graph, padding, x: np.ndarray, axis: int) -> list:
    n = x.shape[axis]
    widths = [(0, padding.length - n if k == axis else 0) for k in range(x.ndim)]
    outs = evaluate(g, {"x": np.pad(x, widths), VALID: np.arange(padding.length) < n})
    return [o[tuple(slice(0, n) if k in axes else slice(None) for k in range(o.ndim))]
            for o, axes in zip(outs, padding.outputs)]


# -- structural -------------------------------------------------------------------

def test_length_axes_come_from_the_probe_not_from_sizes():
    g = _attention(6)  # the bucket's length equals the model width: sizes cannot tell
    axes = length_axes(g, _attention(5), 6, 5)
    assert axes[g.inputs[0]] == {1}
    assert {axes[g.outputs[0]]} == {frozenset({1})}
    w = next(n.output for n in g.nodes if n.op == "const")
    assert axes[w] == frozenset()  # [6, 6] weights: no length axis


def test_reductions_over_the_length_get_their_identity():
    g, padding = _padded(_softmax_over_length)
    assert padding.inputs == {"x": (1,)} and padding.outputs == [(1,)]
    assert g.inputs[-1].name == VALID and g.inputs[-1].type == TensorType("bool", (BUCKET,))
    fills = {n.inputs[2].producer.attrs["value"].item(): n.output for n in g.nodes
             if n.op == "select"}
    assert set(fills) == {-np.inf, 0.0}  # max reads -inf, sum reads 0 at padded rows
    readers = {n.op for n in g.nodes if any(v in fills.values() for v in n.inputs)}
    assert readers == {"reduce_max", "reduce_sum"}


def test_attention_masks_padded_keys_and_zeroes_keys_and_values():
    g, _ = _padded(_attention)
    att = next(n for n in g.nodes if n.op == "attention")
    assert [v.producer.op for v in att.inputs[1:]] == ["select", "select", "select"]
    key_mask = att.inputs[3].producer
    assert key_mask.inputs[0].name == VALID
    assert key_mask.inputs[2].producer.attrs["value"].item() == -np.inf


def test_position_wise_graph_needs_no_edit():
    def mlp(n):
        g = Graph("mlp")
        x = g.add_input("x", TensorType("f32", (n, 6)))
        g.outputs = [g.op("tanh", g.op("matmul", x, g.const(W, name="w")))]
        return g

    g, padding = _padded(mlp)
    assert not any(n.op == "select" for n in g.nodes) and padding.outputs == [(0,)]


def _refused(build) -> str:
    with pytest.raises(PaddingRefused) as e:
        _padded(build)
    return str(e.value)


def _on_length(make):
    """A graph applying `make(g, x, n)` to x [1, n, 6]."""
    def build(n):
        g = Graph("g")
        x = g.add_input("x", TensorType("f32", (1, n, 6)))
        g.outputs = [make(g, x, n)]
        return g
    return build


@pytest.mark.parametrize("make, reason", [
    # a mean over the length: its 1/n is a constant of the length
    (lambda g, x, n: g.op("mul", g.op("reduce_sum", x, axes=[1]), g.const(np.float32(1 / n))),
     "changes with the length"),
    # the last position
    (lambda g, x, n: g.op("slice", x, starts=[0, n - 1, 0], steps=[1, 1, 1], sizes=[1, 1, 6]),
     "slices length axis"),
    # a start that moves with the length on another axis
    (lambda g, x, n: g.op("slice", g.op("reshape", x, shape=[1, n, 2, 3]), starts=[0, 0, 0, n % 2],
                          steps=[1, 1, 1, 1], sizes=[1, n, 2, 2]), "depends on the length"),
    # the length merged into another axis
    (lambda g, x, n: g.op("reshape", x, shape=[n * 6]), "not the length itself"),
    (lambda g, x, n: g.op("concat", x, x, axis=1), "not the length itself"),
    (lambda g, x, n: g.op("pad", x, pads=[0, 1, 0, 0, 0, 0]), "not the length itself"),
    (lambda g, x, n: g.op("argmax", x, axis=1, select_last=True), "ties"),
    # the second position is padded when n = 1
    (lambda g, x, n: g.op("gather", x, g.const(np.int64(1)), axis=1), "may be padded"),
    (lambda g, x, n: g.op("slice", x, starts=[0, 1, 0], steps=[1, 1, 1], sizes=[1, 1, 6]),
     "slices length axis"),
    # a constant with a length axis whose values move with the length (linspace)
    (lambda g, x, n: g.op("add", x, g.const(
        np.linspace(0, 1, n, dtype=np.float32).reshape(1, n, 1))),
     "at its common positions changes with the length"),
])
def test_refusals_say_why(make, reason):
    assert reason in _refused(_on_length(make))


def test_a_different_graph_at_another_length_is_refused():
    def build(n):  # a size-dependent decision, as a pass might make
        g = Graph("g")
        x = g.add_input("x", TensorType("f32", (1, n, 6)))
        g.outputs = [g.op("neg", x) if n == BUCKET else g.op("abs", x)]
        return g

    assert "different graph" in _refused(build)


def test_nothing_carrying_the_length_is_refused():
    def build(n):
        g = Graph("g")
        x = g.add_input("x", TensorType("f32", (2, 6)))
        g.outputs = [g.op("neg", x)]
        return g

    assert "no input carries the length" in _refused(build)


# -- numeric: every length up to the bucket, against the graph at that length ---------

@pytest.mark.parametrize("build, shape, axis", [
    (_softmax_over_length, lambda n: (2, n, 6), 1),
    (_attention, lambda n: (1, n, 6), 1),
    (lambda n: _attention(n, causal_const=True), lambda n: (1, n, 6), 1),
    (_gram, lambda n: (n, 6), 0),
    (_positions, lambda n: (1, n, 6), 1),
    # the first position alone ([CLS] pooling), by slice and by gather at 0
    (_on_length(lambda g, x, n: g.op("tanh", g.op(
        "slice", x, starts=[0, 0, 0], steps=[1, 1, 1], sizes=[1, 1, 6]))), lambda n: (1, n, 6), 1),
    (_on_length(lambda g, x, n: g.op("gather", x, g.const(np.int64(0)), axis=1)),
     lambda n: (1, n, 6), 1),
    # gather along the length by an arange (position i reads i: HF's mask expansion)
    (_on_length(lambda g, x, n: g.op("gather", x, g.const(np.arange(n).reshape(1, n)),
                                     axis=1)), lambda n: (1, n, 6), 1),
    (_on_length(lambda g, x, n: g.op("reduce_max", x, axes=[1])), lambda n: (1, n, 6), 1),
    (_on_length(lambda g, x, n: g.op("argmin", x, axis=1)), lambda n: (1, n, 6), 1),
    (_on_length(lambda g, x, n: g.op("reduce_prod", g.op("sigmoid", x), axes=[1])),
     lambda n: (1, n, 6), 1),
])
def test_every_length_matches_the_exact_graph(build, shape, axis):
    g, padding = _padded(build)
    for n in range(1, BUCKET + 1):
        x = RNG.standard_normal(shape(n)).astype(np.float32)
        want = evaluate(build(n), {"x": x})
        for got, ref in zip(_run_padded(g, padding, x, axis), want):
            assert_close(got, ref)


def test_padded_rows_holding_nan_do_not_leak():
    """Garbage at padded positions (here NaN from log of the zero padding's negatives)
    is replaced where it is read: select, not a multiply by zero."""
    def build(n):
        g = Graph("g")
        x = g.add_input("x", TensorType("f32", (1, n, 6)))
        bad = g.op("log", g.op("sub", x, g.const(np.float32(1.0))))  # NaN for x < 1
        g.outputs = [g.op("reduce_sum", bad, axes=[1])]
        return g

    g, padding = _padded(build)
    x = (RNG.random((1, 3, 6)) + 2).astype(np.float32)
    got = _run_padded(g, padding, x, 1)[0]
    assert np.isfinite(got).all()
    assert_close(got, evaluate(build(3), {"x": x})[0])
