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

The running totals live in a stack slot (`Totals`), read and written with volatile
loads and stores, never in registers across a block's K loop. As SSA values they were
live through every K loop but the first, and that loop holds the tile's accumulators,
its panel vectors and the broadcast: 15 of AVX2's 16 registers. Where LLVM unrolled the
loop over blocks (AVX2's smaller tiles: 6 straight-line K loops for K = 768), its
register allocator kept one or two totals in registers across some of them and spilled
accumulators inside the loop instead, a store-to-load round trip on an FMA chain at
every K step; a GEMM epilogue's constants (GELU's) tipped it. The MLP block of
benchmarks.fusion (4 x 32 x 768 x 768 with a GELU and residual epilogue, its LayerNorms
apart), one thread, CPU time, min of 15 interleaved, over several runs on a loaded
machine: AVX2 1.92-2.57 -> 1.46-1.51 ms, AVX-512 1.40-1.63 -> 1.41 ms (its 27-register
tile lost less), AVX2 / AVX-512 1.33-1.58x -> 1.04-1.07x. A volatile access is one
the optimizer keeps (a plain one it would forward back into a register). Per
accumulator the slot costs a store after the first block, a load, an add and a store
after each middle one, and a load and an add after the last (whose sum is not stored):
what spills around the K loops cost. Winograd's two-block sums and convs, one at a
time, one thread: within 3% of the SSA form on AVX-512 and AVX2 (loaded machine).
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
    from zero, summed in a `Totals` slot. With k_outer > 1 a block is a run of whole
    outer steps (a conv's taps) where one holds at most `block` steps, else each outer
    step's inner run is split. `block` defaults to SUM_BLOCK."""
    block = block or SUM_BLOCK
    if k_outer * k_inner <= block:
        return gemm.accumulate(b, t, rows, packed_ptr, panel_k, k_outer, k_inner, row_ptrs, far)
    totals = Totals(b, t, rows)
    if k_outer > 1 and k_inner <= block:
        return _outer_blocks(b, t, rows, packed_ptr, panel_k, k_outer, k_inner, row_ptrs, far,
                             block, totals)
    if k_outer == 1:
        return _inner_blocks(b, t, rows, packed_ptr, panel_k, k_inner, row_ptrs, far, block,
                             _i64(0), totals, True, True)

    def step(b, kk):
        def ptrs(b, _):
            return row_ptrs(b, kk)
        start = b.add(panel_k, b.mul(kk, _i64(k_inner)))
        first = b.icmp_unsigned("==", kk, _i64(0))
        _inner_blocks(b, t, rows, packed_ptr, start, k_inner, ptrs, far, block, kk, totals,
                      first, False)

    _loop(b, k_outer, step)
    return totals.load(b)


def _inner_blocks(b, t: gemm.Tile, rows: int, packed_ptr, panel_k, k: int, row_ptrs, far,
                  block: int, kk, totals: Totals, first, finish: bool) -> list | None:
    """One run of k contiguous steps (row_ptrs(b, kk) at its start) in blocks into
    `totals` (see _blocks_into)."""
    size, count = blocks(k, block)

    def part(b, c0, n):
        def ptrs(b, _):
            return [b.gep(p, [c0], source_etype=gemm.F32, inbounds=True) for p in row_ptrs(b, kk)]
        return gemm.accumulate(b, t, rows, packed_ptr, b.add(panel_k, c0), 1, n, ptrs, far)

    return _blocks_into(b, totals, part, size, count, k - size * count, first, finish)


def _outer_blocks(b, t: gemm.Tile, rows: int, packed_ptr, panel_k, k_outer: int, k_inner: int,
                  row_ptrs, far, block: int, totals: Totals) -> list:
    """Runs of whole outer steps, at most `block` inner steps per run, summed in
    `totals`."""
    size, count = blocks(k_outer, max(1, block // k_inner))

    def part(b, kk0, n):
        def ptrs(b, kk):
            return row_ptrs(b, b.add(kk, kk0))
        return gemm.accumulate(b, t, rows, packed_ptr, b.add(panel_k, b.mul(kk0, _i64(k_inner))),
                               n, k_inner, ptrs, far)

    return _blocks_into(b, totals, part, size, count, k_outer - size * count, True, True)


def _blocks_into(b, totals: Totals, part, size: int, count: int, rest: int, first,
                 finish: bool) -> list | None:
    """`count` blocks of `size` steps (a loop), then one of `rest` (0: none), each
    `part(b, start, steps)`, into `totals`: the first block stored where `first` (a bool,
    or an i1 for a run that is not the first of its sum) holds, the others added; with
    `finish`, the sum as values (the last block added to the loaded totals rather than
    stored and read back: Winograd's sums of two 32-channel blocks spent 5% more on
    AVX-512 with it stored)."""
    if finish and not rest:
        count, rest = count - 1, size

    def put(b, j):
        at_start = first if count == 1 else _both(b, first, b.icmp_unsigned("==", j, _i64(0)))
        totals.put(b, part(b, b.mul(j, _i64(size)), size), at_start)

    _loop(b, count, put)
    if rest and finish:
        return [b.fadd(x, y) for x, y in zip(totals.load(b),
                                             part(b, _i64(size * count), rest))]
    if rest:
        totals.put(b, part(b, _i64(size * count), rest), False)
    return totals.load(b) if finish else None


def _both(b, x, y):
    """x and y, each a bool or an i1."""
    if isinstance(x, bool):
        return y if x else False
    return b.and_(x, y)


class _VolatileLoad(ir.LoadInstr):
    def descr(self, buf):
        text = []
        super().descr(text)
        buf.append(text[0].replace("load ", "load volatile ", 1))


class _VolatileStore(ir.StoreInstr):
    def descr(self, buf):
        text = []
        super().descr(text)
        buf.append(text[0].replace("store ", "store volatile ", 1))


class Totals:
    """A tile's running sums (rows x NV vectors) in a stack slot of the function, written
    by `put` and read by `load` with volatile accesses, so that no total is held in a
    register across the K loops between them (see the module docstring)."""

    def __init__(self, b: ir.IRBuilder, t: gemm.Tile, rows: int):
        self.vtype, self.count = t.vtype, rows * t.nv
        with b.goto_entry_block():
            self.slot = b.alloca(t.vtype, size=_i64(self.count), name="sum.totals")

    def _ptr(self, b, i: int):
        return b.gep(self.slot, [_i64(i)], source_etype=self.vtype, inbounds=True)

    def _store(self, b, value, i: int) -> None:
        # printed "store volatile" (llvmlite's builder has no volatile flag)
        b.store(value, self._ptr(b, i)).__class__ = _VolatileStore

    def load(self, b) -> list:
        """The totals, as values."""
        out = []
        for i in range(self.count):
            x = b.load(self._ptr(b, i), typ=self.vtype)
            x.__class__ = _VolatileLoad  # printed "load volatile" (llvmlite has no flag)
            out.append(x)
        return out

    def put(self, b, part: list, first) -> None:
        """totals = part where `first` (a bool or an i1) holds, else totals += part."""
        if first is True:
            for i, x in enumerate(part):
                self._store(b, x, i)
            return
        if first is False:
            for i, (x, y) in enumerate(zip(self.load(b), part)):
                self._store(b, b.fadd(x, y), i)
            return
        with b.if_else(first) as (then, otherwise):
            with then:
                self.put(b, part, True)
            with otherwise:
                self.put(b, part, False)


def _loop(b, trip: int, body) -> None:
    """for j in range(trip): body(b, j), gemm's counted loop named "sum.block" (no loop for
    one trip), kept a loop: fully unrolled (LLVM does so at 2 or 3 trips, K = 384 in
    blocks of 128) the blocks' K loops met in one stretch of code and the register
    allocator spilled accumulators inside them (Swin's K = 384 GEMMs ran at ~165 GF/s on
    two threads against ~215 for K = 768)."""
    if trip == 1:
        body(b, _i64(0))
        return
    gemm._phi_loop(b, trip, [], lambda b, j, _: body(b, j) or [], name="sum.block",
                   unroll=False)
