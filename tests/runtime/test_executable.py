"""Executable: steps over slots, intermediates dropped after their last reader, outputs that
never alias inputs, constants or each other, several threads at once."""

import threading
import time
import weakref

import numpy as np

from compiler.interp import evaluate
from compiler.ir import Graph, TensorType
from compiler.passes.cluster import outline, singletons
from runtime.executable import build_executable
from runtime.fallback_onnx import OnnxHostStep


def _chain() -> Graph:
    """x -> exp -> neg -> abs -> out, plus x + 1 as a second output."""
    g = Graph()
    x = g.add_input("x", TensorType("f32", (4,)))
    a = g.op("exp", x, name="a")
    b = g.op("neg", a, name="b")
    g.outputs = [g.op("abs", b, name="c"), g.op("add", x, g.const(np.ones(4, np.float32)))]
    return g


class _Recorder:
    """A step that evaluates its cluster with numpy and keeps weak references to what it
    produced, so tests can see when the executable lets go of an intermediate."""

    def __init__(self, sub: Graph, log: list, alive: dict):
        self.sub, self.log, self.alive = sub, log, alive

    def __call__(self, arrays):
        self.log.append((self.sub.name, {k for k, r in self.alive.items() if r() is not None}))
        outs = [np.array(o) for o in evaluate(self.sub, arrays)]  # fresh, weak-referenceable
        for v, o in zip(self.sub.outputs, outs):
            self.alive[v.name] = weakref.ref(o)
        return outs


def _build(g: Graph, log=None, alive=None):
    log = [] if log is None else log
    alive = {} if alive is None else alive
    clusters = singletons(g)
    return build_executable(g, clusters, [_Recorder(outline(g, c), log, alive) for c in clusters])


def test_runs_in_order_and_matches_the_interpreter():
    g = _chain()
    x = np.array([0, 1, -2, 3], np.float32)
    got = _build(g).run([x])
    for a, b in zip(got, evaluate(g, [x])):
        np.testing.assert_allclose(a, b)


def test_intermediates_are_dropped_after_their_last_reader():
    g = _chain()
    log, alive = [], {}
    _build(g, log, alive).run([np.ones(4, np.float32)])
    live_at = dict(log)  # singletons: cluster0 exp, cluster1 neg, cluster2 abs, cluster3 add
    # when abs runs, exp's output (read only by neg) is gone; neg's is still held
    assert "a" not in live_at["cluster2"] and "b" in live_at["cluster2"]


def test_outputs_never_alias_inputs_constants_or_each_other():
    g = Graph()
    x = g.add_input("x", TensorType("f32", (3,)))
    c = g.const(np.arange(3, dtype=np.float32), "c")
    y = g.op("exp", x)
    g.outputs = [x, c, y, y]
    x_val = np.zeros(3, np.float32)
    out = _build(g).run([x_val])
    assert not np.shares_memory(out[0], x_val)
    assert not np.shares_memory(out[1], c.producer.attrs["value"])
    assert not np.shares_memory(out[2], out[3])
    out[1][0] = 42  # writable, and the constant is untouched
    assert c.producer.attrs["value"][0] == 0


def test_several_threads_share_one_executable():
    g = _chain()
    clusters = singletons(g)
    exe = build_executable(g, clusters,
                           [_slow(OnnxHostStep(outline(g, c), threads=1)) for c in clusters])
    inputs = [np.full(4, i, np.float32) for i in range(8)]
    results = [None] * len(inputs)

    def work(i):
        for _ in range(5):
            results[i] = exe.run([inputs[i]])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for x, got in zip(inputs, results):
        for a, b in zip(got, evaluate(g, [x])):
            np.testing.assert_allclose(a, b, rtol=1e-6)


def _slow(step):
    """The step, with a pause that lets other threads interleave between steps."""
    def run(arrays):
        time.sleep(0.001)
        return step(arrays)
    return run
