"""The kernel choice of a contraction: made once (compiler/kernels/choice.py), stored on
the fusion plan's kernel (`Kernel.impl`, with its reason), read by codegen, packing and
the benchmarks; nothing else re-decides it."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from compiler.codegen import compile_graph
from compiler.interp import evaluate
from compiler.kernels import choice
from compiler.passes.fuse import plan
from compiler.text import parse_graph
from runtime.cpu import CpuStep

ROOT = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(7)


def _conv(k: int, stride: int, cin: int, cout: int, side: int = 8):
    w = RNG.standard_normal((cout, cin, k, k)).astype(np.float32)
    p = k // 2
    out = (side + 2 * p - k) // stride + 1
    return parse_graph(f"""
graph c(%x: f32[1,{side},{side},{cin}]) -> (%y) {{
  %w = const() {{value=@w}} : f32[{cout},{cin},{k},{k}]
  %y = conv(%x, %w) {{strides=[{stride}, {stride}], pads=[{p}, {p}, {p}, {p}], dilations=[1, 1], group=1, layout="NHWC"}} : f32[1,{out},{out},{cout}]
}}
""", {"w": w})


def _matmul(const: bool):
    w = RNG.standard_normal((16, 24)).astype(np.float32)
    head = "%a: f32[8,16]" + ("" if const else ", %w: f32[16,24]")
    body = "  %w = const() {value=@w} : f32[16,24]\n" if const else ""
    return parse_graph(f"""
graph m({head}) -> (%y) {{
{body}  %y = matmul(%a, %w) : f32[8,24]
}}
""", {"w": w} if const else None)


def _empty_matmul():
    return parse_graph("""
graph m(%a: f32[8,0], %w: f32[0,24]) -> (%y) {
  %y = matmul(%a, %w) : f32[8,24]
}
""")


def _int_matmul():
    return parse_graph("""
graph m(%a: i32[8,16], %w: i32[16,24]) -> (%y) {
  %y = matmul(%a, %w) : i32[8,24]
}
""")


CASES = [
    ("winograd", lambda: _conv(3, 1, 16, 32, side=12), "3x3 stride-1"),  # 36 2x2 tiles
    ("direct_conv", lambda: _conv(1, 1, 16, 32), "not Winograd: not a 3x3"),
    ("direct_conv", lambda: _conv(3, 2, 16, 32), "not Winograd"),
    ("gemm", lambda: _matmul(True), "constant 2-d right operand"),
    ("batched_gemm", lambda: _matmul(False), "B packed at run time"),
    ("row_matmul", lambda: _int_matmul(), "not the run-time-packed one: dtype i32"),
    ("empty_matmul", lambda: _empty_matmul(), "nothing to sum (K = 0)"),
]


@pytest.mark.parametrize("name, make, why", CASES)
def test_each_contraction_kernel_records_its_implementation_and_why(name, make, why):
    g = make()
    (k,) = plan(g).kernels
    assert k.impl.name == name and why in k.impl.reason
    assert f"[{k.impl.label}: " in plan(g).explain()
    if name == "winograd":
        assert k.impl.m in (2, 4) and k.impl.label == f"winograd F({k.impl.m}x{k.impl.m})"


@pytest.mark.parametrize("name, make, why", CASES)
def test_the_recorded_implementation_runs_and_matches_the_interpreter(name, make, why):
    g = make()
    program = compile_graph(g)
    assert program.kernels[0].impl.name == name
    xs = [RNG.standard_normal(v.shape).astype(np.float32) for v in g.inputs]
    got = CpuStep(program).run(xs)[0]
    np.testing.assert_allclose(got, evaluate(g, xs)[0], rtol=1e-4, atol=1e-4)


def test_cuda_plans_record_the_tile_kernel():
    (k,) = plan(_matmul(True), target="cuda").kernels
    assert k.impl.name == choice.TILED_MATMUL


def test_no_module_but_the_choice_decides_a_kernel():
    """The kernel refusals (gemm/winograd) and Winograd's tile size are asked only by
    choice.py (and by the kernels themselves); conv.refusal also by codegen's legality
    check (what the layout pass converts), which is not a kernel choice."""
    pattern = re.compile(r"\b(gemm\.refusal|batched\.refusal|winograd\.refusal|winograd\.plan"
                         r"|tile_size)\(")
    # batched.refusal defers to gemm.refusal (a constant B belongs to the packed GEMM)
    allowed = {"compiler/kernels/choice.py", "compiler/kernels/winograd.py",
               "compiler/kernels/batched.py"}
    found = []
    for folder in ("compiler", "benchmarks", "bridge", "runtime"):
        for path in (ROOT / folder).rglob("*.py"):
            rel = str(path.relative_to(ROOT))
            if rel not in allowed and pattern.search(path.read_text()):
                found.append(rel)
    assert found == []
