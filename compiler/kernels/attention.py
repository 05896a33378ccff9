"""Fused float32 attention: one kernel per block of queries, the scores never written.

    O[t] = sum_j softmax_j(s[t, j]) V[j],   s[t, j] = scale * Q[t] . K[j] + mask[t, j]
                                            (-inf where causal and j > t, or j >= S)

Flash attention's online softmax over key tiles of NR keys (the GEMM tile's width: 32
on AVX-512): per query row the
kernel keeps a running max m, a running sum l and an unnormalized output o; a tile's
scores s_j give m' = max(m, max_j s_j), p_j = exp(s_j - m'), and

    l <- l * exp(m - m') + sum_j p_j,      o <- o * exp(m - m') + sum_j p_j V[j],

and at the end O = o / l. This equals softmax(s) V exactly in real arithmetic (every
term carries the factor exp(-m_final) once), and no exponent exceeds 0. A row whose
keys are all masked has m' = -inf; it is shifted by 0 instead (no -inf - -inf), so its
p are 0 and its l is 0: O = 0/0 = NaN, as torch's softmax gives (0 with the node's
empty_rows_zero, ONNX's rule).

Work items are (batch entry, block of up to MR query rows). K and V of an entry are
packed once per thread (batch-major items) into a heap scratch, both as gemm.py's
panels: K^T as D rows of NR keys per panel, V as key rows of NR value columns per panel
(zeros past Dv and past S). The query block is copied, times the scale, to a stack
scratch. All operands are read through the elemental emitter while packing (a transpose
or head split in front is index arithmetic). Per key tile both products run on the
micro-kernel (gemm.accumulate): the scores S = (scale Q) K^T as the block's MR x NV
accumulators, the softmax step on those vectors (mathlib's exp for x <= 0; the row sum
l kept lane by lane, summed once at the end), P written back over the score rows, then
P V per V panel into the output rows (o <- o * alpha + P V). The last key tile, when S
is not a whole number of tiles, runs on code of its own, as narrow (vectors) and as
short (P V's steps) as its keys. Per item the working set is the block's rows, one
score row and the entry's packs: S * (D + Dv) floats, 1 MiB at S = 2048, D = Dv = 64
(L2). Causal blocks stop at the tile holding their last query's diagonal.

Up to WHOLE_ROW_MAX_KEYS keys, not causal, the softmax takes two passes instead
(`AttentionShape.whole_rows`): every key tile's scores go to the block's score rows,
each row's max, exp and sum run once, and P V is one product over all S keys whose
accumulators are stored times 1/l. The same sums in real arithmetic, without the online
form's per-tile max, alpha and output rescaling. The query rows, V and the mask are
read a vector at a time where codegen gives `q_vector`, `v_vector`, `mask_vector`
(compiler/codegen/row_vectors.py). Interleaved in one process, 1 thread, min of 40
(load ~3): Swin's 64 windows x 3 heads of 49 x 32 with its mask 1.78 -> 1.16 ms, 24
heads 0.162 -> 0.124, ViT's 12 x 197 x 64 1.56 -> 1.32, BERT's 12 x 128 x 64 0.67 ->
0.57.

Measured before that (one thread, CPU time, min of 20, 12 heads of 64, load ~5):
ViT's 197 keys 2.43 -> 1.53 ms (onnxruntime 1.31), BERT's 128 keys with a padding mask
0.88 -> 0.68 ms (0.60), Swin's 49 0.185 -> 0.139 ms (0.120).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from compiler.codegen import mathlib
from compiler.codegen.lowering import counted_loop
from compiler.kernels import batched, gemm
from compiler.kernels.gemm import F32, I32, I64, Tile

# The output row is kept in vector registers across a key tile: Dv up to this many floats
# (8 vectors of AVX-512's 32 registers; narrower targets spill some of the row to L1).
# Past it attention is fused only up to WHOLE_ROW_MAX_KEYS keys, where the two-pass
# softmax runs P V panel by panel (any Dv; a causal block's online row spills, correct
# but slower): a diffusion UNet's 256-channel attention over 16 x 16 pixels.
MAX_DV = 128
# P x V runs on groups of at most this many query rows: AVX-512's 12-row tile left 4
# accumulator spills in that loop (the softmax's constants stay live across it, in the
# same registers); two groups of 6 have none, at the same speed. 16-register targets'
# tiles (6 rows) run whole.
PV_MAX_ROWS = 8
# Keys at most for the two-pass softmax (`AttentionShape.whole_rows`): a block's scores
# against every key go to a scratch (12 rows of 256 floats: 12 KiB, in L1 beside the
# query block), then each row's max, exp and sum run once and P V over all keys is one
# product, stored times 1/l. The online softmax's per-tile work (a max and alpha's exp
# per row, the output rows' rescaling loads and stores, the final divide) goes away:
# Swin's 49 keys (two tiles of 32) ran 1.3-1.5x faster. Longer rows still gain while
# the block's score rows stay in L2 (2 threads, medians, online -> two passes): 12 heads
# of 384 keys (D 64) 1.94 -> 1.73 ms, 8 x 1024 9.2 -> 8.2, Whisper's 6 x 1500 13.9 ->
# 12.3, 4 x 3000 37.9 -> 34.6, 2 x 4096 35.6 -> 34.6, 4 x 2048 (D 128) 31.6 -> 29.2; but
# 2 x 4096 (D 128) 66 -> 72. Past it the online softmax keeps the working set bounded.
WHOLE_ROW_MAX_KEYS = 3072
# Score rows over this many bytes go in the thread's heap scratch (after the K and V
# packs) instead of the stack: 12 rows of 3072 keys are 144 KiB, more than an
# application's thread may have to spare.
STACK_SCORE_BYTES = 1 << 14


def _i64(n: int) -> ir.Constant:
    return ir.Constant(I64, int(n))


@dataclass(frozen=True)
class AttentionShape:
    batch: tuple
    t: int  # queries
    s: int  # keys
    d: int  # query/key depth
    dv: int  # value depth
    scale: float
    causal: bool
    empty_rows_zero: bool
    tile: Tile

    @property
    def entries(self) -> int:
        return int(np.prod(self.batch, dtype=np.int64))

    @property
    def dv_panels(self) -> int:
        """V's packed panels: NR columns of Dv each (zero past Dv)."""
        return -(-self.dv // self.tile.nr)

    @property
    def width(self) -> int:
        """Floats of one output row in the scratch: Dv padded to whole panels."""
        return self.dv_panels * self.tile.nr

    @property
    def tiles(self) -> int:
        return -(-self.s // self.tile.nr)

    @property
    def row_blocks(self) -> int:
        return -(-self.t // gemm.tile_rows(self.t, self.tile.mr))

    @property
    def items(self) -> int:
        return self.entries * self.row_blocks

    @property
    def whole_rows(self) -> bool:
        """Whether a block's scores are all kept (two-pass softmax, WHOLE_ROW_MAX_KEYS);
        causal blocks stay online (they skip the tiles past their diagonal)."""
        return not self.causal and self.s <= WHOLE_ROW_MAX_KEYS

    @property
    def score_floats(self) -> int:
        """Floats of one score row in a block's scratch: every key tile when whole_rows,
        else one tile."""
        return self.tiles * self.tile.nr if self.whole_rows else self.tile.nr

    @property
    def k_floats(self) -> int:
        return self.tiles * self.tile.nr * self.d

    @property
    def heap_scores(self) -> bool:
        """Whether a block's score rows live in the heap scratch (STACK_SCORE_BYTES)."""
        return self.tile.mr * self.score_floats * 4 > STACK_SCORE_BYTES

    @property
    def v_floats(self) -> int:
        return self.tiles * self.tile.nr * self.width

    @property
    def pack_floats(self) -> int:
        """The heap scratch: K's pack, V's, and the score rows where heap_scores."""
        scores = self.tile.mr * self.score_floats if self.heap_scores else 0
        return self.k_floats + self.v_floats + scores

    @property
    def macs(self) -> int:
        return self.entries * self.t * self.s * (self.d + self.dv)

    @classmethod
    def of(cls, node, tile: Tile) -> AttentionShape:
        q, k, v = node.inputs[:3]
        return cls(tuple(q.shape[:-2]), q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1],
                   node.attrs["scale"], node.attrs["causal"], node.attrs["empty_rows_zero"],
                   tile)


def refusal_for(q, v_shape: tuple, keys: int) -> str | None:
    """None if this kernel runs attention on queries shaped like q and values of shape
    `v_shape` with `keys` keys, else why not."""
    if q.dtype != "f32":
        return f"dtype {q.dtype}: the fused attention kernel is float32 only"
    if not q.type.static or None in v_shape:
        return "symbolic dims"
    if 0 in q.shape or 0 in v_shape or keys == 0:
        return "an empty operand (the kernel's loops run at least once)"
    if v_shape[-1] > MAX_DV and keys > WHOLE_ROW_MAX_KEYS:
        return f"value depth {v_shape[-1]} > MAX_DV={MAX_DV} with {keys} keys"
    nr = batched.WIDEST_NR  # the widest tile's packs bound every target's
    floats = -(-keys // nr) * nr * (q.shape[-1] + -(-v_shape[-1] // nr) * nr)
    if floats * 4 > batched.SCRATCH_MAX_BYTES:
        return f"K and V packs of {floats * 4} bytes exceed SCRATCH_MAX_BYTES"
    return None


def refusal(node) -> str | None:
    q, k, v = node.inputs[:3]
    return "symbolic dims" if not k.type.static else refusal_for(q, v.shape, k.shape[-2])


def emit_item(b: ir.IRBuilder, shape: AttentionShape, item, pack, last, reads, out_ptr) -> None:
    """Work item `item`: query block (item % row_blocks) of batch entry
    (item / row_blocks). `reads` maps "q", "k", "v" (and "mask" if any) to
    `read(b, entry, i, j) -> float` (mask: query i, key j), and may map "q_vector",
    "v_vector" and "mask_vector" to `read(b, entry, i, j) -> vector` (the tile's vector
    of elements j, j + 1, ... of row i, all inside the row); out_ptr: O[entries, T, Dv]."""
    blocks = shape.row_blocks
    entry, rb = b.udiv(item, _i64(blocks)), b.urem(item, _i64(blocks))
    vpack = b.gep(pack, [_i64(shape.k_floats)], source_etype=F32, inbounds=True)
    stale = b.icmp_signed("!=", b.load(last, typ=I64), entry)
    with b.if_then(stale):
        # K^T[d, key] = K[key, d]: panels of NR keys, D rows each
        batched.pack_panels(b, shape.tile.nr, shape.d, shape.s, entry, pack,
                            lambda b, e, kk, key: reads["k"](b, e, key, kk), True)
        _pack_values(b, shape, entry, vpack, reads["v"], reads.get("v_vector"))
        b.store(entry, last)
    mr = gemm.tile_rows(shape.t, shape.tile.mr)
    local0 = b.mul(rb, _i64(mr))
    tail = shape.t % mr
    block = lambda b, rows: _Block(b, shape, rows, entry, local0, pack, vpack,  # noqa: E731
                                   reads, out_ptr).run()
    if tail == 0:
        block(b, mr)
        return
    with b.if_else(b.icmp_unsigned("==", rb, _i64(blocks - 1))) as (then, otherwise):
        with then:
            block(b, tail)
        with otherwise:
            block(b, mr)


def _pack_values(b: ir.IRBuilder, shape: AttentionShape, entry, vpack, read_v,
                 read_vector) -> None:
    """V[entry] as gemm.py's panels: dv_panels panels of NR columns, each tiles * NR key
    rows (the padding, past Dv and past S, stays zero)."""
    nr, rows = shape.tile.nr, shape.tiles * shape.tile.nr

    def at(b, key, c):
        panel, col = b.udiv(c, _i64(nr)), b.urem(c, _i64(nr))
        off = b.add(b.mul(b.add(b.mul(panel, _i64(rows)), key), _i64(nr)), col)
        return b.gep(vpack, [off], source_etype=F32, inbounds=True)

    _for(b, shape.s, lambda b, key: _copy_row(
        b, shape.tile, shape.dv, lambda b, c: read_v(b, entry, key, c),
        None if read_vector is None else lambda b, c: read_vector(b, entry, key, c),
        lambda b, c: at(b, key, c)))


def _copy_row(b, t: Tile, n: int, read, read_vector, at, scale=None) -> None:
    """dst[c] = src[c] (times `scale`) for c < n: whole vectors of `t` through
    `read_vector(b, c)` where given (the vector of src[c:c + vec]), the rest one element
    at a time through `read(b, c)`; `at(b, c)` points at dst[c] (a vector's lanes are
    consecutive there: vec divides the packs' panel width)."""
    whole = n // t.vec if read_vector is not None else 0
    if whole:
        def copy(b, v):
            c = b.mul(v, _i64(t.vec))
            x = read_vector(b, c)
            x = x if scale is None else b.fmul(x, gemm.splat_constant(b, scale, t.vtype))
            _store_vec(b, x, at(b, c))
        _for(b, whole, copy)
    rest = n - whole * t.vec
    if rest:
        def one(b, i):
            c = b.add(i, _i64(whole * t.vec))
            x = read(b, c)
            b.store(x if scale is None else b.fmul(x, ir.Constant(F32, scale)), at(b, c))
        _for(b, rest, one)


class _Block:
    """One query block of `rows` rows: its scratch, the loop over key tiles, the output."""

    def __init__(self, b, shape: AttentionShape, rows: int, entry, local0, kpack, vpack,
                 reads, out_ptr):
        self.b, self.shape, self.rows, self.entry, self.local0 = b, shape, rows, entry, local0
        self.kpack, self.vpack, self.reads, self.out_ptr = kpack, vpack, reads, out_ptr
        self.t = t = shape.tile
        self.width = shape.width
        with b.goto_entry_block():
            self.q, self.scores, self.o, self.m, self.l, self.alpha = (
                b.alloca(F32, size=_i64(n)) for n in (
                    t.mr * shape.d, 1 if shape.heap_scores else t.mr * shape.score_floats,
                    t.mr * self.width, t.mr, t.mr * t.vec, t.mr))
        if shape.heap_scores:  # after V's pack in the heap scratch
            self.scores = b.gep(kpack, [_i64(shape.k_floats + shape.v_floats)],
                                source_etype=F32, inbounds=True)

    def _at(self, base, off):
        return self.b.gep(base, [off], source_etype=F32, inbounds=True)

    def run(self) -> None:
        """The block against every key tile: the full ones on one loop, then the last,
        partial one (S % NR keys) on code of its own, whose products are as narrow (QK^T)
        and as short (P V) as its keys: ViT's 197 keys fill 6 tiles of 32 and 5 keys of
        a seventh, 12% of the work if the seventh ran whole."""
        b, shape, nr = self.b, self.shape, self.t.nr
        if shape.whole_rows:
            self._run_whole()
            return
        self._start()
        full, partial = divmod(shape.s, nr)
        hi = _i64(shape.tiles)
        if shape.causal:  # tiles past the block's last diagonal key are all masked
            last_q = b.add(self.local0, _i64(self.rows - 1))
            need = b.add(b.udiv(last_q, _i64(nr)), _i64(1))
            hi = b.select(b.icmp_unsigned("<", need, hi), need, hi)
        if full:
            stop = b.select(b.icmp_unsigned("<", hi, _i64(full)), hi, _i64(full))
            counted_loop(b, _i64(0), stop, lambda b, tile: self._tile(b, tile, nr))
        if partial:
            with b.if_then(b.icmp_unsigned(">", hi, _i64(full))):
                self._tile(b, _i64(full), partial)
        counted_loop(b, _i64(0), _i64(self.rows), self._finish)

    def _run_whole(self) -> None:
        """The two-pass softmax (`AttentionShape.whole_rows`): every key tile's scores
        into the score rows, each row's softmax once (P, and 1/l kept per row), then
        P V over all keys per V panel, stored times 1/l."""
        b, shape, nr = self.b, self.shape, self.t.nr
        counted_loop(b, _i64(0), _i64(self.rows), self._copy_query)
        full, partial = divmod(shape.s, nr)
        if full:
            counted_loop(b, _i64(0), _i64(full), lambda b, tile: self._score_tile(b, tile, nr))
        if partial:
            self._score_tile(b, _i64(full), partial)
        counted_loop(b, _i64(0), _i64(self.rows), self._normalize_row)
        groups = -(-self.rows // PV_MAX_ROWS)
        size = -(-self.rows // groups)
        for panel in range(shape.dv_panels):
            for r0 in range(0, self.rows, size):
                self._pv_whole(b, panel, range(r0, min(self.rows, r0 + size)))

    def _score_tile(self, b, tile, keys: int) -> None:
        """Key tile `tile` (its first `keys` keys valid): the block's scores (+ mask, -inf
        past the keys) into the score rows at the tile's keys."""
        t, row = self.t, self.shape.score_floats
        narrow, accs, key0 = self._qk(b, tile, keys)
        for r in range(self.rows):
            xs = self._scores(b, r, accs[r * narrow.nv:(r + 1) * narrow.nv], key0, keys)
            for v, x in enumerate(xs):
                _store_vec(b, x, self._at(self.scores, b.add(key0, _i64(r * row + v * t.vec))))

    def _normalize_row(self, b, r) -> None:
        """Score row r -> P = exp(s - max s) in place, and 1/l (l = sum P) into alpha[r]
        (l = 0, every key masked: NaN, or 0 with empty_rows_zero, as _finish)."""
        t, shape = self.t, self.shape
        base = b.mul(r, _i64(shape.score_floats))
        ptrs = [b.bitcast(self._at(self.scores, b.add(base, _i64(v * t.vec))),
                          t.vtype.as_pointer()) for v in range(-(-shape.s // t.vec))]
        xs = [b.load(p, typ=t.vtype, align=4) for p in ptrs]
        m = _reduce(b, xs, "max")
        m = b.select(b.fcmp_ordered("==", m, ir.Constant(F32, -np.inf)),
                     ir.Constant(F32, 0.0), m)
        shift = gemm.splat(b, m, t.vtype)
        ps = [_exp_or_zero(b, b.fsub(x, shift)) for x in xs]
        for p, ptr in zip(ps, ptrs):
            b.store(p, ptr, align=4)
        total = _reduce(b, ps, "add")
        inv = b.fdiv(ir.Constant(F32, 1.0), total)
        if shape.empty_rows_zero:
            empty = b.fcmp_ordered("==", total, ir.Constant(F32, 0.0))
            inv = b.select(empty, ir.Constant(F32, 0.0), inv)
        b.store(inv, self._at(self.alpha, r))

    def _pv_whole(self, b, panel: int, rows: range) -> None:
        """O[rows, panel's columns] = (P V) / l: the micro-kernel over all S keys, its
        accumulators scaled and stored (lanes past Dv left out)."""
        t, shape = self.t, self.shape
        prows = [self._at(self.scores, _i64(r * shape.score_floats)) for r in rows]
        accs = gemm.accumulate(b, t, len(prows), self.vpack,
                               _i64(panel * shape.tiles * t.nr), 1, shape.s,
                               lambda b, kk: prows)
        for i, r in enumerate(rows):
            inv = gemm.splat(b, b.load(self._at(self.alpha, _i64(r)), typ=F32), t.vtype)
            row = b.add(b.mul(self.entry, _i64(shape.t)), b.add(self.local0, _i64(r)))
            base = b.mul(row, _i64(shape.dv))
            for v in range(t.nv):
                col = panel * t.nr + v * t.vec
                lanes = min(max(shape.dv - col, 0), t.vec)
                x = b.fmul(accs[i * t.nv + v], inv)
                off = b.add(base, _i64(col))
                if lanes == t.vec:
                    _store_vec(b, x, self._at(self.out_ptr, off))
                else:
                    gemm.store_lanes(b, x, lanes, lambda i, off=off: self._at(
                        self.out_ptr, b.add(off, _i64(i))))

    def _copy_query(self, b, r) -> None:
        """Query row r times the scale into the block's scratch (the scores then need no
        multiply)."""
        d, e = self.shape.d, self.entry
        t = b.add(self.local0, r)
        vector = self.reads.get("q_vector")
        _copy_row(b, self.t, d, lambda b, c: self.reads["q"](b, e, t, c),
                  None if vector is None else lambda b, c: vector(b, e, t, c),
                  lambda b, c: self._at(self.q, b.add(b.mul(r, _i64(d)), c)),
                  scale=self.shape.scale)

    def _start(self) -> None:
        """Copy the query rows times the scale (the scores then need no multiply); m =
        -inf, l = 0, o = 0."""
        b, vt = self.b, self.t.vtype

        def copy(b, r):
            self._copy_query(b, r)
            b.store(ir.Constant(F32, -np.inf), self._at(self.m, r))
            _store_vec(b, ir.Constant(vt, None), self._at(self.l, b.mul(r, _i64(self.t.vec))))
            for v in range(self.width // self.t.vec):
                ptr = self._at(self.o, b.add(b.mul(r, _i64(self.width)), _i64(v * self.t.vec)))
                _store_vec(b, ir.Constant(self.t.vtype, None), ptr)

        counted_loop(b, _i64(0), _i64(self.rows), copy)

    def _qk(self, b, tile, keys: int):
        """Q's block rows x K^T's panel `tile` on the micro-kernel, as many vectors as hold
        the `keys` valid keys: (the narrowed tile, its accumulators, the tile's first key)."""
        d, t = self.shape.d, self.t
        narrow = dataclasses.replace(t, nv=-(-keys // t.vec))
        qrows = [self._at(self.q, _i64(r * d)) for r in range(self.rows)]
        accs = gemm.accumulate(b, narrow, self.rows, self.kpack, b.mul(tile, _i64(d)), 1, d,
                               lambda b, kk: qrows, row_floats=t.nr)
        return narrow, accs, b.mul(tile, _i64(t.nr))

    def _tile(self, b, tile, keys: int) -> None:
        """Key tile `tile` (its first `keys` keys valid): the block's scores on the
        micro-kernel (Q rows x K^T's panel, as many vectors as hold the keys), each row's
        online-softmax step on the score vectors, then P x V on the micro-kernel again
        (P's rows x V's panels, `keys` steps) into the output rows."""
        narrow, accs, key0 = self._qk(b, tile, keys)
        for r in range(self.rows):
            self._softmax_step(b, r, accs[r * narrow.nv:(r + 1) * narrow.nv], key0, keys)
        self._update_output(b, key0, keys)

    def _scores(self, b, r: int, accs, key0, keys: int) -> list:
        """Row r's score vectors ((scale Q) K^T, + mask), -inf past the tile's `keys`
        valid keys or above the diagonal (no select where every lane is a key and there
        is no diagonal)."""
        shape, t = self.shape, self.t
        q_index = b.add(self.local0, _i64(r))
        ninf = gemm.splat_constant(b, -np.inf, t.vtype)
        vi = ir.VectorType(I32, t.vec)
        out = []
        for v, x in enumerate(accs):
            if "mask" in self.reads:
                x = b.fadd(x, self._mask_vector(b, q_index, key0, v, keys))
            lanes = ir.Constant(vi, [v * t.vec + j for j in range(t.vec)])
            valid = None
            if keys < (v + 1) * t.vec:  # lanes past the tile's keys
                valid = b.icmp_signed("<", lanes, gemm.splat(b, ir.Constant(I32, keys), vi))
            if shape.causal:  # key0 + lane <= q
                diag = gemm.splat(b, b.trunc(b.sub(q_index, key0), I32), vi)
                below = b.icmp_signed("<=", lanes, diag)
                valid = below if valid is None else b.and_(valid, below)
            out.append(x if valid is None else b.select(valid, x, ninf))
        return out

    def _mask_vector(self, b, q_index, key0, v: int, keys: int):
        """mask[q, key] for the lanes of score vector v: one vector read where every lane
        is one of the tile's `keys` keys and the kernel has `mask_vector`, else lane by
        lane (lanes past the keys are left 0: the scores there become -inf)."""
        t = self.t
        key = b.add(key0, _i64(v * t.vec))
        if "mask_vector" in self.reads and (v + 1) * t.vec <= keys:
            return self.reads["mask_vector"](b, self.entry, q_index, key)
        x = ir.Constant(t.vtype, None)
        for j in range(min(t.vec, keys - v * t.vec)):
            x = b.insert_element(x, self.reads["mask"](b, self.entry, q_index,
                                                       b.add(key, _i64(j))),
                                 ir.Constant(I32, j))
        return x

    def _softmax_step(self, b, r: int, accs, key0, keys: int) -> None:
        """Row r against this tile: m' = max(m, max_j s_j), p_j = exp(s_j - m') into the
        score row (P, the next product's A), l = l * alpha + p lane by lane (l is a
        vector, summed once at the end), alpha = exp(m - m') kept for the output's
        rescaling."""
        t = self.t
        xs = self._scores(b, r, accs, key0, keys)
        m_ptr = self._at(self.m, _i64(r))
        m_old = b.load(m_ptr, typ=F32)
        m_new = _fmax(b, m_old, _reduce(b, xs, "max"))
        m_use = b.select(b.fcmp_ordered("==", m_new, ir.Constant(F32, -np.inf)),
                         ir.Constant(F32, 0.0), m_new)
        alpha = _exp_or_zero(b, b.fsub(m_old, m_use))
        shift = gemm.splat(b, m_use, t.vtype)
        ps = [_exp_or_zero(b, b.fsub(x, shift)) for x in xs]
        for v, p in enumerate(ps):
            _store_vec(b, p, self._at(self.scores, _i64(r * t.nr + v * t.vec)))
        lp = self._at(self.l, _i64(r * t.vec))
        total = ps[0]
        for p in ps[1:]:
            total = b.fadd(total, p)
        old = b.load(b.bitcast(lp, t.vtype.as_pointer()), typ=t.vtype, align=4)
        _store_vec(b, gemm.mul_add(b, t, old, gemm.splat(b, alpha, t.vtype), total), lp)
        b.store(m_new, m_ptr)
        b.store(alpha, self._at(self.alpha, _i64(r)))

    def _update_output(self, b, key0, keys: int) -> None:
        """o[r] = o[r] * alpha[r] + P[r, :keys] V[key0 : key0 + keys] for the block's rows:
        per V panel and group of rows (PV_MAX_ROWS), the micro-kernel's accumulators."""
        groups = -(-self.rows // PV_MAX_ROWS)
        size = -(-self.rows // groups)
        for panel in range(self.shape.dv_panels):
            for r0 in range(0, self.rows, size):
                self._pv_group(b, panel, range(r0, min(self.rows, r0 + size)), key0, keys)

    def _pv_group(self, b, panel: int, rows: range, key0, keys: int) -> None:
        t = self.t
        prows = [self._at(self.scores, _i64(r * t.nr)) for r in rows]
        start = b.add(_i64(panel * self.shape.tiles * t.nr), key0)  # V's packed row
        accs = gemm.accumulate(b, t, len(prows), self.vpack, start, 1, keys,
                               lambda b, kk: prows)
        for i, r in enumerate(rows):
            alpha = gemm.splat(b, b.load(self._at(self.alpha, _i64(r)), typ=F32), t.vtype)
            for v in range(t.nv):
                ptr = self._at(self.o, _i64(r * self.width + panel * t.nr + v * t.vec))
                old = b.load(b.bitcast(ptr, t.vtype.as_pointer()), typ=t.vtype, align=4)
                _store_vec(b, gemm.mul_add(b, t, old, alpha, accs[i * t.nv + v]), ptr)

    def _finish(self, b, r) -> None:
        """O[entry, t, :Dv] = o[r] / l[r] (l = 0: every key masked; 0 with
        empty_rows_zero, else 0/0 = NaN)."""
        shape, vt = self.shape, self.t.vtype
        lanes = b.load(b.bitcast(self._at(self.l, b.mul(r, _i64(self.t.vec))), vt.as_pointer()),
                       typ=vt, align=4)
        total = _reduce(b, [lanes], "add")
        inv = b.fdiv(ir.Constant(F32, 1.0), total)
        if shape.empty_rows_zero:
            empty = b.fcmp_ordered("==", total, ir.Constant(F32, 0.0))
            inv = b.select(empty, ir.Constant(F32, 0.0), inv)
        t = b.add(self.local0, r)
        out = b.mul(b.add(b.mul(self.entry, _i64(shape.t)), t), _i64(shape.dv))
        src = b.mul(r, _i64(self.width))
        _for(b, shape.dv, lambda b, c: b.store(
            b.fmul(b.load(self._at(self.o, b.add(src, c)), typ=F32), inv),
            self._at(self.out_ptr, b.add(out, c))))


def _for(b, trip: int, body) -> None:
    """for (i = 0; i < trip; ++i) body(b, i); body's return value is ignored."""
    gemm.for_range(b, trip, lambda b, i: body(b, i) and None)


# exp(x) for x <= 0 is taken as 0 below this: exp(-80) = 1.8e-35 is still normal, and a
# term that small next to the row's largest (exp(0) = 1) changes no float32 sum; the
# masked scores' exp(-inf) would otherwise go through denormal intermediates, which cost
# a microcode assist each (measured: a causal mask as an additive -inf constant made the
# kernel 100x slower than the same attention with the causal flag).
EXP_ZERO_BELOW = -80.0


def _exp_or_zero(b, x):
    """exp(x) for x <= 0 (a float or a vector, lane by lane), exactly 0 below
    EXP_ZERO_BELOW (and for -inf), on mathlib's exp for that domain: no overflow or
    denormal handling (never needed there), about half of exp_f32's instructions, on
    the kernel's hottest path after the products."""
    low = b.fcmp_ordered("<", x, _constant(b, EXP_ZERO_BELOW, x.type))
    return b.select(low, _constant(b, 0.0, x.type), mathlib.exp_nonpositive_f32(b, x))


def _constant(b, value: float, typ):
    """The float `value` as `typ` (a float, or a vector's splat)."""
    if isinstance(typ, ir.VectorType):
        return gemm.splat_constant(b, value, typ)
    return ir.Constant(F32, value)


def _store_vec(b, x, ptr) -> None:
    """Store a vector at a float pointer (a stack scratch's pointers are typed)."""
    b.store(x, b.bitcast(ptr, x.type.as_pointer()), align=4)


def _fmax(b, x, y):
    return b.select(b.fcmp_ordered(">", x, y), x, y)


def _reduce(b, vecs: list, op: str):
    """The max or sum of all lanes of `vecs` (a shuffle tree: no reassociation flags)."""
    combine = (lambda x, y: b.fadd(x, y)) if op == "add" else \
        (lambda x, y: b.select(b.fcmp_ordered(">", x, y), x, y))
    acc = vecs[0]
    for v in vecs[1:]:
        acc = combine(acc, v)
    lanes = width = acc.type.count
    while width > 1:
        width //= 2
        mask = ir.Constant(ir.VectorType(I32, lanes),
                           [ir.Constant(I32, (i + width) % lanes) for i in range(lanes)])
        acc = combine(acc, b.shuffle_vector(acc, ir.Constant(acc.type, ir.Undefined), mask))
    return b.extract_element(acc, ir.Constant(I32, 0))


def scratch(b: ir.IRBuilder, shape: AttentionShape) -> tuple:
    """(pack, last): the thread's zeroed heap block for K and V, and the entry it holds."""
    return batched.scratch(b, shape.pack_floats)
