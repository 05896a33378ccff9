"""Which kernel runs a contraction: decided once per fusion-plan kernel, read everywhere.

`choose(node, target)` returns an `Impl`: the implementation's name, its parameters
(Winograd's m, the target's register tile) and the sentence saying why it was picked. fuse.plan stores it
as `Kernel.impl`; cpu.py (rendering, trip counts, code-size estimate), compiled.py
(packed operands) and benchmarks/layers.py read that field, never the refusal
functions below. To add a kernel family, add its name and its rule here.

CPU rules, in order: a matmul with nothing to sum (K = 0) is zeros; one with a constant 2-d float32 right operand runs on the
packed GEMM (gemm.refusal), a float32 one with run-time operands on the same
micro-kernel with B packed at run time (batched.refusal), any other on the row kernel;
attention on its fused kernel; a recurrence (LSTM/GRU/RNN) on its own
(recurrent.py); a scatter on its own (scatter.py); a conv with group > 1
(depthwise included) runs on the grouped direct kernel (grouped.refusal), any other on
Winograd F(m x m, 3 x 3) where winograd.refusal accepts it (m from
winograd.tile_size), else on the direct implicit GEMM (conv.py). CUDA: a matmul runs
on the shared-memory tile kernel (codegen/cuda.py); other contractions are not
compiled there.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from compiler import target as targets
from compiler.ir import Node
from compiler.kernels import (attention, batched, conv, gemm, grouped, recurrent, scatter,
                              winograd)

GEMM = "gemm"  # packed register-blocked GEMM (gemm.py)
BATCHED = "batched_gemm"  # run-time operands, B packed per call and thread (batched.py)
ATTENTION = "attention"  # fused attention, one query block at a time (attention.py)
RECURRENCE = "recurrence"  # an LSTM/GRU/RNN time loop in one kernel (recurrent.py)
SCATTER = "scatter"  # copy, then the updates at run-time positions in order (scatter.py)
ROW_MATMUL = "row_matmul"  # one output row per work item, vectorized over columns (cpu.py)
GROUPED = "grouped"  # direct channels-last conv with group > 1, depthwise too (grouped.py)
WINOGRAD = "winograd"  # Winograd F(m x m, 3 x 3) (winograd.py)
DIRECT_CONV = "direct_conv"  # direct implicit GEMM on channels-last input (conv.py)
TILED_MATMUL = "tiled_matmul"  # CUDA: TILE x TILE outputs per block (codegen/cuda.py)
EMPTY_MATMUL = "empty_matmul"  # K = 0: zeros through the epilogue, a loop kernel (cpu.py)


@dataclass(frozen=True)
class Impl:
    """A contraction kernel's implementation: `name` (one of the constants above),
    `reason` (why this one), `m` (Winograd's F(m x m); None elsewhere) and `tile` (the
    target's register tile, gemm.Tile, for the CPU kernels; None on cuda)."""

    name: str
    reason: str
    m: int | None = None
    tile: gemm.Tile | None = None

    @property
    def label(self) -> str:
        return f"{self.name} F({self.m}x{self.m})" if self.name == WINOGRAD else self.name

    @property
    def packs_operands(self) -> bool:
        """Whether the kernel reads its constant operands packed at compile time."""
        return self.name in (GEMM, GROUPED, WINOGRAD, DIRECT_CONV, RECURRENCE)


def choose(node: Node, target=targets.HOST) -> Impl:
    """The implementation of contraction `node` on `target` ("cuda", or a CPU Target or
    spec; see the module docstring)."""
    if targets.kind(target) == "cuda":
        return Impl(TILED_MATMUL, "CUDA: shared-memory tiles, one output per thread")
    tile = gemm.Tile.of(targets.parse(target))
    if node.op == "matmul" and node.inputs[0].shape[-1] == 0:
        return Impl(EMPTY_MATMUL, "nothing to sum (K = 0): the product is zeros, so the "
                    "kernel is its epilogue applied to zero (the tile kernels assume one "
                    "product at least)", tile=tile)
    if node.op == "matmul":
        reason = gemm.refusal(node)
        if reason is None:
            return Impl(GEMM, "float32 with a constant 2-d right operand, packed at compile "
                        "time", tile=tile)
        why = batched.refusal(node)
        if why is None:
            return Impl(BATCHED, f"not the packed GEMM ({reason}): B packed at run time",
                        tile=tile)
        return Impl(ROW_MATMUL, f"not the packed GEMM: {reason}; not the run-time-packed "
                    f"one: {why}", tile=tile)
    if node.op == "attention":
        whole = attention.AttentionShape.of(node, tile).whole_rows
        softmax = (f"a two-pass softmax over all {node.inputs[1].shape[-2]} keys (at most "
                   f"WHOLE_ROW_MAX_KEYS={attention.WHOLE_ROW_MAX_KEYS}, not causal)"
                   if whole else "online softmax over key tiles")
        return Impl(ATTENTION, "one kernel per query block: scores on the micro-kernel, "
                    f"{softmax}", tile=tile)
    if node.op == "recurrence":
        return Impl(RECURRENCE, "the time loop in one kernel: per step h x R^T on R^T's "
                    "panels (packed at compile time when constant), then the gate math",
                    tile=tile)
    if node.op == "scatter":
        items = scatter.ScatterShape.of(node).items
        return Impl(SCATTER, f"data copied, then the updates in order; {items} item(s), "
                    "each owning a run of rows", tile=tile)
    if node.op == "conv" and grouped.refusal(node) is None:
        return Impl(GROUPED, "group > 1: direct channels-last kernel vectorized over output "
                    "channels", tile=tile)
    if node.op == "conv":
        reason = winograd.refusal(node, tile)
        if reason is None:
            m = winograd.plan(node, tile).m
            return Impl(WINOGRAD, f"3x3 stride-1 conv; F({m}x{m}) by its transformed "
                        "weight's size and tile count (winograd.tile_size)", m=m, tile=tile)
        return Impl(DIRECT_CONV, f"not Winograd: {reason}", tile=tile)
    raise AssertionError(f"no kernel choice for contraction {node.op}")


def shape(node: Node, impl: Impl):
    """The kernel shape `impl` works on: gemm.GemmShape, grouped.GroupedShape,
    winograd.WinogradShape (its tile size set) or conv.ConvShape; None for the row matmul."""
    if impl.name == GEMM:
        return gemm.GemmShape.of(node, impl.tile)
    if impl.name == GROUPED:
        return grouped.plan(node, impl.tile)
    if impl.name == BATCHED:
        return batched.BatchedShape.of(node, impl.tile)
    if impl.name == ATTENTION:
        return attention.AttentionShape.of(node, impl.tile)
    if impl.name == RECURRENCE:
        return recurrent.RecurrenceShape.of(node, impl.tile)
    if impl.name == SCATTER:
        return scatter.ScatterShape.of(node)
    if impl.name == WINOGRAD:
        return dataclasses.replace(winograd.WinogradShape.of(node, impl.tile), m=impl.m)
    if impl.name == DIRECT_CONV:
        return conv.ConvShape.of(node, impl.tile)
    return None
