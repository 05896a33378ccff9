"""3x3 stride-1 convolution by Winograd's F(m x m, 3 x 3), m = 2 or 4: 2.25x or 4x
fewer multiplies than direct.

Each m x m block of output pixels (a tile) comes from an alpha x alpha input patch d,
alpha = m + 2:

    Y = A^T [ sum over ci of (G g G^T) . (B^T d B) ] A     (. elementwise, alpha x alpha)

so a conv becomes alpha^2 GEMMs, one per position k of the transform domain:
M_k[tile, co] = sum over ci of V_k[tile, ci] U_k[ci, co], with U = G g G^T computed and
packed (gemm.py's panels, each panel's alpha^2 positions together) at compile time, V =
B^T d B computed per tile on the fly, and the output transform A^T M A, the bias and the
register epilogue applied before the store. A work item is a block of up to MR tiles: it
transforms their input patches once into a scratch on its thread's stack (alpha^2 x
tiles x Cin floats), then, for each panel of NR output channels, runs the alpha^2 GEMMs
on the micro-kernel into a second small scratch and writes the m x m outputs of every
tile.

Multiplies per output: alpha^2 / m^2 * Cin per co (4 for F(2x2), 2.25 for F(4x4)),
against 9 * Cin directly. The transforms cost adds and memory traffic, so this pays
where Cin is large enough and the image has several tiles (`refusal`); F(4x4)'s
transformed weight is 4x the filter, so `tile_size` picks m per conv. Rounding:
F(2x2)'s matrices hold 0, +-1 and +-1/2 only (errors as a direct conv's); F(4x4)'s
amplify the rounding of the per-position GEMMs through A^T (entries up to 27/8), so
its points are chosen for accuracy (0, +-3/4, +-3/2: `TRANSFORMS`) and its GEMMs sum
in blocks of SUM_BLOCK[4] channels (summation.py): a conv's rms error against float64
is then ~1.1-1.8x torch's float32 direct conv's (Barabasz et al.'s points summed
straight through: ~3x; Lavin & Gray's: ~4.5x).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from llvmlite import ir

from compiler.kernels import conv, gemm, summation
from compiler.kernels.conv import ConvShape
from compiler.kernels.gemm import F32, I64, Tile

# Stack bytes a work item may use for its transformed patches (alpha^2 x tiles x Cin
# floats; a block takes fewer tiles where Cin is large), at most: the scratch is one core's
# L2 up to this (`scratch_bytes`). Where U streams from memory, a block of more tiles reads
# it fewer times: batch 8's 7x7x512 F(4x4) (U 38 MB) held 7 tiles in 512 KiB and read U
# 5 times a call, 14 tiles in 1 MiB read it 3 times; one conv, 1 thread, CPU time (load
# ~9): AVX-512 8.4 -> 7.1 ms, AVX2 12.8 -> 9.2 (its 7 tiles ran as chunks of 4 and 3).
# A thread's stack holds it (libgomp's and Python's threads get 2 MiB or more).
SCRATCH_BYTES = 1 << 20
# Smallest output side worth tiling: below it, padding the last tile wastes too much.
MIN_SIDE = 7
# Tiles per block at least (the micro-kernel's rows): fewer and it is slower than direct.
MIN_ROWS = 4
# 2x2 output tiles a conv needs at least (all its images together). With fewer, the
# transformed weight (16/9 of the filter, F(2x2)) is streamed for too little work: the
# conv is bound by its weight's traffic, which the direct kernel keeps at 9/9. At batch 1
# 7x7 has 16 tiles: ResNet-50's two 512-channel 3x3 convs there took 1.18 and 1.14 ms on
# Winograd against onnxruntime's 1.06 and 1.02 (its profiler); with them direct, models
# (2 threads, Intel Xeon, medians of 14 interleaved): ResNet-50 26.3 -> 26.2 and 26.4 ->
# 25.8 ms, ResNet-18 8.63 -> 8.47, DenseNet-121 (16 convs at 7x7) 22.5 -> 21.5. At batch 8
# (128 tiles) Winograd stays faster: ResNet-50 189 against 192 ms direct.
MIN_TILES = 32
# Work items wanted at least, so two threads split them within ~10% (see `groups`).
MIN_ITEMS = 8
# Tiles per block at most where U streams from beyond L2 (see WinogradShape.rows): 16
# measured best on ResNet-50's 14x14 and 7x7 layers on both AVX-512 and AVX2 (32 makes
# the transformed patches outgrow L2 alongside U's stream).
MAX_BLOCK_TILES = 16
# Input channels per partial sum of a per-position GEMM (summation.accumulate), by m.
# F(4x4)'s output transform multiplies its GEMMs' rounding by up to 27/8, so its sums
# restart more often than the default. On Inception-v3's 3x3 layers with their real
# inputs (a float32 simulation, rms error over torch's float32 conv's): straight through
# 3.2-4.8x, blocks of 16 2.6-2.8x, exact sums 1.6-1.7x (the transforms' own rounding);
# the whole model's rms error over eager's (against float64): 32 2.0x, 16 1.8x. Blocks
# of 16 split its 32-channel layers in two and cost 6-7% of Inception-v3's time, 32
# 2-3% (all blocked sums together; one thread, interleaved, median of 40, load ~6;
# ResNet-50 1.00x). F(2x2)'s entries are 0 and +-1: the default.
SUM_BLOCK = {2: summation.SUM_BLOCK, 4: 32}


class Transform:
    """F(m x m, 3 x 3): alpha = m + 2 input rows per m output rows.

    The matrices are the definition (tests check Y = A^T [(G g G^T) . (B^T d B)] A against
    a direct correlation); `bt` and `at` are the same maps as straight-line code over any
    values with `add`, `sub`, `mul(c, x) = c x` and `axpy(c, x, y) = c x + y` (vectors in the kernel, numpy
    arrays in the tests), factored so that shared sums are computed once."""

    def __init__(self, m, bt_matrix, g, at_matrix, bt, at):
        self.m, self.alpha = m, m + 2
        self.BT, self.G, self.AT = (np.array(a, dtype=np.float64)
                                    for a in (bt_matrix, g, at_matrix))
        self.bt, self.at = bt, at


def _bt2(ops, x):
    return [ops.sub(x[0], x[2]), ops.add(x[1], x[2]), ops.sub(x[2], x[1]), ops.sub(x[1], x[3])]


def _at2(ops, x):
    return [ops.add(ops.add(x[0], x[1]), x[2]), ops.sub(ops.sub(x[1], x[2]), x[3])]


def _symmetric_f4(a: float, b: float) -> Transform:
    """F(4x4, 3x3) on the interpolation points 0, +-a, +-b and infinity (Toom-Cook):
    A^T's columns are the points' powers, B^T's rows the coefficients of the Lagrange
    numerators (unscaled, so every entry is a product of a and b: exact in float32 for
    dyadic a, b), G's rows the matching denominators (applied in float64 at pack time).
    Symmetric points pair up: a row of B^T for +p and its row for -p share their even
    and odd halves, as do A^T's columns, so each transform is 12 operations."""
    a2, b2 = a * a, b * b
    points = [0.0, a, -a, b, -b]

    def bt(ops, x):
        ea, ta = ops.axpy(-b2, x[2], x[4]), ops.axpy(-b2, x[1], x[3])
        eb, tb = ops.axpy(-a2, x[2], x[4]), ops.axpy(-a2, x[1], x[3])
        return [ops.axpy(a2 * b2, x[0], ops.axpy(-(a2 + b2), x[2], x[4])),
                ops.axpy(a, ta, ea), ops.axpy(-a, ta, ea),
                ops.axpy(b, tb, eb), ops.axpy(-b, tb, eb),
                ops.axpy(a2 * b2, x[1], ops.axpy(-(a2 + b2), x[3], x[5]))]

    def at(ops, x):
        s1, d1 = ops.add(x[1], x[2]), ops.sub(x[1], x[2])
        s2, d2 = ops.add(x[3], x[4]), ops.sub(x[3], x[4])
        return [ops.add(ops.add(x[0], s1), s2),
                ops.axpy(b, d2, ops.mul(a, d1)),
                ops.axpy(b2, s2, ops.mul(a2, s1)),
                ops.axpy(b2 * b, d2, ops.axpy(a2 * a, d1, x[5]))]

    bt_matrix = [[a2 * b2, 0, -(a2 + b2), 0, 1, 0]]
    for p, q2 in ((a, b2), (-a, b2), (b, a2), (-b, a2)):
        bt_matrix.append([0, -p * q2, -q2, p, 1, 0])
    bt_matrix.append([0, a2 * b2, 0, -(a2 + b2), 0, 1])
    g = [[p ** k / np.prod([p - q for q in points if q != p]) for k in range(3)]
         for p in points] + [[0, 0, 1]]
    at_matrix = [[p ** i for p in points] + [float(i == 3)] for i in range(4)]
    return Transform(4, bt_matrix, g, at_matrix, bt, at)


