"""benchmarks/layers.py: the FMA peak probe and the per-layer table (the ResNet-50
profile itself is the benchmark; here a small conv graph stands in for it)."""

from __future__ import annotations

import numpy as np

from benchmarks import layers
from compiler.codegen import compile_graph
from compiler.text import parse_graph
from runtime.cpu import CpuStep


def test_peak_probe_counts_flops(monkeypatch):
    monkeypatch.setattr(layers, "PEAK_ITERS", 100_000)
    one = layers.fma_peak_gflops(1)
    assert 1 < one < 1e4  # GFLOP/s of one core: a number, not a timer artefact
    # another target's probe runs here, with as many chains as its registers hold (24
    # AVX2 chains spilled: the probe read half the peak)
    from compiler import target as targets

    assert 1 < layers.fma_peak_gflops(1, "cpu:x86-64-v2") < 1e4
    assert layers.peak_chains(targets.parse("cpu:x86-64-v3")) == 14
    assert layers.peak_chains(targets.parse("cpu:skylake-avx512")) == layers.ACCUMULATORS


def test_describe_names_shape_algorithm_and_counts_direct_macs():
    w = np.ones((32, 16, 3, 3), np.float32)
    g = parse_graph("""
graph c(%x: f32[1,12,12,16]) -> (%y) {
  %w = const() {value=@w} : f32[32,16,3,3]
  %y = conv(%x, %w) {strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1], group=1, layout="NHWC"} : f32[1,12,12,32]
}
""", {"w": w})
    cg = CpuStep(compile_graph(g))
    label, macs = layers.describe(cg.kernels[0])
    assert label.startswith("3x3 s1 16->32 @ 12x12 (Winograd F(")
    assert macs == 12 * 12 * 32 * 16 * 9
    (seconds,) = cg.profile([np.ones((1, 12, 12, 16), np.float32)], rounds=2)
    table = layers.report({"rows": {label: {"layers": 1, "seconds": seconds, "macs": macs}},
                           "other_s": 0.0, "total_s": seconds, "kernels": 1},
                          peak=100.0, threads=1, batch=1)
    assert label in table and "of peak" in table
