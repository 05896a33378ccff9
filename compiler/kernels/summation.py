"""Long float32 sums in blocks: the micro-kernel's accumulators restart every few hundred
K steps and the blocks' partial tiles are added.

A K-long sum accumulated in one register (gemm.accumulate: one FMA per K step into the
same accumulator) rounds at every step relative to the running sum, which grows like
sqrt(K) for zero-mean terms: its error grows like K (relative to the result: sqrt(K)).
Summed in blocks of L steps, each block's error grows like L and the blocks' errors
add up like sqrt(K / L), so the relative error shrinks by about sqrt(K / L). That is
what BLAS libraries get from their K blocking (MKL, OpenBLAS, oneDNN accumulate C over
K blocks of a few hundred), and what the stock runtimes braze is compared against get:
summed straight through, BERT's 768- and 3072-long rows had 2x and 4x torch's rms error
against float64, in blocks 0.85x (tests/compiler/test_summation.py). The cost is a
vector add per accumulator per block, and where the tile fills the registers a spill
and a reload of the partial tile around the block's K loop: 1-5% of a 1x1 or 5x5 conv
of 48..288 channels in isolation, 2-3% over Inception-v3 (Winograd's blocks with
them), nothing measurable on ResNet-50 (one thread, interleaved runs, load ~6).

Callers pass `block` where their sums are amplified: Winograd's per-position GEMMs go
through its output transform, whose entries up to 27/8 multiply their rounding
(winograd.SUM_BLOCK).
"""

from __future__ import annotations

from llvmlite import ir

from compiler.kernels import gemm  # gemm imports this module: attributes read at call time

# K steps per partial sum, at most: long enough that the per-block add is ~1% of the
# block's FMAs, short enough that a 768..4096-long row (transformer projections, the
# classifiers' 2048) is 6-32 blocks.
SUM_BLOCK = 128


def _i64(n: int) -> ir.Constant:
    return ir.Constant(gemm.I64, int(n))


def blocks(k: int, block: int) -> tuple[int, int]:
    """A run of k steps as blocks of at most `block`: (block size, how many of that size);
    a last, shorter block takes the remainder (k - size * count)."""
    count = -(-k // block)
    size = -(-k // count)
    return size, k // size


def accumulate(b: ir.IRBuilder, t: gemm.Tile, rows: int, packed_ptr, panel_k, k_outer: int,
               k_inner: int, row_ptrs, far=None, block: int | None = None) -> list:
    """gemm.accumulate's sum (same arguments) in blocks of at most `block` K steps, each
    from zero, added. With k_outer > 1 a block is a run of whole outer steps (a conv's
    taps) where one holds at most `block` steps, else each outer step's inner run is
    split. `block` defaults to SUM_BLOCK."""
    block = block or SUM_BLOCK
    if k_outer * k_inner <= block:
        return gemm.accumulate(b, t, rows, packed_ptr, panel_k, k_outer, k_inner, row_ptrs, far)
    if k_outer > 1 and k_inner <= block:
        return _outer_blocks(b, t, rows, packed_ptr, panel_k, k_outer, k_inner, row_ptrs,
                             far, block)
    if k_outer == 1:
        return _inner_blocks(b, t, rows, packed_ptr, panel_k, k_inner, row_ptrs, far, block,
                             _i64(0))

    def step(b, kk, totals):
        def ptrs(b, _):
            return row_ptrs(b, kk)
        start = b.add(panel_k, b.mul(kk, _i64(k_inner)))
        part = _inner_blocks(b, t, rows, packed_ptr, start, k_inner, ptrs, far, block, kk)
        return _add(b, totals, part)

    return _loop(b, k_outer, _zeros(t, rows), step)


def _inner_blocks(b, t: gemm.Tile, rows: int, packed_ptr, panel_k, k: int, row_ptrs, far,
                  block: int, kk) -> list:
    """One run of k contiguous steps (row_ptrs(b, kk) at its start) in blocks."""
    size, count = blocks(k, block)

    def part(b, c0, n):
        def ptrs(b, _):
            return [b.gep(p, [c0], source_etype=gemm.F32, inbounds=True) for p in row_ptrs(b, kk)]
        return gemm.accumulate(b, t, rows, packed_ptr, b.add(panel_k, c0), 1, n, ptrs, far)

    totals = _loop(b, count, _zeros(t, rows), lambda b, j, totals: _add(
        b, totals, part(b, b.mul(j, _i64(size)), size)))
    if k > size * count:
        totals = _add(b, totals, part(b, _i64(size * count), k - size * count))
    return totals


def _outer_blocks(b, t: gemm.Tile, rows: int, packed_ptr, panel_k, k_outer: int, k_inner: int,
                  row_ptrs, far, block: int) -> list:
    """Runs of whole outer steps, at most `block` inner steps per run."""
    size, count = blocks(k_outer, max(1, block // k_inner))

    def part(b, kk0, n):
        def ptrs(b, kk):
            return row_ptrs(b, b.add(kk, kk0))
        return gemm.accumulate(b, t, rows, packed_ptr,
                               b.add(panel_k, b.mul(kk0, _i64(k_inner))), n, k_inner, ptrs,
                               far)

    totals = _loop(b, count, _zeros(t, rows), lambda b, j, totals: _add(
        b, totals, part(b, b.mul(j, _i64(size)), size)))
    if k_outer > size * count:
        totals = _add(b, totals, part(b, _i64(size * count), k_outer - size * count))
    return totals


def _zeros(t: gemm.Tile, rows: int) -> list:
    return [ir.Constant(t.vtype, None)] * (rows * t.nv)


def _add(b, totals: list, part: list) -> list:
    return [b.fadd(x, y) for x, y in zip(totals, part)]


def _loop(b, trip: int, init: list, body) -> list:
    """gemm's counted loop carrying `init` (no loop for one trip), kept a loop: fully
    unrolled (LLVM does so at 2 or 3 trips, K = 384 in blocks of 128) the partial tile's
    totals and the block's accumulators (48 vectors on AVX-512's 12 x 32 tile) met in
    one stretch of code, and the register allocator spilled 4 of them inside a copy's
    K loop: Swin's K = 384 GEMMs (196 x 384 x 1536) ran at ~165 GF/s on two threads
    against ~215 for K = 768 or 1536."""
    if trip == 1:
        return body(b, _i64(0), init)
    return gemm._phi_loop(b, trip, init, body, name="sum.block", unroll=False)
