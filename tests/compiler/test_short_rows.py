"""Loop kernels with short rows (compiler/codegen/short_rows.py): the inner loop runs over
the second-to-last dim, vectorized, the short last dim unrolled inside it; constant pads
along that dim split it into edges and a check-free interior."""

from __future__ import annotations

import re

import numpy as np
import pytest

from compiler.codegen import compile_graph, kernel_facts, llvm_cpu, short_rows
from compiler.interp import evaluate
from compiler.text import parse_graph
from runtime.cpu import CpuStep


def _to_nhwc_padded(c: int, h: int, w: int, pads: list, mode: str = "constant") -> str:
    """A CNN's input conversion: NCHW -> NHWC, then pad (pads in NHWC order)."""
    out = [d + pads[i] + pads[4 + i] for i, d in enumerate((1, h, w, c))]
    return f"""
graph t(%x: f32[1,{c},{h},{w}]) -> (%y) {{
  %t = transpose(%x) {{perm=[0, 2, 3, 1]}} : f32[1,{h},{w},{c}]
  %y = pad(%t) {{pads={pads}, mode="{mode}", value=0.5}} : f32[{",".join(map(str, out))}]
}}"""


def _bias(rows: int, c: int, op: str = "neg") -> str:
    return f"""
graph t(%x: f32[{rows},{c}], %b: f32[{c}]) -> (%y) {{
  %s = add(%x, %b) : f32[{rows},{c}]
  %y = {op}(%s) : f32[{rows},{c}]
}}"""


def _step(text: str, threads: int = 1) -> CpuStep:
    return CpuStep(compile_graph(parse_graph(text, {})), threads=threads)


def _inputs(text: str, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(v.shape).astype(np.float32)
            for v in parse_graph(text, {}).inputs]


def _kernel_code(step: CpuStep) -> str:
    """The optimized LLVM IR of the one kernel's function (inlined into `run` where it
    runs on one thread only)."""
    optimized = str(llvm_cpu.optimize(step.llvm_ir))
    head = re.search(r"define internal void @k0\b|define void @\"?run\b", optimized)
    body = optimized[head.start():]
    return body[:body.index("\n}\n")]


@pytest.mark.parametrize("c", [1, 3, 4, 8])
def test_transpose_pad_runs_vectorized_without_branches_per_element(c):
    """pad(transpose(x)) to f32[1,226,226,C]: one short-row kernel whose rows are the 226
    image rows (not its 51076 pixels), with a pad-free interior of 224 columns, whose loop
    LLVM widens into vector loads and stores (interleaved groups: no gathers)."""
    step = _step(_to_nhwc_padded(c, 224, 224, [0, 1, 1, 0, 0, 1, 1, 0]))
    (k,) = step.kernels
    short = kernel_facts.short_rows(k)
    assert short is not None and short.interior == (1, 225)
    assert kernel_facts.extent(k)[0] == 226
    code = _kernel_code(step)
    assert re.search(r"store <\d+ x float>", code) and re.search(r"load <\d+ x float>", code)
    assert "masked.gather" not in code and "masked.scatter" not in code


