"""Register-blocked float32 GEMM for a matmul whose right operand is a constant.

    C[M, N] = A[M, K] @ B[K, N]      (A's leading batch dims fold into M)

B is packed once, at compile time, into column panels of NR = NV * VEC columns,
each panel K rows of NR contiguous floats (zero-padded past N): the micro-kernel
then streams one panel with unit stride (`pack_b`). The output is tiled into
MR x NR tiles; a tile keeps its MR * NV accumulators in vector registers for the
whole K loop, broadcasting one element of A per row and per k and issuing one
FMA per accumulator (BLIS's micro-kernel, with the panel in L1/L2 and A's rows
read in place).

Work items are tiles ordered panel-major (consecutive items share a B panel), so
the caller's thread split gives each thread whole runs of tiles that reuse their
panel from cache; where A outgrows L2, in groups of panels that fill half of L2
(`panel_group`), so A is read once per group; small weights go row-block-major
(`row_major`). Rows past M are never touched: the last row block of a panel
runs a tile of M % MR rows; columns past N are computed (on zero padding) but not
stored.

The tile is shaped by the target (`Tile.of`, from compiler/target.py's vector width,
register count and FMA): MR * NV accumulators + NV panel vectors + one broadcast (+ one
product where there is no FMA) must fit the vector registers, so the K loop never
spills. AVX-512 (32 x 16 floats): 12 x 32 (27 registers); AVX2 + FMA (16 x 8 floats):
6 x 16, BLIS's Haswell kernel (15); AArch64 NEON (32 x 4): 6 x 16 (29); SSE4.2
(16 x 4, no FMA): 2 x 16 (14). A GEMM of M rows uses as few row blocks as MR allows,
each as short as that count permits (`tile_rows`): M = 49 (a ResNet's 7x7 maps) runs
5 blocks of 10 rows on AVX-512, not 4 of 12 and a lone row.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from compiler.codegen.symbols import declare
from compiler.kernels import summation

F32 = ir.FloatType()
I64 = ir.IntType(64)
I32 = ir.IntType(32)
PTR = ir.PointerType()

# Tile rows at most: 12 measured best on AVX-512 (more rows fit its 32 registers, but
# shorten the row blocks a thread shares a panel over, and M = 49 maps tile worse).
MAX_MR = 12
# Tile columns wanted at least, in floats: NV = max(2, MIN_NR // vec) vectors per row,
# so NR is 16 or 32 and divides the channel counts of common convs (Winograd needs it).
MIN_NR = 16


@dataclass(frozen=True)
class Tile:
    """The micro-kernel's register tile on one target: MR rows x NV vectors of `vec`
    floats; `fma` (else a multiply and an add), `l2_bytes` (one core's L2), `l1d_bytes`
    (one core's L1D)."""

    vec: int
    nv: int
    mr: int
    fma: bool = True
    l2_bytes: int = 1 << 20
    # the packed panels' width in floats where it is wider than this tile (`narrowed`:
    # the last panel's tile reads the first columns of a panel packed full width); 0: NR
    stride: int = 0
    l1d_bytes: int = 32 << 10
    vector_registers: int = 16  # the target's architectural vector registers

    @property
    def nr(self) -> int:
        """Tile columns (floats): one packed panel's width (`panel` where narrowed)."""
        return self.nv * self.vec

    @property
    def panel(self) -> int:
        """Floats per row of a packed panel (the column step from panel to panel)."""
        return self.stride or self.nr

    def narrowed(self, n: int) -> Tile | None:
        """The tile of the last of N's panels where fewer of its vectors hold columns
        below N (N = 104 on 32-column panels: 8 of the last panel's 32), else None. It
        runs the vectors that hold columns (its FMAs are the work; AVX-512 ran the
        wasted lanes of RegNet's and MobileNet's 1x1 convs at 104, 208 or 144 channels
        too, up to 23% of the FMAs), reading the panel at its packed width."""
        last = n - (-(-n // self.nr) - 1) * self.nr
        nv = -(-last // self.vec)
        if n <= 0 or nv >= self.nv:
            return None
        return dataclasses.replace(self, nv=nv, stride=self.nr)

    @property
    def vtype(self) -> ir.VectorType:
        return ir.VectorType(F32, self.vec)

    @property
    def registers(self) -> int:
        """Vector registers the K loop holds: accumulators, panel vectors, the broadcast
        (and the product, without FMA)."""
        return self.mr * self.nv + self.nv + 1 + (0 if self.fma else 1)

    @classmethod
    def of(cls, target) -> Tile:
        """The largest tile (up to MAX_MR rows) whose K loop fits `target`'s registers."""
        nv = max(2, MIN_NR // target.vec)
        spare = 0 if target.fma else 1
        mr = min(MAX_MR, (target.vector_registers - nv - 1 - spare) // nv)
        tile = cls(target.vec, nv, mr, target.fma, target.l2_bytes,
                   l1d_bytes=target.l1d_bytes, vector_registers=target.vector_registers)
        assert mr >= 1 and tile.registers <= target.vector_registers, tile
        return tile


def refusal(node) -> str | None:
    """None if `node` (a matmul) runs on this kernel, else why it takes the generic one."""
    a, w = node.inputs
    if node.outputs[0].dtype != "f32":
        return f"dtype {node.outputs[0].dtype}: the packed GEMM is float32 only"
    if w.producer is None or w.producer.op != "const":
        return "right operand is not a constant (nothing to pack at compile time)"
    if len(w.shape) != 2 or len(a.shape) < 2:
        return "right operand has batch dims"
    return None


def pack_b(w: np.ndarray, tile: Tile) -> np.ndarray:
    """B[K, N] as panels [ceil(N / NR), K, NR], zero-padded past N."""
    k, n = w.shape
    nr = tile.nr
    panels = -(-n // nr)
    padded = np.zeros((k, panels * nr), np.float32)
    padded[:, :n] = w
    return np.ascontiguousarray(padded.reshape(k, panels, nr).transpose(1, 0, 2))


@dataclass(frozen=True)
class GemmShape:
    m: int  # rows of C (A's batch dims folded in)
    k: int
    n: int
    tile: Tile

    @property
    def row_blocks(self) -> int:
        return -(-self.m // tile_rows(self.m, self.tile.mr))

    @property
    def panels(self) -> int:
        return -(-self.n // self.tile.nr)

    @property
    def items(self) -> int:
        """Work items (tiles) for the caller's outer loop."""
        return self.row_blocks * self.panels

    @classmethod
    def of(cls, node, tile: Tile) -> GemmShape:
        a, w = node.inputs
        return cls(int(np.prod(a.shape[:-1], dtype=np.int64)), a.shape[-1], w.shape[-1], tile)


def _i64(n: int) -> ir.Constant:
    return ir.Constant(I64, int(n))


def mul_add(b: ir.IRBuilder, tile: Tile, x, y, acc):
    """x * y + acc on vectors of the tile's width: one FMA where the target has it, else
    a multiply and an add (llvm.fma there would be a libm call per lane)."""
    if not tile.fma:
        return b.fadd(b.fmul(x, y), acc)
    vt = tile.vtype
    fma = declare(b.module, f"llvm.fma.v{tile.vec}f32", vt, [vt, vt, vt])
    return b.call(fma, [x, y, acc])


def splat(b: ir.IRBuilder, x, vtype: ir.VectorType):
    """A vector of the scalar x (a zero mask prints as one word of IR)."""
    v = b.insert_element(ir.Constant(vtype, ir.Undefined), x, ir.Constant(I32, 0))
    return b.shuffle_vector(v, ir.Constant(vtype, ir.Undefined),
                            ir.Constant(ir.VectorType(I32, vtype.count), None))


def splat_constant(b: ir.IRBuilder, value: float, vtype: ir.VectorType):
    """A vector of the constant `value`, made once per function, in its entry block: a
    literal vector constant is one number per lane of IR text at every use, and rendering
    that text was a large part of compile time (LLVM folds the splat back to a constant)."""
    fn = b.function
    cache = getattr(fn, "braze_splats", None)
    if cache is None:
        cache = fn.braze_splats = {}  # the float32's bytes (-0.0 and NaN kept apart)
    key = (np.float32(value).tobytes(), vtype.count)
    if key not in cache:
        with b.goto_entry_block():
            cache[key] = splat(b, ir.Constant(F32, float(value)), vtype)
    return cache[key]


# A's rows are copied to a scratch with rows this many floats longer (one cache line)
# when their stride is a multiple of ALIAS_BYTES and the tile has more rows than L1 has
# ways: the micro-kernel reads one element of each of its MR rows per step, and rows
# 4 KiB apart all fall in the same L1 set, so they evict each other. x86's L1D has 4 KiB
# per way (64 sets of 64 bytes), so its ways are l1d_bytes / 4096: 8 on Zen 4 (32 KiB),
# 12 on Intel's 48 KiB cores. Measured on Zen 4 (AVX-512's 12 rows over 8 ways), ResNet-50's
# 1x1 convs with 1024 or 2048 input channels, or 512 at stride 2, one conv at a time:
# 1 thread 97-102 -> 107-112 GFLOP/s; 2 threads 180-218 -> 209-221. Where the rows fit
# the ways (12 rows, 12 ways, on an Intel Xeon) the copy only costs: 2 threads, the
# product alone, 197 x 3072 x 768 (ViT's MLP down-projection) 263-281 -> 323-342 GFLOP/s
# without it, 49 x 2048 x 512 262-286 -> 303-315. Models, this rule against copying
# wherever rows alias (medians of 8 interleaved): ViT-B/16 118.2 -> 112.8 ms, BERT-base
# 75.9 -> 67.9, ResNet-50 24.0 -> 23.1; built for x86-64-v3 (AVX2's 6 rows, now read in
# place on any L1 of 8 ways or more) ViT-B/16 185.4 -> 171.8, ResNet-50 35.0 -> 34.7.
ROW_PAD = 16  # floats: one 64-byte cache line
ALIAS_BYTES = 4096
# The copy lives on the calling thread's stack, a tile's rows of K + ROW_PAD floats: past this
# size it would leave L2 anyway, and an unbounded one overflowed the stack (K = 2^18 took
# 12 MiB of an 8 MiB stack: SIGSEGV). Longer rows are read in place.
COPY_SCRATCH_BYTES = 1 << 19


def aliasing(row_stride_bytes: int) -> bool:
    """Whether rows this far apart conflict in L1 (see ALIAS_BYTES)."""
    return row_stride_bytes % ALIAS_BYTES == 0


def l1_ways(tile: Tile) -> int:
    """Ways of the target's L1D, as x86 builds it (4 KiB a way; see ALIAS_BYTES)."""
    return max(1, tile.l1d_bytes // ALIAS_BYTES)


def copies_rows(tile: Tile, row_stride_bytes: int, k: int) -> bool:
    """Whether `tile`'s tiles read their rows of k floats, `row_stride_bytes` apart, from a
    padded copy (`packed_rows`): rows that alias in L1, more of them than L1 has ways, and
    whose copy, for the tallest tile of any target (MAX_MR rows), fits
    COPY_SCRATCH_BYTES."""
    return (aliasing(row_stride_bytes) and tile.mr > l1_ways(tile)
            and MAX_MR * (k + ROW_PAD) * 4 <= COPY_SCRATCH_BYTES)


def packed_rows(b: ir.IRBuilder, tile: Tile, rows: int, k: int, key, row_ptrs: list) -> list:
    """Pointers to copies of the `rows` rows of k floats at `row_ptrs`, one cache line
    apart in L1 sets, in a scratch on the stack. The copy is skipped when `key` (an i64,
    e.g. the first row's index) is the one the scratch was last filled for, so a thread
    walking a row block's panels copies it once."""
    stride = k + ROW_PAD
    with b.goto_entry_block():
        scratch = b.alloca(F32, size=_i64(tile.mr * stride))
        last = b.alloca(I64)
        b.store(_i64(-1), last)
    dst = [b.gep(scratch, [_i64(r * stride)], source_etype=F32, inbounds=True)
           for r in range(rows)]
    stale = b.icmp_signed("!=", b.load(last, typ=I64), key)
    with b.if_then(stale):
        for src, d in zip(row_ptrs, dst):
            def copy(b, j, src=src, d=d):
                off = b.mul(j, _i64(tile.vec))
                x = b.load(b.gep(src, [off], source_etype=F32, inbounds=True),
                           typ=tile.vtype, align=4)
                b.store(x, b.bitcast(b.gep(d, [off], source_etype=F32, inbounds=True),
                                     tile.vtype.as_pointer()), align=4)

            if k >= tile.vec:
                for_range(b, k // tile.vec, copy)
            for c in range(k - k % tile.vec, k):
                b.store(b.load(b.gep(src, [_i64(c)], source_etype=F32, inbounds=True),
                               typ=F32),
                        b.gep(d, [_i64(c)], source_etype=F32, inbounds=True))
        b.store(key, last)
    return dst


def emit_item(b: ir.IRBuilder, shape: GemmShape, a_ptr, packed_ptr, c_ptr, item,
              after=None, before=None, transform=None) -> None:
    """Compute work item `item` (one tile) of C = A @ B with B packed by `pack_b`; before,
    `before(b, rows, row0, panel)`, and after, `after(...)`, if given (prefetches for
    the tile; an epilogue over the tile just stored)."""
    t = shape.tile
    copies = copies_rows(t, shape.k * 4, shape.k)

    def tile(b, rows, row0, panel, rb):
        if before is not None:
            before(b, rows, row0, panel)
        ptrs = [b.gep(a_ptr, [b.mul(b.add(row0, _i64(r)), _i64(shape.k))],
                      source_etype=F32, inbounds=True) for r in range(rows)]
        if copies and rows > 1:
            ptrs = packed_rows(b, t, rows, shape.k, row0, ptrs)

        def row_ptrs(b, kk):
            return ptrs

        far = next_panel(b, t, shape.m, shape.k, rb, panel, by_rows, group)

        def product(b, tt):
            vals = summation.accumulate(b, tt, rows, packed_ptr, b.mul(panel, _i64(shape.k)),
                                        1, shape.k, row_ptrs, far)
            store_tile(b, tt, shape.n, rows, vals, c_ptr, row0, panel, transform=transform)

        by_panel(b, t, shape.n, panel, product)
        if after is not None:
            after(b, rows, row0, panel)

    by_rows, group = tile_order(t, shape.k, shape.n, shape.m, shape.m * shape.k * 4, copies)
    for_each_tile(b, t, shape.m, shape.n, item, tile, by_rows, group)


def by_panel(b: ir.IRBuilder, t: Tile, n: int, panel, product) -> None:
    """product(b, tile) for column panel `panel` of N: on the last panel the narrowed
    tile where it has one (Tile.narrowed), else t."""
    narrow = t.narrowed(n)
    if narrow is None:
        product(b, t)
        return
    last = b.icmp_unsigned("==", panel, _i64(-(-n // t.nr) - 1))
    with b.if_else(last) as (then, otherwise):
        with then:
            product(b, narrow)
        with otherwise:
            product(b, t)


def tile_rows(m: int, mr: int) -> int:
    """Rows per tile for M rows: the fewest blocks of at most `mr`, then the shortest (one
    for M = 0, an empty batch: it then has no row blocks and no work items)."""
    blocks = max(1, -(-m // mr))
    return max(1, -(-m // blocks))


# Tile order. Row-block-major (a thread writes, and an epilogue reads, whole rows of C,
# one contiguous stretch) re-reads the packed weight once per row block; panel-major
# re-reads A once per panel. Weights up to ROW_MAJOR_MAX_WEIGHT_BYTES always go
# row-block-major; weights up to the target's L2 (one core's: they stay there) do too
# when A is larger than that (batch 8's activations: A would come from L3 once per panel).
ROW_MAJOR_MAX_WEIGHT_BYTES = 1 << 18


def row_major(t: Tile, k: int, n: int, m: int) -> bool:
    """Whether an M x K by K x N product takes row-block-major tiles."""
    weight = k * -(-n // t.nr) * t.nr * 4
    l2 = t.l2_bytes
    return weight <= ROW_MAJOR_MAX_WEIGHT_BYTES or (weight <= l2 and m * k * 4 > l2)


@dataclass(frozen=True)
class Spread:
    """A `far` prefetch spread over a panel's row blocks (`next_panel`): at packed row
    `row` (the K loop's row of the packed weight) ask for the float at row * step +
    offset, `step` floats on each K step (no division in the loop: where AVX2's 6 x 16
    tile has 12 FMAs a step, the K loop is issue-bound)."""

    offset: object  # an i64 value
    step: int


def next_panel(b: ir.IRBuilder, t: Tile, m: int, k: int, rb, panel, by_rows: bool,
               group: int = 1) -> Spread | None:
    """The `far` prefetch of a tile's K loop, or None. In panel-major order the first
    row block of a panel streams it from L3 or memory and the later ones read it from
    L2, the outer caches idle. So each of a panel's R row blocks also asks for 1/R of
    the panel it will walk next (the next one, or in panel groups its place in the next
    group: the panel `group` on) into L2, row block `rb` (for_each_tile's) its rb-th
    slice, K * NR / R floats over its K steps, and that panel's first tile finds it
    there: the stream from L3 runs at one rate, not in bursts a row block long. In the
    model, 2 threads on an Intel Xeon (AVX-512 at full width), medians of 10-12
    interleaved: bert_base 91.5 -> 82.2 ms, convnext_tiny 36.5 -> 34.1, resnet50 26.3 ->
    25.9 against the earlier scheme (the second row block asked for the whole next
    panel, the others for the near row again, and that was slower there than no far
    prefetch at all: 85.6, 35.5, 25.7); spread in panel groups too, bert_base 81.3 ->
    79.4, resnet50 27.5 -> 27.0. The address then took a division per K step, and built
    for AVX2 (12 FMAs a step, the loop issue-bound) spreading was 3% slower than no far
    prefetch; computed as row * step + offset, against none, medians of 8: bert_base
    83.1 -> 75.4 ms, convnext_tiny 35.4 -> 33.5, and for AVX2 133.8 -> 129.6 and 51.8 ->
    50.2. On Zen 4 the earlier scheme had helped AVX2's 6 x 16 tile most (four 32 x 768
    x 768 GEMMs whose weights sit in L3, 1 thread, CPU time, min of 41: 1.58-1.60 ->
    1.49-1.53 ms; AVX-512 noise), and a spread tried there was 1.42-1.47x slower: this
    one is not measured on Zen 4."""
    blocks = -(-m // tile_rows(m, t.mr))
    if by_rows or blocks < 2:
        return None
    return spread(b, panel, b.add(panel, _i64(group)), rb, blocks, k, t.nr)


def spread(b: ir.IRBuilder, panel, target, part, parts: int, k: int, nr: int) -> Spread:
    """The Spread by which part `part` (an i64, of `parts`) of the tiles over packed panel
    `panel` (K rows of NR floats) asks for its share of panel `target`: K row j (packed
    row panel * K + j) asks for float part * (K * NR // parts) + j * step of it, step =
    ceil(NR / parts) (the shares overlap a little, and together cover the panel)."""
    size, share, step = spread_terms(k, nr, parts)
    offset = b.add(b.add(b.mul(target, _i64(size)), b.mul(part, _i64(share))),
                   b.sub(_i64(0), b.mul(panel, _i64(k * step))))
    return Spread(offset, step)


def spread_terms(k: int, nr: int, parts: int) -> tuple[int, int, int]:
    """`spread`'s constants, floats: a panel's size, where each part's share starts
    (part * share on), and the step a K row."""
    return k * nr, k * nr // parts, -(-nr // parts)


def panel_group(t: Tile, k: int, n: int, a_bytes: int, by_rows: bool) -> int:
    """Panels a panel-major product walks for each row block before the next row block
    (for_each_tile's `group`): as many as fill half of the target's L2, where A
    (`a_bytes`) does not fit L2. A is then read from L3 once per group of panels, not
    once per panel, while the group's panels stay in L2 (BLIS's L2 block of B). The
    narrow tiles of 16-register targets (NR = 16) gain most: they would read A twice as
    often as AVX-512's NR = 32. ResNet-50's batch-8 3x3 stride-2 256-channel conv (A 6.4
    MB, panels of 147 KB: groups of 3 on AVX2), 1 thread, CPU time: 20.3 -> 19.4 ms."""
    if by_rows or a_bytes <= t.l2_bytes:
        return 1
    return half_l2_panels(t, k, n)


def half_l2_panels(t: Tile, k: int, n: int) -> int:
    """How many of the product's packed panels (at least 1) fill half of L2."""
    return max(1, min(-(-n // t.nr), (t.l2_bytes // 2) // (k * t.nr * 4)))


def tile_order(t: Tile, k: int, n: int, m: int, a_bytes: int, copies: bool) -> tuple[bool, int]:
    """(by_rows, group) for for_each_tile: `row_major`'s choice, else panel-major in
    `panel_group`s. Tiles that read their rows from a copy (`packed_rows`, keyed by the
    row block) go row-block-major where the weight fits L2, so a thread copies a row
    block once for all its panels. A larger weight would then come from L3 or memory
    once per row block: it walks groups of panels that fill half of L2 instead, each row
    block in turn over the group (one copy per row block and group). ResNet-50's 7 x 7
    1x1 convs from 1024 or 2048 channels (4-8 MiB weights, M = 49 in 5 row blocks),
    in the model on an Intel Xeon, 2 threads: 1.59 and 0.74 ms row-block-major against
    onnxruntime's 1.12 and 0.52."""
    if row_major(t, k, n, m):
        return True, 1
    if copies:
        if k * -(-n // t.nr) * t.nr * 4 <= t.l2_bytes:
            return True, 1
        return False, half_l2_panels(t, k, n)
    return False, panel_group(t, k, n, a_bytes, False)


def block_start(m: int, mr: int, rb: int) -> int:
    """The first row of row block `rb` (for_each_tile's layout: the row_split blocks,
    the taller ones spread evenly among the others)."""
    rows, blocks, big = row_split(m, mr)
    return rb * (rows - 1) + rb * big // blocks


def row_split(m: int, mr: int) -> tuple[int, int, int]:
    """M rows as row blocks of at most `mr`: (rows of the tallest block, blocks, how
    many blocks have that many rows; the others have one row fewer)."""
    rows = tile_rows(m, mr)
    blocks = -(-m // rows)
    return rows, blocks, m - blocks * (rows - 1)


def for_each_tile(b: ir.IRBuilder, t: Tile, m: int, n: int, item, tile,
                  by_rows: bool = False, group: int = 1) -> None:
    """Work item `item` -> tile(b, rows, row0, panel, rb) (rb: the row block, an i64);
    consecutive items share a panel, or (`by_rows`) a row block, or (`group` > 1) walk
    `group` panels for each row block in turn before the next group of panels. The M
    rows split into ceil(M / MR) blocks as even as can be: `big` blocks have `mr` =
    tile_rows(m, MR) rows, the others mr - 1 (M = 32 on AVX2's MR = 6: two blocks of 6
    and four of 5, not five of 6 and a lone 2 that keeps only four accumulators in
    flight, half the FMA rate), and the taller blocks are spread evenly (`block_start`),
    so that a thread's contiguous share of row blocks holds its share of the rows: M =
    49 in 9 blocks on AVX2 (row-block-major) split 26.5 / 22.5 rows between two threads
    with the four blocks of 6 first, 24 / 25 spread (5, 5, 6, 5, 6, 5, 6, 5, 6)."""
    mr, blocks, big = row_split(m, t.mr)
    panels = -(-n // t.nr)
    if by_rows:
        rb, panel = b.udiv(item, _i64(panels)), b.urem(item, _i64(panels))
    elif group > 1:
        g = b.udiv(item, _i64(blocks * group))
        rest = b.urem(item, _i64(blocks * group))
        width = _i64(group)
        if panels % group:  # the last group is narrower
            width = b.select(b.icmp_unsigned("==", g, _i64(panels // group)),
                             _i64(panels % group), width)
        rb = b.udiv(rest, width)
        panel = b.add(b.mul(g, _i64(group)), b.urem(rest, width))
    else:
        rb, panel = b.urem(item, _i64(blocks)), b.udiv(item, _i64(blocks))
    if big >= blocks:
        tile(b, mr, b.mul(rb, _i64(mr)), panel, rb)
        return
    before = b.udiv(b.mul(rb, _i64(big)), _i64(blocks))  # taller blocks ahead of rb
    after = b.udiv(b.mul(b.add(rb, _i64(1)), _i64(big)), _i64(blocks))
    is_big = b.icmp_unsigned(">", after, before)
    row0 = b.add(b.mul(rb, _i64(mr - 1)), before)
    with b.if_else(is_big) as (then, otherwise):
        with then:
            tile(b, mr, row0, panel, rb)
        with otherwise:
            tile(b, mr - 1, row0, panel, rb)


def prefetch(b: ir.IRBuilder, ptr, write: bool, locality: int = 3) -> None:
    """Ask for the cache line at `ptr` ahead of its use (into L1; with `locality` 2, into
    L2: LLVM's hint levels, 3 the closest)."""
    fn = declare(b.module, "llvm.prefetch.p0", ir.VoidType(), [PTR, I32, I32, I32])
    b.call(fn, [ptr, ir.Constant(I32, int(write)), ir.Constant(I32, locality),
                ir.Constant(I32, 1)])


def for_range(b: ir.IRBuilder, trip: int, body) -> None:
    """for (i = 0; i < trip; ++i) body(b, i), trip >= 1 (no values carried)."""
    _phi_loop(b, trip, [], lambda b, i, vals: body(b, i) or [])


# The K loop asks for the panel's row a few hundred cycles ahead (each of its cache
# lines): large weights stream from L3 or memory, and the hardware prefetcher alone left
# ResNet-50's 7x7 layers (weights of 2-16 MiB) at 73-77% of the FMA peak; with it 84-97%
# on AVX-512. The distance is counted in FMA lanes, PREFETCH_LANES (about 400 cycles at
# Zen 4's 16 lanes a cycle): 16 K steps of AVX-512's 12 x 32 tile, 64 of AVX2's 6 x 16
# (16 there measured 3-10% slower on the MLP block, whose weights stream from L3). A
# prefetch past the panel's end is harmless (a hint: it never faults).
PREFETCH_LANES = 6144
LINE_FLOATS = 16


def prefetch_steps(t: Tile) -> int:
    """K steps ahead the micro-kernel prefetches its panel."""
    return max(1, PREFETCH_LANES // (t.mr * t.nr))


# The micro-kernel's K loop block is named so (the assembly's comments keep the name:
# compiler/codegen/asm.py finds the loop by it to count spills there).
K_LOOP = "microkernel.k"


def _phi_loop(b: ir.IRBuilder, trip: int, init: list, body, name: str = "gemm.loop",
              unroll: bool = True) -> list:
    """vals = init; for i in range(trip): vals = body(b, i, vals); return vals (trip >= 1).
    `unroll=False` asks LLVM to keep the loop (`keep_loop`)."""
    pre = b.block
    loop = b.append_basic_block(name)
    done = b.append_basic_block("gemm.done")
    b.branch(loop)
    b.position_at_end(loop)
    i = b.phi(I64)
    i.add_incoming(_i64(0), pre)
    phis = []
    for x in init:
        phi = b.phi(x.type)
        phi.add_incoming(x, pre)
        phis.append(phi)
    new = body(b, i, phis)
    nxt = b.add(i, _i64(1), flags=["nuw", "nsw"])
    i.add_incoming(nxt, b.block)
    for phi, x in zip(phis, new):
        phi.add_incoming(x, b.block)
    latch = b.cbranch(b.icmp_unsigned("<", nxt, _i64(trip)), loop, done)
    if not unroll:
        keep_loop(b.module, latch)
    b.position_at_end(done)
    return new


class _LoopID(ir.values.MDValue):
    """A loop's ID for LLVM's `llvm.loop` metadata: a distinct node whose first operand
    is itself (llvmlite writes no self-reference), then the loop's hints."""

    def descr(self, buf):
        refs = ", ".join([self.get_reference()] + [h.get_reference() for h in self.operands])
        buf += (f"distinct !{{ {refs} }}", "\n")


def keep_loop(module: ir.Module, latch) -> None:
    """Mark the loop whose back edge is branch `latch` llvm.loop.unroll.disable: a loop
    of a few trips with a register-filling body, fully unrolled by LLVM, had its
    register allocation spill inside the inner K loops of the copies (summation.py)."""
    hint = module.add_metadata([ir.MetaDataString(module, "llvm.loop.unroll.disable")])
    latch.set_metadata("llvm.loop", _LoopID(module, [hint], name=str(len(module.metadata))))


def accumulate(b: ir.IRBuilder, t: Tile, rows: int, packed_ptr, panel_k, k_outer: int,
               k_inner: int, row_ptrs, far=None, row_floats: int | None = None) -> list:
    """The tile's MR x NV accumulators: the sum over kk < k_outer, c < k_inner of
    A_r(kk)[c] * panel[kk * k_inner + c], where `row_ptrs(b, kk)` gives each row's pointer
    to its k_inner contiguous elements of A for kk, and the panel starts at packed row
    `panel_k` (the panel's index times the full K = k_outer * k_inner). Each K step asks
    for the panel's row prefetch_steps(t) rows ahead into L1 and, given `far` (a
    `Spread`), for a line of the next panel into L2 (`next_panel`). The panel's rows are
    `row_floats` apart (default: the tile's NR; wider where a narrower tile reads the
    first columns of a panel packed for the full one)."""
    stride = row_floats or t.panel
    near = _i64(prefetch_steps(t) * stride)
    def inner(b, c, accs, ptrs, kk):
        row = b.add(panel_k, b.add(b.mul(kk, _i64(k_inner)), c))
        prow = b.mul(row, _i64(stride))
        bvecs = [b.load(b.gep(packed_ptr, [b.add(prow, _i64(v * t.vec))], source_etype=F32,
                              inbounds=True), typ=t.vtype, align=4) for v in range(t.nv)]
        for off in range(0, t.nr, LINE_FLOATS):
            prefetch(b, b.gep(packed_ptr, [b.add(b.add(prow, near), _i64(off))],
                              source_etype=F32), False)
        if far is not None:  # far.step floats a step: a line or more
            at = b.add(b.mul(row, _i64(far.step)), far.offset)
            for off in range(0, far.step, LINE_FLOATS):
                prefetch(b, b.gep(packed_ptr, [b.add(at, _i64(off))], source_etype=F32),
                         False, locality=2)
        new = []
        for r in range(rows):
            a = b.load(b.gep(ptrs[r], [c], source_etype=F32, inbounds=True), typ=F32)
            s = splat(b, a, t.vtype)
            new += [mul_add(b, t, s, bvecs[v], accs[r * t.nv + v]) for v in range(t.nv)]
        return new

    def outer(b, kk, accs):
        ptrs = row_ptrs(b, kk)
        return _phi_loop(b, k_inner, accs, lambda b, c, accs: inner(b, c, accs, ptrs, kk),
                         name=K_LOOP)

    zeros = [ir.Constant(t.vtype, None)] * (rows * t.nv)
    if k_outer == 1:
        return outer(b, _i64(0), zeros)
    return _phi_loop(b, k_outer, zeros, outer)


def masked_load(b: ir.IRBuilder, ptr, vtype: ir.VectorType, mask):
    """llvm.masked.load of `vtype` at `ptr` (LLVM 22's form: no alignment argument): the
    lanes `mask` (a vector of i1) sets, zero in the others. AVX-512 and AVX2 have the
    instruction; LLVM splits it into guarded loads elsewhere."""
    fn = declare(b.module, f"llvm.masked.load.v{vtype.count}f32.p0", vtype,
                 [PTR, mask.type, vtype])
    return b.call(fn, [ptr, mask, ir.Constant(vtype, None)])


def store_lanes(b: ir.IRBuilder, x, lanes: int, at) -> None:
    """Store the first `lanes` lanes of vector `x`, lane i at `at(i)` (a float pointer), as
    runs of a power of two lanes: 8 of 16 as one 256-bit store, 12 as 8 then 4, 3 as 2
    then 1, not lane by lane (the last panel of a 1x1 conv to 72 channels stored 8 scalar
    extracts per row). No masked store: AVX2's vmaskmovps is slow on AMD cores, and SSE
    and NEON have none."""
    width = x.type.count
    start = 0
    while start < lanes:
        run = 1 << ((lanes - start).bit_length() - 1)
        if run == width:
            part = x
        elif run == 1:
            part = b.extract_element(x, ir.Constant(I32, start))
        else:
            part = b.shuffle_vector(x, ir.Constant(x.type, None),
                                    ir.Constant(ir.VectorType(I32, run),
                                                list(range(start, start + run))))
        if run > 1:
            b.store(part, at(start), align=4)
        else:
            b.store(part, at(start))
        start += run


def store_tile(b: ir.IRBuilder, t: Tile, n: int, rows: int, vals, c_ptr, row0, panel,
               bias_ptr=None, transform=None) -> None:
    """Write the tile into row-major C[., n] (+ bias[col], bias padded to whole panels;
    then `transform(b, rows, row0, col0, vals) -> vals`, an epilogue on the registers);
    the last panel stores only its columns below n."""
    nr, vec = t.panel, t.vec
    panels = -(-n // nr)
    last_cols = n - (panels - 1) * nr
    col0 = b.mul(panel, _i64(nr))
    if bias_ptr is not None:
        bias = [b.load(b.gep(bias_ptr, [b.add(col0, _i64(v * vec))], source_etype=F32,
                             inbounds=True), typ=t.vtype, align=4) for v in range(t.nv)]
        vals = [b.fadd(x, bias[i % t.nv]) for i, x in enumerate(vals)]
    if transform is not None:
        vals = transform(b, rows, row0, col0, vals)

    def store(cols: int) -> None:
        for r in range(rows):
            base = b.add(b.mul(b.add(row0, _i64(r)), _i64(n)), col0)
            for v in range(t.nv):
                lanes = min(max(cols - v * vec, 0), vec)
                x = vals[r * t.nv + v]
                off = b.add(base, _i64(v * vec))
                store_lanes(b, x, lanes, lambda i, off=off: b.gep(
                    c_ptr, [b.add(off, _i64(i))], source_etype=F32, inbounds=True))

    if last_cols == nr or t.stride:  # a narrowed tile only ever runs the last panel
        store(last_cols)
        return
    is_last = b.icmp_unsigned("==", panel, _i64(panels - 1))
    with b.if_else(is_last) as (then, otherwise):
        with then:
            store(last_cols)
        with otherwise:
            store(nr)
