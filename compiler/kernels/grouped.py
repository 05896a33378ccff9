"""Grouped and depthwise convolution, channels-last, vectorized over output channels.

    Y[p, o] = bias[o] + sum over (kh, kw, j < Cg) of X[pixel(p, kh, kw), g(o) * Cg + j]
                                                     * W[o, j, kh, kw]
    g(o) = o // Mg        (Cg = Cin / group input and Mg = Cout / group output channels)

A depthwise conv (group == Cin) is the case Cg = 1 (Mg is its channel multiplier). The
output channels are cut into vectors of `width` lanes, and for each window tap and each
j < Cg, lane o needs input channel g(o) * Cg + j:

- "broadcast" (Mg % width == 0: a vector lies inside one group): that channel is one
  scalar, splatted (the GEMM micro-kernel's broadcast, one row per output pixel);
- "shuffle" (width % Mg == 0: a vector holds whole groups): the `span` = width / Mg * Cg
  input channels its groups read are loaded once per pixel and tap, and each j is a
  constant shuffle of them, lane o <- (o // Mg) * Cg + j. For a depthwise conv with
  multiplier 1 the span is one vector and the shuffle the identity: one load and one FMA
  per lane of output per tap, the whole vector useful, whatever the group width.

`width` is the target's vector width (`vec` floats: gemm.Tile.vec), halved until one of the
two holds and a shuffle's span is at most MAX_SPAN_VECTORS vectors (a group width of 24
runs on 8-lane vectors; one of 3 on scalars). Where no input column serves several taps
(a stride along the row, a window one column wide) a shuffle is paid per FMA, so a
broadcast at half the width is preferred to it (BROADCAST_MIN_FRACTION).

Register blocking: TILE output pixels along a row times one vector: TILE accumulators,
each weight vector loaded once per tile and tap; at stride 1 a tile's input columns
overlap from tap to tap and LLVM keeps each one loaded once. A broadcast-mode group
several vectors wide (ResNeXt's and RegNet's wider groups, SqueezeBERT's 192-channel
ones) has a register tile of `block` vectors of one group times fewer pixels instead
(`register_block`), the GEMM micro-kernel's shape: each splatted input feeds `block`
FMAs and each weight vector `pixels` of them, where one vector a tile paid a load or a
splat per FMA and ran at 55-75% of the GEMM's rate. Work items are (image, output row,
`chunk` vectors of channels: CHUNK, rounded to whole blocks). Padding costs no test in
the inner loops: the window rows inside the image are a range computed once per output
row, and the output columns are cut at compile time into tiles as even as TILE allows
(`column_tiles`): a tile holding border columns reads only their taps inside the image,
a run of interior tiles is a loop. The last vector of a channel count that is not a multiple of the width loads and stores under a
mask. The epilogue runs on the registers (`apply`; the last vector's operands read
through a mask) where the vectors are `vec` wide, else in place after the store
(`after`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
import numpy as np
from llvmlite import ir

from compiler.codegen.lowering import counted_loop
from compiler.kernels import gemm
from compiler.kernels.gemm import F32, I32, I64

# Output pixels per register tile: TILE accumulators, plus a weight vector and a tile's
# loads, inside AVX-512's 32 registers.
TILE = 8
# Vectors of channels per work item: enough items to share among threads even on a 7x7
# map, few enough that one item's weights stay in L1 (CHUNK * 49 taps * 64 B for 7x7).
CHUNK = 4
# A shuffle reads at most this many vectors of input channels per pixel and tap.
MAX_SPAN_VECTORS = 4
# Strided along the row (or with a window one column wide), a shuffle-mode input vector
# serves one tap (at stride 1 the kw taps of neighbouring pixels share it), so every
# FMA pays a shuffle on the FMA's ports; a broadcast from memory is a load instead. Such a conv
# runs broadcast at down to vec / 2 lanes: on Zen 4 (512-bit FMAs as two 256-bit
# halves) RegNet's group-width-8 stride-2 convs went 25-33% faster at 8 lanes; at
# stride 1 the shuffle still won (by 5-13%).
BROADCAST_MIN_FRACTION = 2
# The j < Cg loop is unrolled up to this many channels, a runtime loop past it.
UNROLL_CG = 8
# A broadcast tile's vectors of one group (see register_block).
MAX_BLOCK = 4
# A group wider than a vector but not a whole number of vectors (RegNet's 56, 120, 168,
# 232) runs on full vectors with its last one partly masked where that wastes at most
# 1 - this of the lanes, rather than on vectors narrow enough to divide it (120 = 15 x 8
# lanes: half of AVX-512's width). Measured on AVX-512 (Intel, full-width FMAs), 3x3
# convs: groups of 120 at 14x14, 1.30 -> 0.80-0.86 ms; of 56 (RegNet-Y-8GF) at 28x28,
# 1.94 -> 1.07-1.14 ms. (Where a 512-bit FMA is two 256-bit halves, Zen 4, the narrow
# vectors have the same peak: the padding costs its masked lanes there, at most 1/8.)
PAD_MIN_OCCUPANCY = 0.875
# Work items run row by row (each row reads all of W, and its input rows once), or chunk
# by chunk (each chunk's weights read once, its input columns once per row) where W
# is more than this fraction of one core's L2: RegNet-X's 896-channel group-width-128
# 3x3 conv has 4 MB of weights, which row by row came from memory once per output row.
CHUNK_MAJOR_L2_FRACTION = 0.5


def refusal(node) -> str | None:
    """None if this kernel runs the channels-last conv `node` (group > 1), else why not."""
    x = node.inputs[0]
    if node.attrs["group"] == 1:
        return "group 1: an implicit GEMM (conv.py) or Winograd"
    if x.dtype != "f32":
        return f"dtype {x.dtype}: braze's grouped conv kernel is float32 only"
    if len(x.shape) not in (3, 4):
        return f"{len(x.shape) - 2}-d windows: braze compiles 1-d and 2-d ones"
    for v in node.inputs[1:]:
        if v.producer is None or v.producer.op != "const":
            return f"%{v.name} is not a constant (the weight is packed at compile time)"
    return None


def choose_width(mg: int, cg: int, vec: int, shared: bool = True) -> tuple[int, str]:
    """(vector width, "broadcast" or "shuffle") for groups of Mg outputs and Cg inputs on
    a target of `vec` float lanes; `shared`: an input column serves several taps of
    neighbouring output pixels (stride 1 along the row, a window wider than 1; see the
    module docstring and BROADCAST_MIN_FRACTION)."""
    if mg > vec and mg % vec and mg / (-(-mg // vec) * vec) >= PAD_MIN_OCCUPANCY:
        return vec, "broadcast"  # groups padded to whole vectors (GroupedShape.padded)
    half = vec // BROADCAST_MIN_FRACTION
    if not shared and cg > 1 and half and mg % half == 0:
        width = vec
        while mg % width:
            width //= 2
        return width, "broadcast"
    width = vec
    while width > 1:
        if mg % width == 0:
            return width, "broadcast"
        if width % mg == 0 and width // mg * cg <= MAX_SPAN_VECTORS * vec:
            return width, "shuffle"
        width //= 2
    return 1, "broadcast"


def register_block(mode: str, mg: int, width: int, registers: int,
                   columns: int = 1) -> tuple[int, int]:
    """(vectors, pixels) of a register tile. In broadcast mode with a group of Mg >= 2
    vectors: the block of up to MAX_BLOCK vectors dividing the group (a tile lies in one
    group) and the pixels with the fewest loads per FMA over one window row,
    (b * kw + p + kw - 1) / (b * p * kw) for `columns` = kw taps shared by neighbouring
    pixels (else 1: a weight vector per tap and block vector, a splat per input column),
    among the tiles whose vectors fit the target's `registers`: b * p accumulators, two
    weight vectors per block vector in flight and the p + kw - 1 splatted columns LLVM
    keeps loaded across the taps (a 4 x 5 tile of a 3x3 conv, which leaves out the
    second weight vectors, spilled in its inner loop on AVX-512), and with at least
    TILE accumulators (independent FMA chains to cover the FMA latency). Else one vector
    of TILE pixels.

    Measured on AVX-512 (RegNet-X's 3x3 group-width-128 conv, an AlexNet-style 5x5 with
    2 groups): 2 x 8 ran 10-25% faster than one vector, 4 x 3 (fewest loads per FMA
    when the taps are left out) 20-30% slower than 2 x 8."""
    vectors = -(-mg // width) if mode == "broadcast" else 1
    best = (1, TILE)
    cost = (columns + TILE + columns - 1) / (TILE * columns)
    for block in range(2, min(MAX_BLOCK, vectors) + 1):
        if vectors % block:
            continue
        pixels = min(TILE, (registers - 2 * block - columns + 1) // (block + 1))
        if block * pixels < TILE:
            continue
        c = (block * columns + pixels + columns - 1) / (block * pixels * columns)
        if c < cost:
            best, cost = (block, pixels), c
    return best


@dataclass(frozen=True)
class GroupedShape:
    n: int
    h: int
    w: int
    cin: int
    oh: int
    ow: int
    cout: int
    kh: int
    kw: int
    strides: tuple
    pads: tuple  # top, left
    dilations: tuple
    group: int
    width: int
    mode: str
    vec: int  # the target's vector width (the register epilogue's)
    block: int = 1  # vectors of one group per register tile (register_block)
    tile: int = TILE  # output pixels per register tile
    chunk_major: bool = False  # work items ordered chunk by chunk (else row by row)

    @classmethod
    def of(cls, node, vec: int, registers: int = 16, l2_bytes: int = 1 << 20) -> GroupedShape:
        """The shape of an NHWC (or NWC: a 1-d conv is one row) grouped conv node."""
        x, w = node.inputs[:2]
        y = node.outputs[0]
        a = node.attrs
        g = a["group"]
        if len(x.shape) == 3:  # N,W,C: a 2-d conv of height 1
            sizes = (1, x.shape[1], 1, y.shape[1], 1, w.shape[2])
            strides, dil = (1, a["strides"][0]), (1, a["dilations"][0])
            pads = (0, a["pads"][0])
        else:
            sizes = (x.shape[1], x.shape[2], y.shape[1], y.shape[2], w.shape[2], w.shape[3])
            strides, dil = tuple(a["strides"]), tuple(a["dilations"])
            pads = tuple(a["pads"][:2])
        h, wd, oh, ow, kh, kw = sizes
        shared = strides[1] == 1 and sizes[5] > 1
        width, mode = choose_width(w.shape[0] // g, x.shape[-1] // g, vec, shared)
        block, tile = register_block(mode, w.shape[0] // g, width, registers,
                                     sizes[5] if shared else 1)
        weights = w.shape[0] * w.shape[1] * kh * kw * 4
        return cls(x.shape[0], h, wd, x.shape[-1], oh, ow, y.shape[-1], kh, kw, strides,
                   pads, dil, g, width, mode, vec, block, tile,
                   weights > l2_bytes * CHUNK_MAJOR_L2_FRACTION and oh * x.shape[0] > 1)

    @property
    def cg(self) -> int:
        return self.cin // self.group

    @property
    def mg(self) -> int:
        return self.cout // self.group

    @property
    def span(self) -> int:
        """Input channels one vector reads per pixel and tap (shuffle mode)."""
        return self.width // self.mg * self.cg

    @property
    def padded(self) -> bool:
        """Broadcast mode with groups that are not whole vectors: each group's channels
        start a vector (its last one partly masked; its weights and bias zero-padded)."""
        return self.mode == "broadcast" and self.mg % self.width != 0

    @property
    def group_vectors(self) -> int:
        """Vectors per group (broadcast mode)."""
        return -(-self.mg // self.width)

    @property
    def vectors(self) -> int:
        if self.mode == "broadcast":
            return self.group * self.group_vectors
        return -(-self.cout // self.width)

    @property
    def chunk(self) -> int:
        """Vectors of channels per work item: CHUNK, in whole register blocks."""
        return self.block * max(1, CHUNK // self.block)

    @property
    def chunks(self) -> int:
        return -(-self.vectors // self.chunk)

    @property
    def items(self) -> int:
        return self.n * self.oh * self.chunks

    @property
    def macs(self) -> int:
        return self.n * self.oh * self.ow * self.cout * self.kh * self.kw * self.cg

    def interior(self) -> tuple[int, int]:
        """[lo, hi): the output columns whose windows lie inside the image's width."""
        sw, pl, dw = self.strides[1], self.pads[1], self.dilations[1]
        lo = -(-pl // sw)
        last = self.w - 1 + pl - (self.kw - 1) * dw  # ow * sw <= last
        hi = last // sw + 1 if last >= 0 else 0
        lo, hi = min(lo, self.ow), min(max(hi, 0), self.ow)
        return (lo, hi) if lo < hi else (self.ow, self.ow)

    def taps_inside(self, ow: int) -> list[int]:
        """The kw whose input column is inside the image for output column `ow`."""
        x0 = ow * self.strides[1] - self.pads[1]
        return [k for k in range(self.kw) if 0 <= x0 + k * self.dilations[1] < self.w]


def column_tiles(s: GroupedShape) -> list[tuple[int, int, int]]:
    """The output columns of a row as register tiles: [(first column, pixels, repeat)],
    `repeat` tiles of `pixels` columns each from `first`. The row is cut into as few
    tiles of at most `s.tile` pixels as it takes, as even as possible, so no tile is a lone
    pixel: a tile's pixels are its independent FMA chains, and a border pixel run on
    its own (as the borders were) waits out the FMA latency on each of its taps (a 7x7
    map's two border columns cost more than its five others). A border tile reads only
    its taps inside the image; consecutive interior tiles of one size run as a loop."""
    count = -(-s.ow // s.tile)
    base, extra = divmod(s.ow, count) if count else (0, 0)
    lo, hi = s.interior()
    out: list[list[int]] = []
    start = 0
    for i in range(count):
        size = base + (1 if i < extra else 0)
        inside = lo <= start and start + size <= hi
        last = out[-1] if out else None
        if inside and last is not None and last[3] and last[1] == size:
            last[2] += 1
        else:
            out.append([start, size, 1, inside])
        start += size
    return [(first, size, repeat) for first, size, repeat, _ in out]


def plan(node, tile: gemm.Tile) -> GroupedShape:
    """The kernel's shape for `node` on the target of micro-kernel tile `tile` (its
    vector width and register count)."""
    return GroupedShape.of(node, tile.vec, tile.vector_registers, tile.l2_bytes)


def _pad_groups(a: np.ndarray, width: int, groups: int) -> np.ndarray:
    """a's rows (output channels) as `groups` groups, each zero-padded to whole vectors
    (groups = 1: the whole, padded to whole vectors)."""
    mg = a.shape[0] // groups
    padded = -(-mg // width) * width
    out = np.zeros((groups, padded) + a.shape[1:], np.float32)
    out[:, :mg] = a.reshape((groups, mg) + a.shape[1:])
    return out.reshape((groups * padded,) + a.shape[1:])


def pack_weight(w: np.ndarray, width: int, groups: int = 1) -> np.ndarray:
    """W[o, j, kh, kw] -> [vector][kh][kw][j][lane], o = vector * width + lane, zero past
    Cout, or past each of `groups` groups (GroupedShape.padded) (a 1-d conv's W[o, j, kw]
    as kh = 1)."""
    if w.ndim == 3:
        w = w[:, :, None, :]
    w = _pad_groups(w.astype(np.float32, copy=False), width, groups)
    co, cg, kh, kw = w.shape
    return np.ascontiguousarray(w.reshape(co // width, width, cg, kh, kw)
                                .transpose(0, 3, 4, 2, 1))


def pack_bias(bias: np.ndarray, width: int, groups: int = 1) -> np.ndarray:
    """bias[o], zero-padded to whole vectors (of each group: see pack_weight)."""
    return _pad_groups(bias.astype(np.float32, copy=False), width, groups)


# -- code ---------------------------------------------------------------------------

def _i64(n: int) -> ir.Constant:
    return ir.Constant(I64, int(n))


def _as_i64(j):
    """An int as an i64 constant; an LLVM value as it is."""
    return _i64(j) if isinstance(j, int) else j


def _vec(width: int) -> ir.VectorType:
    return ir.VectorType(F32, width)


def _fma(b: ir.IRBuilder, width: int):
    """llvm.fmuladd: one FMA where the target has one, a multiply and an add where it has
    none (SSE4.2; llvm.fma there is a libm call per lane)."""
    name = f"llvm.fmuladd.v{width}f32"
    try:
        return b.module.get_global(name)
    except KeyError:
        t = _vec(width)
        return ir.Function(b.module, ir.FunctionType(t, [t, t, t]), name)


def _splat(b: ir.IRBuilder, x, width: int):
    v = b.insert_element(ir.Constant(_vec(width), ir.Undefined), x, ir.Constant(I32, 0))
    return b.shuffle_vector(v, ir.Constant(_vec(width), ir.Undefined),
                            ir.Constant(ir.VectorType(I32, width), None))


def _mask(lanes: int, valid: int) -> ir.Constant:
    return ir.Constant(ir.VectorType(ir.IntType(1), lanes), [1] * valid + [0] * (lanes - valid))


def _load_lanes(b: ir.IRBuilder, ptr, lanes: int, valid: int):
    """A vector of `lanes` floats at ptr, of which only the first `valid` are read (the
    rest are zero): a plain vector load when all are valid, else a masked one."""
    t = _vec(lanes)
    if valid >= lanes:
        return b.load(ptr, typ=t, align=4)
    return gemm.masked_load(b, ptr, t, _mask(lanes, valid))


def _store_lanes(b: ir.IRBuilder, vec, ptr, lanes: int, valid: int) -> None:
    """The first `valid` of `lanes` lanes at ptr (gemm.store_lanes: power-of-two runs, no
    masked store)."""
    if valid >= lanes:
        b.store(vec, ptr, align=4)
        return
    gemm.store_lanes(b, vec, valid,
                     lambda i: b.gep(ptr, [_i64(i)], source_etype=F32, inbounds=True))


@dataclass
class _Row:
    """What one work item's code shares: its output row and its vector of channels."""
    n: ir.Value
    oh: ir.Value
    y0: ir.Value  # the window's top input row (may be negative: padding)
    kh_lo: ir.Value  # window rows [kh_lo, kh_hi) lie inside the image
    kh_hi: ir.Value
    v: ir.Value = None  # the (first) channel vector of the register tile
    valid: int = 0  # its lanes below Cout (the width but in the last vector)


def emit_item(b: ir.IRBuilder, s: GroupedShape, x_ptr, w_ptr, bias_ptr, y_ptr, item,
              apply=None, after=None, rows=None) -> None:
    """Compute work item `item`: one output row's pixels for `s.chunk` vectors of channels.
    `apply(b, vec, off, col, mask) -> vec` (the epilogue on an `s.vec`-lane vector of
    output element offset `off`, channel `col`; `mask`: its lanes below Cout, or None) and `after(b, pixel, col0, cols)` (the epilogue
    in place over a pixel's stored channels), either may be None. `rows(b, n, iy) ->
    pointer` (default: X's own rows) gives input row iy of image n (its pixel 0, channel
    0): kernels/inverted.py reads the rows it computed into a scratch."""
    emitter = _Emitter(b, s, x_ptr, w_ptr, bias_ptr, y_ptr, apply, after, rows)
    if s.chunk_major:
        rows = s.n * s.oh
        chunk, row = b.udiv(item, _i64(rows)), b.urem(item, _i64(rows))
    else:
        chunk, row = b.urem(item, _i64(s.chunks)), b.udiv(item, _i64(s.chunks))
    row_ctx = emitter.row(b.udiv(row, _i64(s.oh)), b.urem(row, _i64(s.oh)))
    first = b.mul(chunk, _i64(s.chunk // s.block))  # in blocks
    # vectors with every lane below Cout (whole blocks; in broadcast mode all of them, a
    # padded group's last vector masked by `vector`)
    full = s.vectors if s.mode == "broadcast" else s.cout // s.width
    end = b.add(first, _i64(s.chunk // s.block))
    end = b.select(b.icmp_signed("<", end, _i64(full // s.block)), end,
                   _i64(full // s.block))
    counted_loop(b, first, end, lambda b, k: emitter.vector(
        row_ctx, b.mul(k, _i64(s.block)), s.width))
    tail = 0 if s.mode == "broadcast" else s.cout - full * s.width
    if tail:
        with b.if_then(b.icmp_unsigned("==", chunk, _i64(s.chunks - 1))):
            emitter.vector(row_ctx, _i64(full), tail)


class _Emitter:
    """Emits one work item's code (see emit_item); the pieces are its methods."""

    def __init__(self, b, s: GroupedShape, x_ptr, w_ptr, bias_ptr, y_ptr, apply, after,
                 rows=None):
        self.b, self.s = b, s
        self.rows = rows if rows is not None else self._own_row
        self.x, self.w, self.bias, self.y = x_ptr, w_ptr, bias_ptr, y_ptr
        self.apply = apply if s.width == s.vec else None
        self.after = after
        self.fma = _fma(b, s.width)

    def row(self, n, oh) -> _Row:
        """The row's window top and its range of window rows inside the image."""
        b, s = self.b, self.s
        dh = s.dilations[0]
        y0 = b.sub(b.mul(oh, _i64(s.strides[0])), _i64(s.pads[0]))
        # first kh with y0 + kh * dh >= 0: ceil(-y0 / dh) when y0 < 0
        neg = b.sub(_i64(0), y0)
        lo = b.sdiv(b.add(neg, _i64(dh - 1)), _i64(dh))
        lo = b.select(b.icmp_signed("<", y0, _i64(0)), lo, _i64(0))
        # one past the last kh with y0 + kh * dh <= H - 1
        room = b.sub(_i64(s.h - 1), y0)
        hi = b.add(b.sdiv(room, _i64(dh)), _i64(1))
        hi = b.select(b.icmp_signed("<", room, _i64(0)), _i64(0), hi)
        hi = b.select(b.icmp_signed(">", hi, _i64(s.kh)), _i64(s.kh), hi)
        lo = b.select(b.icmp_signed(">", lo, hi), hi, lo)
        return _Row(n, oh, y0, lo, hi)

    def _own_row(self, b, n, iy):
        """Pointer to X[n, iy, 0, 0]."""
        s = self.s
        line = b.mul(b.add(b.mul(n, _i64(s.h)), iy), _i64(s.w * s.cin))
        return b.gep(self.x, [line], source_etype=F32, inbounds=True)

    def vector(self, row: _Row, v, valid: int) -> None:
        """All output columns of the row for channel vectors v .. v + s.block - 1
        (`valid` lanes of the last: a block has whole vectors), tile by tile
        (`column_tiles`): a run of equal interior tiles is a loop, any other tile
        straight-line code reading only the taps inside the image."""
        b, s = self.b, self.s
        if s.padded:  # the group's last block ends in its partial vector
            last = s.mg - (s.group_vectors - 1) * s.width
            at_end = b.icmp_unsigned("==", b.urem(v, _i64(s.group_vectors)),
                                     _i64(s.group_vectors - s.block))
            with b.if_else(at_end) as (then, otherwise):
                with then:
                    self._columns(replace(row, v=v, valid=last))
                with otherwise:
                    self._columns(replace(row, v=v, valid=valid))
            return
        self._columns(replace(row, v=v, valid=valid))

    def _columns(self, row: _Row) -> None:
        """`vector`'s tiles for the block at row.v."""
        s = self.s
        all_taps = list(range(s.kw))
        for start, size, repeat in column_tiles(s):
            if repeat == 1:
                self.pixels(row, _i64(start), [s.taps_inside(ow)
                                               for ow in range(start, start + size)])
                continue
            counted_loop(self.b, _i64(0), _i64(repeat), lambda b, t: self.pixels(
                row, b.add(_i64(start), b.mul(t, _i64(size))), [all_taps] * size))

    def pixels(self, row: _Row, ow0, taps: list[list[int]]) -> None:
        """Output pixels ow0, ow0 + 1, ... (one per entry of `taps`, the kw each reads)
        of the row, for its block of channel vectors: accumulate, add the bias, store,
        epilogue. accs[p * block + r]: pixel p, vector v + r."""
        b, s = self.b, self.s
        count = len(taps) * s.block
        t = _vec(s.width)
        with b.goto_entry_block():
            accs = [b.alloca(t) for _ in range(count)]
        for a in accs:
            b.store(ir.Constant(t, None), a)
        col0 = b.sub(b.mul(ow0, _i64(s.strides[1])), _i64(s.pads[1]))
        counted_loop(b, row.kh_lo, row.kh_hi,
                     lambda b, kh: self._window_row(row, kh, col0, taps, accs))
        vals = [b.load(a, typ=t) for a in accs]
        for r in range(s.block):  # row.valid: the lanes of the block's last vector
            self._finish(replace(row, v=b.add(row.v, _i64(r)) if r else row.v,
                                 valid=row.valid if r == s.block - 1 else s.width),
                         ow0, vals[r::s.block])

    def _window_row(self, row: _Row, kh, col0, taps, accs) -> None:
        """acc[p] += sum over kw in taps[p], j < Cg of input * weight, window row kh: j
        unrolled (always in shuffle mode: a shuffle's lanes are constants), or a loop."""
        s = self.s
        if s.mode == "shuffle" or s.cg <= UNROLL_CG:
            self._taps(row, kh, col0, taps, accs, range(s.cg))
        else:
            counted_loop(self.b, _i64(0), _i64(s.cg),
                         lambda b, j: self._taps(row, kh, col0, taps, accs, [j]))

    def _taps(self, row: _Row, kh, col0, taps, accs, js) -> None:
        """The FMAs of window row kh for the input channels j in js (ints, or one i64)."""
        b, s = self.b, self.s
        t = _vec(s.width)
        iy = b.add(row.y0, b.mul(kh, _i64(s.dilations[0])))
        line = self.rows(b, row.n, iy)  # the input row's pixel 0
        wrow = b.mul(b.add(b.mul(row.v, _i64(s.kh)), kh), _i64(s.kw))  # (v, kh, 0)
        step = s.kh * s.kw * s.cg * s.width  # floats from vector v's weights to v + 1's
        vals = [b.load(a, typ=t) for a in accs]
        for j in js:
            for p, kws in enumerate(taps):
                for kw in kws:
                    pixel = b.add(col0, _i64(p * s.strides[1] + kw * s.dilations[1]))
                    wk = b.add(b.mul(b.add(wrow, _i64(kw)), _i64(s.cg)), _as_i64(j))
                    x = self._input(row, line, pixel, j)
                    for r in range(s.block):
                        at = b.add(b.mul(wk, _i64(s.width)), _i64(r * step))
                        wvec = b.load(b.gep(self.w, [at], source_etype=F32, inbounds=True),
                                      typ=t, align=4)
                        i = p * s.block + r
                        vals[i] = b.call(self.fma, [x, wvec, vals[i]])
        for p, a in enumerate(accs):
            b.store(vals[p], a)

    def _input(self, row: _Row, line, pixel, j):
        """The vector whose lane o holds X[pixel, g(o) * Cg + j] of the input row at
        `line` (j: an int in shuffle mode, an i64 in broadcast mode)."""
        b, s = self.b, self.s
        if s.mode == "broadcast":
            group = b.udiv(row.v, _i64(s.group_vectors))
            ch = b.add(b.add(b.mul(pixel, _i64(s.cin)), b.mul(group, _i64(s.cg))), _as_i64(j))
            x = b.load(b.gep(line, [ch], source_etype=F32, inbounds=True), typ=F32)
            return _splat(b, x, s.width)
        start = b.add(b.mul(pixel, _i64(s.cin)), b.mul(row.v, _i64(s.span)))
        ptr = b.gep(line, [start], source_etype=F32, inbounds=True)
        valid = s.span if row.valid == s.width else row.valid // s.mg * s.cg
        span = _load_lanes(b, ptr, s.span, valid)
        mask = [(o // s.mg) * s.cg + j for o in range(s.width)]
        if mask == list(range(s.span)):
            return span
        return b.shuffle_vector(span, ir.Constant(_vec(s.span), ir.Undefined),
                                ir.Constant(ir.VectorType(I32, s.width), mask))

    def _finish(self, row: _Row, ow0, vals: list) -> None:
        """Bias, the register epilogue, the store and the in-place epilogue of the
        pixels ow0, ow0 + 1, ... for the row's channel vector."""
        b, s = self.b, self.s
        col = packed = b.mul(row.v, _i64(s.width))  # the channel; its packed bias's index
        if s.padded:
            g = b.udiv(row.v, _i64(s.group_vectors))
            col = b.add(b.mul(g, _i64(s.mg)),
                        b.mul(b.urem(row.v, _i64(s.group_vectors)), _i64(s.width)))
        if self.bias is not None:
            bvec = b.load(b.gep(self.bias, [packed], source_etype=F32, inbounds=True),
                          typ=_vec(s.width), align=4)
            vals = [b.fadd(x, bvec) for x in vals]
        first = b.add(b.mul(b.add(b.mul(row.n, _i64(s.oh)), row.oh), _i64(s.ow)), ow0)
        for p, x in enumerate(vals):
            pixel = b.add(first, _i64(p))
            off = b.add(b.mul(pixel, _i64(s.cout)), col)
            whole = row.valid == s.width
            if self.apply is not None:  # the last vector's operands: its lanes below Cout
                x = self.apply(b, x, off, col, None if whole else _mask(s.width, row.valid))
            _store_lanes(b, x, b.gep(self.y, [off], source_etype=F32, inbounds=True),
                         s.width, row.valid)
            if self.after is not None and self.apply is None:
                self.after(b, pixel, col, _i64(row.valid))