@pytest.mark.parametrize("c", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("pads", [[0, 1, 1, 0, 0, 1, 1, 0], [0, 2, 3, 0, 0, 1, 5, 0],
                                  [0, 0, 0, 1, 0, 0, 0, 2], [0, 0, 40, 0, 0, 0, 40, 0],
                                  [1, 0, 9, 0, 0, 0, 0, 0]])
@pytest.mark.parametrize("mode", ["constant", "edge"])
def test_transpose_pad_matches_numpy(c, pads, mode):
    """Exactly numpy's, on one thread and two: pads on every dim (the channels' too, so
    rows past the short limit run row by row), wider than the image, edge mode."""
    text = _to_nhwc_padded(c, 9, 23, pads, mode)
    (x,) = _inputs(text, c)
    widths = [(pads[i], pads[4 + i]) for i in range(4)]
    kwargs = {"constant_values": 0.5} if mode == "constant" else {}
    want = np.pad(x.transpose(0, 2, 3, 1), widths, mode=mode, **kwargs)
    for threads in (1, 2):
        np.testing.assert_array_equal(_step(text, threads).run([x])[0], want)


def test_pad_interior_in_blocks_across_threads():
    """A threaded kernel runs its w dim in blocks; the padded edges and the interior fall
    in different blocks (the interior is clamped to each)."""
    text = """
graph t(%x: f32[1,3,20000]) -> (%y) {
  %t = transpose(%x) {perm=[0, 2, 1]} : f32[1,20000,3]
  %y = pad(%t) {pads=[0, 1500, 0, 0, 2000, 1], mode="constant", value=-2.0} : f32[1,23500,4]
}"""
    (x,) = _inputs(text)
    step = _step(text, threads=2)
    short = kernel_facts.short_rows(step.kernels[0])
    assert short.blocks > 2 and short.interior == (1500, 21500)
    want = np.pad(x.transpose(0, 2, 1), [(0, 0), (1500, 2000), (0, 1)], constant_values=-2.0)
    np.testing.assert_array_equal(step.run([x])[0], want)


@pytest.mark.parametrize("text", [
    # the pad read at two offsets (a strided and a shifted slice): the interior is both's
    """graph t(%x: f32[4,40,3]) -> (%y) {
  %p = pad(%x) {pads=[0, 3, 0, 0, 3, 0], mode="constant", value=0.0} : f32[4,46,3]
  %s = slice(%p) {starts=[0, 0, 0], steps=[1, 2, 1], sizes=[4, 23, 3]} : f32[4,23,3]
  %q = slice(%p) {starts=[0, 6, 0], steps=[1, 1, 1], sizes=[4, 23, 3]} : f32[4,23,3]
  %y = add(%s, %q) : f32[4,23,3]
}""",
    # a pad whose w axis is the transposed input's rows, before math
    """graph t(%x: f32[1,7,33,2]) -> (%y) {
  %t = transpose(%x) {perm=[0, 2, 1, 3]} : f32[1,33,7,2]
  %p = pad(%t) {pads=[0, 2, 1, 0, 0, 2, 1, 0], mode="constant", value=-1.0} : f32[1,37,9,2]
  %y = neg(%p) : f32[1,37,9,2]
}""",
    # concats along w (a branch per element) and along the short dim (folded per copy)
    """graph t(%x: f32[2,30,5], %z: f32[2,10,5]) -> (%y) {
  %c = concat(%x, %z) {axis=1} : f32[2,40,5]
  %y = neg(%c) : f32[2,40,5]
}""",
    """graph t(%x: f32[2,30,5], %z: f32[2,30,2]) -> (%y) {
  %c = concat(%x, %z) {axis=2} : f32[2,30,7]
  %y = abs(%c) : f32[2,30,7]
}""",
    """graph t(%x: f32[64,3,50]) -> (%y) {
  %t = transpose(%x) {perm=[0, 2, 1]} : f32[64,50,3]
  %y = cast(%t) {to="i32"} : i32[64,50,3]
}""",
])
def test_movement_matches_the_interpreter(text):
    xs = [4 * x for x in _inputs(text)]
    step = _step(text, threads=2)
    assert kernel_facts.short_rows(step.kernels[0]) is not None
    for got, want in zip(step.run(xs), evaluate(parse_graph(text, {}), xs)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("rows,c", [(8192, 3), (8192, 12), (37, 5)])
def test_elementwise_with_a_short_last_dim(rows, c):
    """x + bias over short rows, exactly numpy's; tanh of it within float32 rounding,
    vectorized. Rows of 9 to 15 take the short form only with math (SHORT_MATH_ROW)."""
    text = _bias(rows, c)
    x, b = _inputs(text, c)
    step = _step(text, threads=2)
    assert (kernel_facts.short_rows(step.kernels[0]) is not None) == (
        c <= short_rows.SHORT_ROW)
    np.testing.assert_array_equal(step.run([x, b])[0], -(x + b))
    step = _step(_bias(rows, c, "tanh"), threads=2)
    assert kernel_facts.short_rows(step.kernels[0]) is not None
    assert re.search(r"x float>", _kernel_code(step))
    np.testing.assert_allclose(step.run([x, b])[0], np.tanh(x + b), rtol=2e-6, atol=2e-7)


def test_long_rows_and_short_inner_dims_run_row_by_row():
    """A whole vector's row, or a second-to-last dim too short to vectorize: row by row."""
    for text in (_bias(64, 16), _bias(64, 16, "tanh"), """
graph t(%x: f32[512,4,3], %b: f32[3]) -> (%y) {
  %y = add(%x, %b) : f32[512,4,3]
}"""):
        assert kernel_facts.short_rows(_step(text).kernels[0]) is None
