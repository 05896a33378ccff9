"""The compile driver: graph -> plan (passes, the target's passes, clusters, refusal)."""

import numpy as np
import pytest

from compiler import driver
from compiler.errors import CompileError
from compiler.interp import evaluate
from compiler.passes.cluster import CHEAP_REASON, outline
from compiler.text import parse_graph

# exp(x) is cheap and its only neighbour is a host node: with fallback on it is
# demoted to the host, without fallback it stays compiled so the refusal is real.
CHEAP_THEN_HOST = """
graph main(%x: f32[4]) -> (%y) {
  %e = exp(%x) : f32[4]
  %y = host(%e) {framework="onnx", op_type="CumSum", reason="no converter"} : f32[4]
}"""

CONV_RELU = """
graph main(%x: f32[1,3,8,8]) -> (%y) {
  %w = const() {value=@w} : f32[4,3,3,3]
  %c = conv(%x, %w) {strides=[1,1], pads=[1,1,1,1], dilations=[1,1], group=1} : f32[1,4,8,8]
  %zero = const() {value=dense<f32[]: [0.0]>} : f32[]
  %y = max(%c, %zero) : f32[1,4,8,8]
}"""


def _conv_graph():
    w = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    return parse_graph(CONV_RELU, {"w": w})


def test_fallback_demotes_cheap_clusters_and_no_fallback_does_not():
    with_fallback = driver.plan(parse_graph(CHEAP_THEN_HOST), "cpu", allow_fallback=True)
    assert [c.kind for c in with_fallback.clusters] == ["host"]
    assert CHEAP_REASON in with_fallback.clusters[0].reasons.values()
    assert with_fallback.refusal is None
    with_fallback.check()  # nothing refused: no error

    strict = driver.plan(parse_graph(CHEAP_THEN_HOST), "cpu", allow_fallback=False)
    assert [c.kind for c in strict.clusters] == ["compiled", "host"]
    assert strict.refusal == "cannot compile CumSum node 'y': no converter"
    with pytest.raises(CompileError, match=r"CumSum node 'y': no converter \(allow_fallback=False\)"):
        strict.check()


def test_target_passes_convert_convs_on_the_cpu_only():
    assert [p.name for p in driver.TARGET_PASSES] == ["lower_windows", "channels_last",
                                                     "split_long_rows"]
    cpu = driver.plan(_conv_graph(), "cpu")
    conv = next(n for n in cpu.graph.nodes if n.op == "conv")
    assert conv.attrs["layout"] == "NHWC"
    assert all(c.compiled for c in cpu.clusters)
    cuda = driver.plan(_conv_graph(), "cuda")
    conv = next(n for n in cuda.graph.nodes if n.op == "conv")
    assert conv.attrs["layout"] == "NCHW"
    assert "conv" in cuda.describe() and "not compiled" in cuda.describe()


def test_plan_keeps_the_graph_s_values():
    g = _conv_graph()
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    (want,) = evaluate(_conv_graph(), [x])
    p = driver.plan(g, "cpu")
    (c,) = p.clusters
    (got,) = evaluate(outline(p.graph, c), [x])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_first_refusal_names_the_first_host_node_and_describe_is_explain():
    p = driver.plan(parse_graph(CHEAP_THEN_HOST), "cpu", allow_fallback=False)
    assert driver.first_refusal(p.clusters) == p.refusal
    text = p.describe()
    assert text.startswith("cluster 0 (compiled, 1 nodes") and "CumSum 'y' (cluster 1)" in text
    assert driver.first_refusal(driver.plan(_conv_graph(), "cpu").clusters) is None