# F(2x2): Lavin & Gray's matrices (interpolation points 0, 1, -1 and infinity).
# F(4x4): points 0, +-3/4, +-3/2 and infinity. A conv's error is mostly its per-position
# GEMMs' rounding, amplified by A^T, then the transforms' own: the points set both.
# Searched over 0 and four of +-1/2, +-3/4, +-1, +-3/2, +-2, +-3 (a float32 simulation
# of the kernel on the 3x3 layers of a random-weight Inception-v3 with their real
# inputs, rms error over a float32 direct conv's): 0, +-3/4, +-3/2 2.9x, Barabasz et al.'s
# 0, +-1, 1/2, -2 (Error analysis and improving the accuracy of Winograd convolution for
# deep neural networks, 2020) 3.7x, Lavin & Gray's 0, +-1, +-2 5.6x; F(2x2) 1.5x.
TRANSFORMS = {
    2: Transform(2,
                 [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
                 [[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]],
                 [[1, 1, 1, 0], [0, 1, -1, -1]], _bt2, _at2),
    4: _symmetric_f4(0.75, 1.5),
}


def refusal(node, tile: Tile) -> str | None:
    """None if the NHWC conv `node` runs on the Winograd kernel (with the target's register
    tile), else why the direct one."""
    reason = conv.refusal(node)
    if reason is not None:
        return reason
    x, w = node.inputs[:2]
    a = node.attrs
    cin, cout = x.shape[3], w.shape[0]
    oh, ow = node.outputs[0].shape[1:3]
    if w.shape[2:] != (3, 3) or tuple(a["strides"]) != (1, 1) or tuple(a["dilations"]) != (1, 1):
        return "not a 3x3 stride-1 undilated conv"
    if cin % tile.vec:
        return f"{cin} input channels: Winograd needs a multiple of {tile.vec}"
    if not _patches_fit(4, cin, tile):
        return f"{cin} input channels: the transformed patches would not fit the scratch"
    if min(oh, ow) < MIN_SIDE:
        return f"{oh}x{ow} output: too few 2x2 tiles"
    tiles = x.shape[0] * -(-oh // 2) * -(-ow // 2)
    if tiles < MIN_TILES:
        return (f"{tiles} 2x2 output tiles (fewer than {MIN_TILES}): the transformed "
                "weight's traffic outweighs the multiplies saved")
    return None


def scratch_bytes(tile: Tile) -> int:
    """A work item's scratch for transformed patches on `tile`'s target: one core's L2
    (the patches are read again for every panel), at most SCRATCH_BYTES."""
    return min(tile.l2_bytes, SCRATCH_BYTES)


def _patches_fit(alpha: int, cin: int, tile: Tile) -> bool:
    """Whether MIN_ROWS tiles' transformed patches (alpha^2 x Cin floats each) fit the
    scratch."""
    return alpha * alpha * MIN_ROWS * cin * 4 <= scratch_bytes(tile)


def plan(node, tile: Tile) -> WinogradShape:
    """The shape of a conv that `refusal` accepts, with its tile size chosen."""
    shape = WinogradShape.of(node, tile)
    return dataclasses.replace(shape, m=tile_size(shape))


def tile_size(s: ConvShape) -> int:
    """m of F(m x m, 3 x 3). F(4x4) multiplies 36/16 per output against F(2x2)'s 16/4,
    but its transformed weight is 36/9 = 4x the filter's size (F(2x2): 16/9), streamed
    once per block of tiles. Measured on ResNet-50's four shapes (one conv in isolation,
    2 threads, ms for F(2x2) -> F(4x4)): batch 1: 56x56x64 0.52 -> 0.35, 28x28x128
    0.54 -> 0.31, 14x14x256 0.49 -> 0.46, 7x7x512 0.71 -> 0.94; batch 8: 4.3 -> 2.9,
    4.1 -> 2.6, 4.0 -> 3.4, 6.1 -> 4.4. So F(4x4) where its weight is small, or where
    there are enough tiles to reuse a large one."""
    t4 = s.n * -(-s.oh // 4) * -(-s.ow // 4)
    u4 = 36 * s.cin * s.cout * 4
    if not _patches_fit(6, s.cin, s.tile):
        return 2
    return 4 if u4 <= F4_SMALL_WEIGHT_BYTES or t4 >= F4_MIN_TILES else 2


# Transformed F(4x4) weights up to this size always pay (they stay in L2/L3).
F4_SMALL_WEIGHT_BYTES = 4 << 20
# Tiles (4x4) at least for a larger F(4x4) weight to pay its traffic.
F4_MIN_TILES = 32


def pack_weight(w: np.ndarray, m: int, tile: Tile) -> np.ndarray:
    """W[co, ci, 3, 3] -> U = G g G^T per (co, ci), as gemm panels of U_k[ci, co], panel by
    panel, each panel's alpha^2 positions k one after another: [panel][k][ci][NR], co
    padded to whole panels with zeros. A work item reads its panels in this order (for
    each panel, the alpha^2 GEMMs), so it streams U as one contiguous run: with the
    positions outermost ([k][panel]) its reads jumped every Cin x NR floats (32 KiB at
    AVX2's NR = 16 and 512 channels) and the hardware prefetcher restarted at each jump.
    One product by kron(G, G) (in float64, rounded once) and one reordering copy."""
    t, nr = TRANSFORMS[m], tile.nr
    co, ci = w.shape[:2]
    u = w.reshape(co * ci, 9).astype(np.float64) @ np.kron(t.G, t.G).T  # [(co, ci), k]
    panels = -(-co // nr)
    u = u.astype(np.float32).reshape(co, ci, -1)
    if panels * nr != co:
        u = np.concatenate([u, np.zeros((panels * nr - co, ci, u.shape[2]), np.float32)])
    return np.ascontiguousarray(u.reshape(panels, nr, ci, -1).transpose(0, 3, 2, 1)).reshape(-1)


@dataclasses.dataclass(frozen=True)
class WinogradShape(ConvShape):
    """A 3x3 stride-1 conv's shape (ConvShape's fields), cut into m x m output tiles."""

    m: int = 2

    @property
    def alpha(self) -> int:
        return self.m + 2

    @property
    def th(self) -> int:
        return -(-self.oh // self.m)

    @property
    def tw(self) -> int:
        return -(-self.ow // self.m)

    @property
    def tiles(self) -> int:
        return self.n * self.th * self.tw

    @property
    def weight_bytes(self) -> int:
        """The transformed weight U's size: streamed once per block of tiles."""
        return self.alpha ** 2 * self.cin * self.cout * 4

    @property
    def rows(self) -> int:
        """Tiles per block: the fewest blocks of at most `most` tiles whose transformed
        patches fit the scratch, then the shortest. A block holds the micro-kernel's MR
        rows, or, where U is larger than one core's L2 (so each block reads it from
        L3 or memory), as many tiles as the scratch holds: the micro-kernel then runs
        several row chunks on each panel while it is in cache (`_chunks`). On a
        narrow-register target (AVX2's MR = 6) the 7x7x512 layer read its 16 MiB U
        three times a call, and took 2.4x the AVX-512 build's time."""
        fit = scratch_bytes(self.tile) // (self.alpha ** 2 * self.cin * 4)
        want = MAX_BLOCK_TILES if self.weight_bytes > self.tile.l2_bytes else self.tile.mr
        most = max(1, min(want, fit))
        blocks = -(-self.tiles // most)
        return -(-self.tiles // blocks)

    @property
    def blocks(self) -> int:
        return -(-self.tiles // self.rows)

    @property
    def panels(self) -> int:
        """Panels of NR output channels (the last one partly padding where NR does not
        divide Cout: its GEMMs run on U's zero columns, its stores stop at Cout)."""
        return -(-self.cout // self.tile.nr)

    @property
    def groups(self) -> int:
        """Panel groups a block of tiles is split into: enough work items for the threads
        to share evenly (each group transforms its tiles' inputs again: a few percent)."""
        panels = self.panels
        if self.blocks >= MIN_ITEMS:
            return 1
        want = -(-MIN_ITEMS // self.blocks)
        return next(g for g in range(want, panels + 1) if panels % g == 0) \
            if want <= panels else panels

    @property
    def items(self) -> int:
        return self.blocks * self.groups


def _i64(n: int) -> ir.Constant:
    return ir.Constant(I64, int(n))


class _VectorOps:
    """`Transform.bt`/`at`'s operations on the target's vectors (coefficients as splats
    made once per kernel: gemm.splat_constant)."""

    def __init__(self, b: ir.IRBuilder, tile: Tile):
        self.b, self.tile = b, tile

    def add(self, x, y):
        return self.b.fadd(x, y)

    def sub(self, x, y):
        return self.b.fsub(x, y)

    def axpy(self, c, x, y):
        return gemm.mul_add(self.b, self.tile, gemm.splat_constant(self.b, c, self.tile.vtype),
                            x, y)

    def mul(self, c, x):
        return self.b.fmul(gemm.splat_constant(self.b, c, self.tile.vtype), x)


def emit_item(b: ir.IRBuilder, s: WinogradShape, x_ptr, packed_ptr, bias_ptr, y_ptr, item,
              zeros, epilogue=None, post=None) -> None:
    """Work item `item`: tiles [item * rows, ...) for every output channel.

    `epilogue(b, vec, off, col)`, if given, maps an output vector (one vector of channels
    at element offset `off` of Y, channel `col`) to what is stored there; `post(b, pixel,
    col)`, if given, runs after that store (an in-place epilogue over those elements)."""
    rows, a2 = s.rows, s.alpha ** 2
    with b.goto_entry_block():
        v_buf = b.alloca(F32, size=_i64(a2 * rows * s.cin))
        m_buf = b.alloca(F32, size=_i64(a2 * rows * s.tile.nr))
    block, group = b.udiv(item, _i64(s.groups)), b.urem(item, _i64(s.groups))
    t0 = b.mul(block, _i64(rows))
    last = s.tiles - (s.blocks - 1) * rows  # tiles in the last block
    args = (t0, group, x_ptr, packed_ptr, bias_ptr, y_ptr, zeros, v_buf, m_buf,
            (epilogue, post))
    if last == rows:
        _tiles(b, s, rows, *args)
        return
    with b.if_else(b.icmp_unsigned("==", block, _i64(s.blocks - 1))) as (then, otherwise):
        with then:
            _tiles(b, s, last, *args)
        with otherwise:
            _tiles(b, s, rows, *args)


def _tiles(b, s: WinogradShape, rows: int, t0, group, x_ptr, packed_ptr, bias_ptr, y_ptr,
           zeros, v_buf, m_buf, hooks) -> None:
    # loops over the block's tiles, not unrolled: the transforms' code stays one copy
    gemm.for_range(b, rows, lambda b, r: _input_transform(
        b, s, x_ptr, zeros, v_buf, rows, r, *_tile_origin(b, s, b.add(t0, r))))
    t = s.tile
    panels = s.panels
    per_group = panels // s.groups
    last_cols = s.cout - (panels - 1) * t.nr  # output channels in the last panel

    def panel_body(b, q):
        p = b.add(b.mul(group, _i64(per_group)), q)

        def chunk(b, k, r0, n, c):  # tiles r0 .. r0 + n of the block: chunk c (an i64)
            def row_ptrs(b, kk):
                return [b.gep(v_buf, [b.mul(b.add(b.mul(k, _i64(rows)), b.add(r0, _i64(r))),
                                            _i64(s.cin))], source_etype=F32, inbounds=True)
                        for r in range(n)]
            index = b.add(b.mul(p, _i64(s.alpha ** 2)), k)  # the slice of U
            accs = summation.accumulate(
                b, t, n, packed_ptr, b.mul(index, _i64(s.cin)), 1, s.cin, row_ptrs,
                _next_slice(b, s, rows, c, index), block=SUM_BLOCK[s.m])
            for i, acc in enumerate(accs):
                row = b.add(b.add(b.mul(k, _i64(rows)), r0), _i64(i // t.nv))
                off = b.add(b.mul(row, _i64(t.nr)), _i64((i % t.nv) * t.vec))
                ptr = b.gep(m_buf, [off], source_etype=F32, inbounds=True)
                b.store(acc, _as_vector_ptr(b, ptr, t), align=4)

        def gemm_k(b, k):  # a loop, not unrolled: one micro-kernel's code per chunk size
            r0 = c0 = 0
            for size, count in _chunks(rows, t.mr):
                if count == 1:
                    chunk(b, k, _i64(r0), size, _i64(c0))
                else:
                    gemm.for_range(b, count, lambda b, c, r0=r0, c0=c0, size=size: chunk(
                        b, k, b.add(_i64(r0), b.mul(c, _i64(size))), size,
                        b.add(_i64(c0), c)))
                r0 += size * count
                c0 += count

        gemm.for_range(b, s.alpha ** 2, gemm_k)
        col0 = b.mul(p, _i64(t.nr))

        def outputs(cols: int) -> None:
            gemm.for_range(b, rows, lambda b, r: _output_transform(
                b, s, m_buf, rows, r, *_tile_origin(b, s, b.add(t0, r)), col0, bias_ptr,
                y_ptr, hooks, cols))

        if last_cols == t.nr:
            outputs(t.nr)
            return
        with b.if_else(b.icmp_unsigned("==", p, _i64(panels - 1))) as (then, otherwise):
            with then:
                outputs(last_cols)
            with otherwise:
                outputs(t.nr)

    gemm.for_range(b, per_group, panel_body)


def _chunks(rows: int, mr: int) -> list[tuple[int, int]]:
    """A block of `rows` tiles as micro-kernel calls of at most `mr` rows: [(chunk size,
    how many)], the fewest chunks and as even as gemm.row_split makes them (13 tiles at
    AVX2's MR = 6: 5, 4, 4, not 5, 5 and a tail of 3 that keeps only six accumulators
    in flight, below the FMA units' latency times their count)."""
    size, chunks, big = gemm.row_split(rows, mr)
    return [(n, c) for n, c in ((size, big), (size - 1, chunks - big)) if c]


def _next_slice(b, s: WinogradShape, rows: int, c, index):
    """The `far` prefetch of row chunk `c` (an i64: gemm.accumulate's gemm.Spread), or
    None. A block of more tiles than MR runs each (panel, position) slice of U, number
    `index` (an i64) in U's packed order, as several chunks: the first streams the slice
    from L3 or memory, the others read it from L2. Each of the C chunks also asks for 1/C
    of the next slice (Cin x NR floats on: U is packed in the order items read it) into L2, as
    gemm.next_panel spreads a panel's, so the outer caches stream while the chunks
    compute. Against the second chunk asking for all of it, in the model on an Intel
    Xeon, 2 threads, medians of 12 interleaved: resnet50 28.0 -> 27.6 and 27.2 -> 26.7
    ms, googlenet 9.11 -> 8.92; built for AVX2, level (38.6 ms). That earlier scheme had
    measured, against none, one conv, 1 thread, same process on Zen 4 (CPU time, min of
    21, load ~5), ms: 7x7x512 F(2x2) AVX-512 1.62 -> 1.54, AVX2 1.91 -> 1.78; 14x14x256
    1.11 -> 1.10, AVX2 1.25 -> 1.16; 28x28x128 F(4x4) 0.79 -> 0.72, AVX2 0.94 -> 0.90."""
    t = s.tile
    if rows <= t.mr:
        return None
    parts = sum(count for _, count in _chunks(rows, t.mr))
    return gemm.spread(b, index, b.add(index, _i64(1)), c, parts, s.cin, t.nr)


def _as_vector_ptr(b: ir.IRBuilder, ptr, tile: Tile):
    """A scratch (alloca) element pointer as a vector pointer, for llvmlite's store check
    (its allocas are typed; in the module's IR this is a no-op cast)."""
    return b.bitcast(ptr, tile.vtype.as_pointer())


def _tile_origin(b, s: WinogradShape, t) -> tuple:
    """Tile t -> (n, top, left) of its output block (the input patch starts pads earlier)."""
    tx = b.urem(t, _i64(s.tw))
    rest = b.udiv(t, _i64(s.tw))
    ty = b.urem(rest, _i64(s.th))
    n = b.udiv(rest, _i64(s.th))
    return n, b.mul(ty, _i64(s.m)), b.mul(tx, _i64(s.m))


def _input_transform(b, s: WinogradShape, x_ptr, zeros, v_buf, rows: int, r, n, y0,
                     x0) -> None:
    """V[k, r, :] = (B^T d B)[k] for tile r's alpha x alpha input patch d, one vector of
    channels at a time."""
    t, tile = TRANSFORMS[s.m], s.tile
    srcs = []
    for a in range(t.alpha):
        for c in range(t.alpha):
            iy = b.add(y0, _i64(a - s.pads[0]))
            ix = b.add(x0, _i64(c - s.pads[1]))
            inside = b.and_(b.icmp_unsigned("<", iy, _i64(s.h)),
                            b.icmp_unsigned("<", ix, _i64(s.w)))
            off = b.mul(b.add(b.mul(b.add(b.mul(n, _i64(s.h)), iy), _i64(s.w)), ix),
                        _i64(s.cin))
            off = b.select(inside, off, _i64(0))
            row = b.gep(x_ptr, [off], source_etype=F32, inbounds=True)
            srcs.append(b.select(inside, row, zeros))

    def body(b, j):
        c = b.mul(j, _i64(tile.vec))
        d = [b.load(b.gep(p, [c], source_etype=F32, inbounds=True), typ=tile.vtype, align=4)
             for p in srcs]
        for k, v in enumerate(_sandwich(t.bt, _VectorOps(b, tile), d, t.alpha)):
            ptr = b.gep(v_buf, [b.add(b.mul(b.add(_i64(k * rows), r), _i64(s.cin)), c)],
                        source_etype=F32, inbounds=True)
            b.store(v, _as_vector_ptr(b, ptr, tile), align=4)

    gemm.for_range(b, s.cin // tile.vec, body)


def _sandwich(f, ops, d: list, n: int) -> list:
    """F d F^T for the 1-d map f (n values -> n' values) and an n x n grid d (row-major
    list): f down each column, then along each row; n' x n' values, row-major."""
    cols = [f(ops, [d[a * n + c] for a in range(n)]) for c in range(n)]  # cols[c][i]
    out = []
    for i in range(len(cols[0])):
        out.extend(f(ops, [cols[c][i] for c in range(n)]))
    return out


def _output_transform(b, s: WinogradShape, m_buf, rows: int, r, n, y0, x0, col0,
                      bias_ptr, y_ptr, hooks, cols: int) -> None:
    """Y's m x m block of tile r = A^T M A (+ bias, epilogue), for the panel's first `cols`
    channels (NR, or fewer in a last panel that runs past Cout): vectors past them are
    neither transformed nor stored, a vector across Cout is stored lane by lane and its
    epilogue reads its operands' lanes below Cout only (a mask)."""
    t, tile = TRANSFORMS[s.m], s.tile
    ops = _VectorOps(b, tile)
    for v in range(tile.nv):
        lanes = min(max(cols - v * tile.vec, 0), tile.vec)
        if not lanes:
            continue
        m = [b.load(b.gep(m_buf, [b.add(b.mul(b.add(_i64(k * rows), r), _i64(tile.nr)),
                                        _i64(v * tile.vec))], source_etype=F32,
                          inbounds=True),
                    typ=tile.vtype, align=4) for k in range(t.alpha ** 2)]
        out = _sandwich(t.at, ops, m, t.alpha)
        col = b.add(col0, _i64(v * tile.vec))
        bias = None
        if bias_ptr is not None:  # packed to whole panels (conv.pack_bias)
            bias = b.load(b.gep(bias_ptr, [col], source_etype=F32, inbounds=True),
                          typ=tile.vtype, align=4)
        mask = None
        if lanes < tile.vec:
            mask = ir.Constant(ir.VectorType(ir.IntType(1), tile.vec),
                               [i < lanes for i in range(tile.vec)])
        for i in range(s.m):
            for j in range(s.m):
                # an uneven side's last tile has rows or columns past the image
                edge = (s.oh % s.m and i >= s.oh % s.m) or (s.ow % s.m and j >= s.ow % s.m)
                _store_output(b, s, out[i * s.m + j], bias, n, b.add(y0, _i64(i)),
                              b.add(x0, _i64(j)), col, y_ptr, hooks, edge=bool(edge),
                              lanes=lanes, mask=mask)


def _store_output(b, s: WinogradShape, vec, bias, n, oy, ox, col, y_ptr, hooks,
                  edge: bool, lanes: int, mask) -> None:
    epilogue, post = hooks
    pixel = b.add(b.mul(b.add(b.mul(n, _i64(s.oh)), oy), _i64(s.ow)), ox)
    off = b.add(b.mul(pixel, _i64(s.cout)), col)

    def store(b):
        x = vec if bias is None else b.fadd(vec, bias)
        if epilogue is not None:
            x = epilogue(b, x, off, col, mask)
        if lanes == s.tile.vec:
            b.store(x, b.gep(y_ptr, [off], source_etype=F32, inbounds=True), align=4)
        else:
            gemm.store_lanes(b, x, lanes, lambda i: b.gep(
                y_ptr, [b.add(off, _i64(i))], source_etype=F32, inbounds=True))
        if post is not None:
            post(b, pixel, col, lanes)

    if not edge:  # an odd side's last tile has a row or column past the image
        return store(b)
    inside = b.and_(b.icmp_unsigned("<", oy, _i64(s.oh)), b.icmp_unsigned("<", ox, _i64(s.ow)))
    with b.if_then(inside):
        store(b)
