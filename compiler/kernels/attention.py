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
packed once per thread (batch-major items) into a heap scratch: K^T as gemm.py's panels
(D rows of NR keys), so a tile's scores for the block are gemm.accumulate's MR x NV
accumulators; V as rows of Dv padded to whole vectors (zeros past Dv and past S). The
query block is copied to a stack scratch. All operands are read through the elemental
emitter while packing (a transpose or head split in front is index arithmetic). Per
item the working set is the block's rows, one score row and the entry's packs:
S * (D + Dv) floats, 1 MiB at S = 2048, D = Dv = 64 (L2). Causal blocks stop at the
tile holding their last query's diagonal.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from compiler.codegen import mathlib
from compiler.codegen.lowering import counted_loop
from compiler.kernels import batched, gemm
from compiler.kernels.gemm import F32, I32, I64, Tile

# The output row is kept in vector registers across a key tile: Dv up to this many floats
# (8 vectors of AVX-512's 32 registers; narrower targets spill some of the row to L1).
MAX_DV = 128


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
    def dv_vectors(self) -> int:
        return -(-self.dv // self.tile.vec)

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
    def k_floats(self) -> int:
        return self.tiles * self.tile.nr * self.d

    @property
    def pack_floats(self) -> int:
        return self.k_floats + self.tiles * self.tile.nr * self.dv_vectors * self.tile.vec

    @property
    def macs(self) -> int:
        return self.entries * self.t * self.s * (self.d + self.dv)

    @classmethod
    def of(cls, node, tile: Tile) -> AttentionShape:
        q, k, v = node.inputs[:3]
        return cls(tuple(q.shape[:-2]), q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1],
                   node.attrs["scale"], node.attrs["causal"], node.attrs["empty_rows_zero"],
                   tile)


