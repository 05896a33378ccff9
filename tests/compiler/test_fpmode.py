"""Denormals in braze's CPU kernels (compiler/codegen/fpmode.py): summing kernels
(contractions, reductions) flush them, element-wise kernels keep IEEE gradual underflow,
and the caller's thread gets its own mode back."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.codegen import compile_graph, fpmode
from compiler.target import host
from compiler.text import parse_graph
from runtime.cpu import CpuStep

pytestmark = pytest.mark.skipif(not fpmode.supported(host().triple),
                                reason="braze sets the float mode on x86-64 and AArch64 only")

TINY = np.float32(3e-39)  # a float32 denormal (the least normal is 1.18e-38)

# a matmul (a summing kernel) then, in a kernel of its own, a multiply of the graph's
# input (element-wise: IEEE): %s keeps %a's denormals, %m reads them as zero
GRAPH = """
graph g(%a: f32[64,64], %w: f32[64,64]) -> (%m, %s) {
  %m = matmul(%a, %w) : f32[64,64]
  %s = mul(%a, %w) : f32[64,64]
}
"""


def _program():
    return compile_graph(parse_graph(GRAPH))


def _inputs():
    a = np.full((64, 64), TINY, np.float32)
    a[0, 0] = 1.0  # one normal entry: row 0 of the product is not all denormal
    w = np.eye(64, dtype=np.float32)
    return a, w


@pytest.mark.parametrize("threads", [1, 2])
def test_summing_kernels_flush_elementwise_kernels_keep_denormals(threads):
    a, w = _inputs()
    m, s = CpuStep(_program(), threads=threads).run([a, w])
    # the matmul reads a's denormals as zero (IEEE would give a itself: w is I)
    assert m[0, 0] == 1.0
    assert not m[1:].any() and not m[0, 1:].any()
    # the element-wise multiply gives IEEE's bits, denormals kept, on every thread
    np.testing.assert_array_equal(s, a * w)
    assert s[5, 5] == TINY


def test_caller_mode_is_put_back():
    """After a call numpy's arithmetic on this thread still makes denormals."""
    a, w = _inputs()
    CpuStep(_program(), threads=2).run([a, w])
    x = np.array([TINY], np.float32)
    assert (x * np.float32(1.0))[0] == TINY
    assert (x / np.float32(2.0))[0] == np.float32(1.5e-39)


def test_each_kernel_sets_its_mode_and_the_entry_restores():
    """The IR: every kernel reads the control register and writes it on a change; the
    entry saves the caller's mode first and writes it back last."""
    ir_text = _program().llvm_ir
    if host().arch == "x86_64":
        read, write = "llvm.x86.sse.stmxcsr", "llvm.x86.sse.ldmxcsr"
    else:
        read, write = "llvm.aarch64.get.fpcr", "llvm.aarch64.set.fpcr"
    functions = ir_text.split("\ndefine ")[1:]
    kernels = [f for f in functions if f.split("(")[0].split("@")[-1].strip('"').startswith("k")]
    assert len(kernels) >= 2
    assert all(read in f and write in f for f in kernels)
    run = next(f for f in functions if f.split("(")[0].endswith(("@run", '@"run"')))
    calls = [line for line in run.splitlines() if "call " in line]
    assert read in calls[0]  # the caller's mode, saved before any kernel runs
    assert write in calls[-1]  # and put back after the last