def refusal_for(q, v, keys: int) -> str | None:
    """None if this kernel runs attention on values shaped like q and v with `keys` keys,
    else why not."""
    if q.dtype != "f32":
        return f"dtype {q.dtype}: the fused attention kernel is float32 only"
    if not (q.type.static and v.type.static):
        return "symbolic dims"
    if 0 in q.shape or 0 in v.shape or keys == 0:
        return "an empty operand (the kernel's loops run at least once)"
    if v.shape[-1] > MAX_DV:
        return f"value depth {v.shape[-1]} > MAX_DV={MAX_DV}"
    nr = batched.WIDEST_NR  # the widest tile's packs bound every target's
    floats = -(-keys // nr) * nr * (q.shape[-1] + -(-v.shape[-1] // 16) * 16)
    if floats * 4 > batched.SCRATCH_MAX_BYTES:
        return f"K and V packs of {floats * 4} bytes exceed SCRATCH_MAX_BYTES"
    return None


def refusal(node) -> str | None:
    q, k, v = node.inputs[:3]
    return "symbolic dims" if not k.type.static else refusal_for(q, v, k.shape[-2])


def emit_item(b: ir.IRBuilder, shape: AttentionShape, item, pack, last, reads, out_ptr) -> None:
    """Work item `item`: query block (item % row_blocks) of batch entry
    (item / row_blocks). `reads` maps "q", "k", "v" (and "mask" if any) to
    `read(b, entry, i, j) -> float` (mask: query i, key j); out_ptr: O[entries, T, Dv]."""
    blocks = shape.row_blocks
    entry, rb = b.udiv(item, _i64(blocks)), b.urem(item, _i64(blocks))
    vpack = b.gep(pack, [_i64(shape.k_floats)], source_etype=F32, inbounds=True)
    stale = b.icmp_signed("!=", b.load(last, typ=I64), entry)
    with b.if_then(stale):
        # K^T[d, key] = K[key, d]: panels of NR keys, D rows each
        batched.pack_panels(b, shape.tile.nr, shape.d, shape.s, entry, pack,
                            lambda b, e, kk, key: reads["k"](b, e, key, kk), True)
        _pack_values(b, shape, entry, vpack, reads["v"])
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


def _pack_values(b: ir.IRBuilder, shape: AttentionShape, entry, vpack, read_v) -> None:
    """V[entry] as S rows of dv_vectors * VEC floats (the padding stays zero)."""
    width = shape.dv_vectors * shape.tile.vec

    def put(b, key, c):
        off = b.add(b.mul(key, _i64(width)), c)
        b.store(read_v(b, entry, key, c), b.gep(vpack, [off], source_etype=F32, inbounds=True))

    _for(b, shape.s, lambda b, key: _for(
        b, shape.dv, lambda b, c: put(b, key, c)))


class _Block:
    """One query block of `rows` rows: its scratch, the loop over key tiles, the output."""

    def __init__(self, b, shape: AttentionShape, rows: int, entry, local0, kpack, vpack,
                 reads, out_ptr):
        self.b, self.shape, self.rows, self.entry, self.local0 = b, shape, rows, entry, local0
        self.kpack, self.vpack, self.reads, self.out_ptr = kpack, vpack, reads, out_ptr
        self.t = t = shape.tile
        self.width = shape.dv_vectors * t.vec
        with b.goto_entry_block():
            self.q, self.scores, self.o, self.m, self.l = (
                b.alloca(F32, size=_i64(n)) for n in (
                    t.mr * shape.d, t.mr * t.nr, t.mr * self.width, t.mr, t.mr))

    def _at(self, base, off):
        return self.b.gep(base, [off], source_etype=F32, inbounds=True)

    def run(self) -> None:
        b, shape = self.b, self.shape
        self._start()
        hi = _i64(shape.tiles)
        if shape.causal:  # tiles past the block's last diagonal key are all masked
            last_q = b.add(self.local0, _i64(self.rows - 1))
            need = b.add(b.udiv(last_q, _i64(self.t.nr)), _i64(1))
            hi = b.select(b.icmp_unsigned("<", need, hi), need, hi)
        counted_loop(b, _i64(0), hi, self._tile)
        counted_loop(b, _i64(0), _i64(self.rows), self._finish)

    def _start(self) -> None:
        """Copy the query rows; m = -inf, l = 0, o = 0."""
        b, d = self.b, self.shape.d

        def copy(b, r):
            t = b.add(self.local0, r)
            _for(b, d, lambda b, c: b.store(
                self.reads["q"](b, self.entry, t, c), self._at(self.q, b.add(b.mul(r, _i64(d)), c))))
            b.store(ir.Constant(F32, -np.inf), self._at(self.m, r))
            b.store(ir.Constant(F32, 0.0), self._at(self.l, r))
            for v in range(self.shape.dv_vectors):
                ptr = self._at(self.o, b.add(b.mul(r, _i64(self.width)), _i64(v * self.t.vec)))
                _store_vec(b, ir.Constant(self.t.vtype, None), ptr)

        counted_loop(b, _i64(0), _i64(self.rows), copy)

    def _tile(self, b, tile) -> None:
        """Scores of the block against key tile `tile` (gemm micro-kernel), then each
        row's online-softmax step."""
        d = self.shape.d
        qrows = [self._at(self.q, _i64(r * d)) for r in range(self.rows)]
        accs = gemm.accumulate(b, self.t, self.rows, self.kpack, b.mul(tile, _i64(d)), 1, d,
                               lambda b, kk: qrows)
        for i, x in enumerate(accs):
            _store_vec(b, x, self._at(self.scores, _i64(i * self.t.vec)))
        counted_loop(b, _i64(0), _i64(self.rows), lambda b, r: self._row(b, r, tile))

    def _row(self, b, r, tile) -> None:
        shape = self.shape
        t = b.add(self.local0, r)
        srow = self._at(self.scores, b.mul(r, _i64(self.t.nr)))
        key0 = b.mul(tile, _i64(self.t.nr))
        _for(b, self.t.nr, lambda b, j: self._score(b, srow, t, b.add(key0, j), j))
        mx = _reduce(b, self._row_vectors(b, srow), "max")
        m_old = b.load(self._at(self.m, r), typ=F32)
        m_new = _fmax(b, m_old, mx)
        m_use = b.select(b.fcmp_ordered("==", m_new, ir.Constant(F32, -np.inf)),
                         ir.Constant(F32, 0.0), m_new)
        alpha = _exp_or_zero(b, b.fsub(m_old, m_use))

        def expo(b, j):
            ptr = self._at(srow, j)
            b.store(_exp_or_zero(b, b.fsub(b.load(ptr, typ=F32), m_use)), ptr)

        _for(b, self.t.nr, expo)
        psum = _reduce(b, self._row_vectors(b, srow), "add")
        lp = self._at(self.l, r)
        b.store(b.fadd(b.fmul(b.load(lp, typ=F32), alpha), psum), lp)
        b.store(m_new, self._at(self.m, r))
        self._update_output(b, r, srow, key0, alpha)

    def _row_vectors(self, b, srow) -> list:
        """The score row's NR floats as the tile's NV vectors."""
        return [b.load(self._at(srow, _i64(v * self.t.vec)), typ=self.t.vtype, align=4)
                for v in range(self.t.nv)]

    def _score(self, b, srow, t, key, j) -> None:
        """srow[j] = scale * srow[j] + mask[t, key]; -inf past S or above the diagonal."""
        shape = self.shape
        ptr = self._at(srow, j)
        x = b.fmul(b.load(ptr, typ=F32), ir.Constant(F32, shape.scale))
        last = _i64(shape.s - 1)
        valid = b.icmp_unsigned("<", key, _i64(shape.s))
        if "mask" in self.reads:
            safe = b.select(valid, key, last)
            x = b.fadd(x, self.reads["mask"](b, self.entry, t, safe))
        if shape.causal:
            valid = b.and_(valid, b.icmp_unsigned("<=", key, t))
        b.store(b.select(valid, x, ir.Constant(F32, -np.inf)), ptr)

    def _update_output(self, b, r, srow, key0, alpha) -> None:
        """o[r] = o[r] * alpha + sum_j p_j V[key0 + j], o[r] in registers over the tile."""
        base = self._at(self.o, b.mul(r, _i64(self.width)))
        t = self.t
        ptrs = [self._at(base, _i64(v * t.vec)) for v in range(self.shape.dv_vectors)]
        scale = gemm.splat(b, alpha, t.vtype)
        acc = [b.fmul(b.load(p, typ=t.vtype, align=4), scale) for p in ptrs]

        def step(b, j, acc):
            p = gemm.splat(b, b.load(self._at(srow, j), typ=F32), t.vtype)
            row = self._at(self.vpack, b.mul(b.add(key0, j), _i64(self.width)))
            return [gemm.mul_add(b, t, p, b.load(self._at(row, _i64(v * t.vec)), typ=t.vtype,
                                                  align=4), a) for v, a in enumerate(acc)]

        acc = gemm._phi_loop(b, t.nr, acc, step)
        for p, a in zip(ptrs, acc):
            _store_vec(b, a, p)

    def _finish(self, b, r) -> None:
        """O[entry, t, :Dv] = o[r] / l[r] (l = 0: every key masked; 0 with
        empty_rows_zero, else 0/0 = NaN)."""
        shape = self.shape
        total = b.load(self._at(self.l, r), typ=F32)
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
    """exp(x) for x <= 0, exactly 0 below EXP_ZERO_BELOW (and for -inf)."""
    low = b.fcmp_ordered("<", x, ir.Constant(F32, EXP_ZERO_BELOW))
    safe = b.select(low, ir.Constant(F32, 0.0), x)
    return b.select(low, ir.Constant(F32, 0.0), mathlib.exp_f32(b, safe))


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
