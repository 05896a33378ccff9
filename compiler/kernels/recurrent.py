"""The time loop of an LSTM, GRU or RNN layer (the `recurrence` op), inside one kernel.

The input projection of every step is an ordinary matmul in front (the importers make
it: the packed GEMM runs it); this kernel runs what must go step by step. A work item is
one direction and a block of up to MR batch rows; per step it takes the recurrent
product of the block's hidden states with R^T, then the gate math of each row, and keeps
the states in a heap scratch of its own (rows x H each):

    g[r, :] = h[r, :] R^T                       all gates' columns, one product
    LSTM:  i, o, f, c~ from xw[t] + g (+ peepholes); c = f c + i c~; h = o tanh(c)
    GRU:   z, r from xw[t] + g; h~ = tanh(xw_h + r (g_h + Rb_h))      (linear_before_reset)
                                h~ = tanh(xw_h + (r h) R_h^T)         (else: a 2nd product)
           h = (1 - z) h~ + z h
    RNN:   h = tanh(xw[t] + g)

R^T is read as gemm.py's panels (H rows of NR contiguous floats per panel): packed at
compile time when R is a constant (`pack_r`), else once per call and thread. The product
keeps rows x count x NV accumulators in registers (`_group`: with one batch row, several
panels at once, so the FMA chains are independent), broadcasting one element of each
row's h per k. The gate math runs on whole vectors of units (mathlib's sigmoid and tanh),
then one scalar tail. A row past its sequence length keeps its state (its Y rows are
zero); a reverse direction walks t = len - 1 down to 0. Items are independent: the
directions and batch blocks run on the OpenMP threads.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from llvmlite import ir

from compiler.codegen import faults, mathlib
from compiler.codegen.lowering import counted_loop
from compiler.kernels import batched, gemm
from compiler.kernels.gemm import F32, I32, I64, Tile
from compiler.ops.recurrence import CELLS, states

# Panels one product step keeps in registers at most: each is an independent stream of
# R^T (the hardware prefetcher follows a handful per core).
MAX_GROUP = 8
# A layer with one work item (one direction, one batch block) splits its hidden units
# over the OpenMP team, with a barrier per step (`_SplitItem`), from this size of R on
# (None: never). One LSTM direction of H = 256 is 1 MiB, a whole core's L2, streamed
# once per step; halved, each core's half stays in its L2. Measured on dedicated cores
# (2-layer LSTM, H = 256, T = 128, batch 1, 2 threads, compile cache off): a recurrence
# kernel 1.72 -> 0.71 ms, the whole model 4.27 -> 2.56 ms (onnxruntime 2.8). On cores
# shared with other work a barrier per step waits for the other thread's next time
# slice (at load 5-10 it lost: 143 vs 73 ms), as every braze kernel's barrier does
# (README, "Known limit"). Below 256 KiB the barrier costs more than the halved step.
SPLIT_MIN_R_BYTES: int | None = 1 << 18


def _i64(n: int) -> ir.Constant:
    return ir.Constant(I64, int(n))


@dataclass(frozen=True)
class RecurrenceShape:
    cell: str
    t: int
    batch: int
    dirs: int
    hidden: int
    direction: str
    clip: float
    linear_before_reset: bool
    tile: Tile
    split: bool = False  # the one item's units split over the team (`_SplitItem`)

    @property
    def gates(self) -> int:
        return CELLS[self.cell]

    @property
    def width(self) -> int:
        """Columns of the recurrent product: every gate's H."""
        return self.gates * self.hidden

    @property
    def rows(self) -> int:
        """Batch rows per work item (blocks as even as MR allows)."""
        return gemm.tile_rows(self.batch, self.tile.mr)

    @property
    def row_blocks(self) -> int:
        return -(-self.batch // self.rows)

    @property
    def items(self) -> int:
        return self.dirs * self.row_blocks

    @property
    def outer(self) -> int:
        """The kernel's outer trip count: its items; a split kernel shares its one item
        out itself, and any count above 1 has the entry launch the team."""
        return 2 if self.split else self.items

    @property
    def panels(self) -> int:
        return -(-self.width // self.tile.nr)

    @property
    def pack_floats(self) -> int:
        """One direction's R^T as panels."""
        return self.panels * self.hidden * self.tile.nr

    @property
    def macs(self) -> int:
        return self.t * self.batch * self.dirs * self.width * (self.hidden + 1)

    @property
    def split_hidden(self) -> bool:
        """A GRU without linear_before_reset multiplies (r h) by R_h: a second product."""
        return self.cell == "gru" and not self.linear_before_reset

    def scratch_floats(self, packed: bool) -> int:
        """The thread's scratch: h, c and r h (rows x H each), the products (rows x
        panels x NR, two for split_hidden) and R's pack when it is not packed already."""
        gp = self.panels * self.tile.nr
        return self.rows * (3 * self.hidden + 2 * gp) + (0 if packed else self.pack_floats)

    @classmethod
    def of(cls, node, tile: Tile) -> RecurrenceShape:
        from compiler.ops.recurrence import dims

        t, batch, d, _, _ = dims(node)
        shape = cls(node.attrs["cell"], t, batch, d, node.inputs[1].shape[-1],
                    node.attrs["direction"], node.attrs["clip"],
                    node.attrs["linear_before_reset"], tile)
        lens = node.inputs[3]
        full = lens.is_const and bool((np.asarray(lens.const_value) == t).all())
        return replace(shape, split=full and _splits(shape))

    def units(self, tid, nth, b: ir.IRBuilder) -> tuple:
        """(first, end) hidden unit of thread tid of nth: whole panels of each gate."""
        blocks = _i64(self.hidden // self.tile.nr)
        first = b.udiv(b.mul(blocks, tid), nth)
        end = b.udiv(b.mul(blocks, b.add(tid, _i64(1))), nth)
        return b.mul(first, _i64(self.tile.nr)), b.mul(end, _i64(self.tile.nr))


def _splits(shape: RecurrenceShape) -> bool:
    """Whether a layer's one item splits its units over the team: every row at full
    length (a state is then the previous step's Y row, which every thread can read),
    gates that are whole panels, no second product (a split GRU's r h would need its own
    barrier), R of SPLIT_MIN_R_BYTES or more (when set), and OpenMP present."""
    from compiler.codegen import llvm_cpu

    return (SPLIT_MIN_R_BYTES is not None and shape.items == 1 and not shape.split_hidden
            and shape.hidden % shape.tile.nr == 0
            and shape.width * shape.hidden * 4 >= SPLIT_MIN_R_BYTES
            and llvm_cpu.libgomp() is not None)


def refusal(node) -> str | None:
    """None if this kernel runs recurrence `node`, else why not."""
    return refusal_for(node.inputs, node.attrs["cell"])


def refusal_for(inputs, cell: str) -> str | None:
    """None if this kernel runs a recurrence of `cell` on `inputs`, else why not."""
    x = inputs[0]
    if x.dtype != "f32":
        return f"dtype {x.dtype}: the recurrence kernel is float32 only"
    if not all(v.type.static for v in inputs):
        return "symbolic dims"
    if 0 in x.shape or inputs[1].shape[-1] == 0:
        return "an empty operand (the kernel's loops run at least once)"
    h = inputs[1].shape[-1]
    panels = -(-(CELLS[cell] * h) // batched.WIDEST_NR)
    floats = panels * batched.WIDEST_NR * (h + 2 * gemm.MAX_MR) + 3 * gemm.MAX_MR * h
    if floats * 4 > batched.SCRATCH_MAX_BYTES:
        return f"R's pack and the states ({floats * 4} bytes) exceed SCRATCH_MAX_BYTES"
    return None


def source(v):
    """The value whose buffer the kernel reads for operand `v`: through reshapes (they
    keep the row-major order, so the bytes are the same: the projection's result
    reshaped in front of the recurrence costs no copy)."""
    while v.producer is not None and v.producer.op == "reshape":
        v = v.producer.inputs[0]
    return v


def pack_r(r: np.ndarray, tile: Tile) -> np.ndarray:
    """R [D, G*H, H] as each direction's R^T in gemm panels: [D, panels, H, NR]."""
    return np.ascontiguousarray(np.stack([gemm.pack_b(np.ascontiguousarray(r[d].T), tile)
                                          for d in range(r.shape[0])]))


def _group(shape: RecurrenceShape, rows: int) -> int:
    """Panels per product step: as many as keep rows x count x NV accumulators within
    the GEMM tile's (MR x NV), up to MAX_GROUP."""
    t = shape.tile
    return max(1, min(MAX_GROUP, shape.panels, (t.mr * t.nv) // (rows * t.nv)))


class _Item:
    """One work item's code: direction `d`, batch rows row0 .. row0 + rows - 1."""

    def __init__(self, b, shape: RecurrenceShape, rows: int, d, row0, scratch, last, ptrs,
                 packed: bool):
        self.b, self.shape, self.rows, self.d, self.row0 = b, shape, rows, d, row0
        self.p, self.t = ptrs, shape.tile
        h, gp = shape.hidden, shape.panels * shape.tile.nr
        self.gp = gp
        at = [0]

        def take(n):
            ptr = self._at(scratch, _i64(at[0]))
            at[0] += n
            return ptr

        self.hs, self.cs, self.rh = take(rows * h), take(rows * h), take(rows * h)
        self.g, self.g2 = take(rows * gp), take(rows * gp)
        self.rpack = self._r(take(shape.pack_floats), last, packed)
        with b.goto_entry_block():
            self.lens = b.alloca(I64, size=_i64(rows))
        if shape.direction == "bidirectional":
            self.reverse = b.icmp_unsigned("==", d, _i64(1))
        else:
            self.reverse = ir.Constant(ir.IntType(1), shape.direction == "reverse")

    def _at(self, base, off):
        return self.b.gep(base, [off], source_etype=F32, inbounds=True)

    def _r(self, pack, last, packed: bool):
        """This direction's R^T panels: in the compile-time pack, or packed here."""
        b, shape = self.b, self.shape
        off = b.mul(self.d, _i64(shape.pack_floats))
        if packed:
            return self._at(self.p["r"], off)
        h, w = shape.hidden, shape.width

        def read(b, e, kk, col):  # R[e, col, kk]
            off = b.add(b.mul(b.add(b.mul(e, _i64(w)), col), _i64(h)), kk)
            return b.load(b.gep(self.p["r"], [off], source_etype=F32, inbounds=True), typ=F32)

        with b.if_then(b.icmp_signed("!=", b.load(last, typ=I64), self.d)):
            batched.pack_panels(b, self.t.nr, h, w, self.d, pack, read, True)
            b.store(self.d, last)
        return pack

    # -- the item ---------------------------------------------------------------------

    def run(self) -> None:
        b, shape = self.b, self.shape
        longest = _i64(0)
        for r in range(self.rows):
            n = self._length(r)
            b.store(n, b.gep(self.lens, [_i64(r)], source_etype=I64, inbounds=True))
            longest = b.select(b.icmp_signed(">", n, longest), n, longest)
            self._start(r, n)
        counted_loop(b, _i64(0), longest, self._step)
        for r in range(self.rows):
            self._finish(r)

    def _length(self, r: int):
        """lens[b] clamped to [0, T]; a length outside it is recorded as a fault
        (faults.LENGTH) where the kernel has a fault word."""
        b = self.b
        n = b.sext(b.load(b.gep(self.p["lens"], [b.add(self.row0, _i64(r))], source_etype=I32,
                                inbounds=True), typ=I32), I64)
        low, high = b.icmp_signed("<", n, _i64(0)), b.icmp_signed(">", n, _i64(self.shape.t))
        if self.p.get("faults") is not None:
            self.p["faults"].note(b, b.or_(low, high), faults.LENGTH)
        n = b.select(low, _i64(0), n)
        return b.select(high, _i64(self.shape.t), n)

    def _state(self, name: str, t, batch_row):
        """Pointer to [t, d, batch_row, :] of the result (name "out"), or to
        [d, batch_row, :] of h0 / c0."""
        b, shape = self.b, self.shape
        if name == "out":
            row = b.add(b.mul(b.add(b.mul(t, _i64(shape.dirs)), self.d), _i64(shape.batch)),
                        batch_row)
        else:
            row = b.add(b.mul(self.d, _i64(shape.batch)), batch_row)
        return self._at(self.p[name], b.mul(row, _i64(shape.hidden)))

    def _start(self, r: int, n) -> None:
        """The row's states from h0 (c0); zeros in Y from its length on."""
        b, h = self.b, self.shape.hidden
        row = b.add(self.row0, _i64(r))
        _copy(b, self._state("h0", None, row), self._at(self.hs, _i64(r * h)), h)
        if self.shape.cell == "lstm":
            _copy(b, self._state("c0", None, row), self._at(self.cs, _i64(r * h)), h)
        zero = ir.Constant(F32, 0.0)
        counted_loop(b, n, _i64(self.shape.t), lambda b, t: gemm.for_range(
            b, h, lambda b, u: _store(b, zero, self._at(self._state("out", t, row), u))))

    def _finish(self, r: int) -> None:
        """Row T of the result is the final h, row T + 1 an LSTM's final c."""
        b, shape = self.b, self.shape
        row = b.add(self.row0, _i64(r))
        src = [self.hs, self.cs][:states(shape.cell)]
        for i, s in enumerate(src):
            dst = self._state("out", _i64(shape.t + i), row)
            _copy(b, self._at(s, _i64(r * shape.hidden)), dst, shape.hidden)

    # -- one step ---------------------------------------------------------------------

    def _step(self, b, s) -> None:
        shape = self.shape
        if shape.split_hidden:
            h = shape.hidden
            self._product(self.hs, self.g, 0, -(-2 * h // self.t.nr))
            counted_loop(b, _i64(0), _i64(self.rows), lambda b, r: self._reset(b, r, s))
            self._product(self.rh, self.g2, 2 * h // self.t.nr, shape.panels)
        else:
            self._product(self.hs, self.g, 0, shape.panels)
        counted_loop(b, _i64(0), _i64(self.rows), lambda b, r: self._row(b, r, s))

    def _time(self, b, r, s):
        """(active, t): whether row r takes step s, and its timestep (0 when inactive)."""
        n = b.load(b.gep(self.lens, [r], source_etype=I64, inbounds=True), typ=I64)
        active = b.icmp_signed("<", s, n)
        t = b.select(self.reverse, b.sub(b.sub(n, _i64(1)), s), s)
        return active, b.select(active, t, _i64(0))

    def _xw(self, b, r, t):
        """Pointer to xw[t, row0 + r, d, :] (xw's rows are [T, B], its columns [D, G*H])."""
        shape = self.shape
        row = b.add(b.mul(b.add(b.mul(t, _i64(shape.batch)), b.add(self.row0, r)),
                          _i64(shape.dirs)), self.d)
        return self._at(self.p["xw"], b.mul(row, _i64(shape.width)))

    def _product(self, src, dst, p_lo: int, p_hi: int) -> None:
        """dst[r, panel cols] = src[r, :] R^T for panels p_lo .. p_hi - 1, `_group` panels
        at a time."""
        b = self.b
        count = _group(self.shape, self.rows)
        groups, rest = divmod(p_hi - p_lo, count)
        if groups:
            counted_loop(b, _i64(0), _i64(groups), lambda b, i: self._panels(
                b, src, dst, b.add(_i64(p_lo), b.mul(i, _i64(count))), count))
        if rest:
            self._panels(b, src, dst, _i64(p_lo + groups * count), rest)

    def _panels(self, b, src, dst, p0, count: int) -> None:
        """dst's columns of panels p0 .. p0 + count - 1 (one group)."""
        self._panel_group(b, src, dst, [b.add(p0, _i64(p)) for p in range(count)])

    def _panel_group(self, b, src, dst, panels: list) -> None:
        """dst[r, cols of each panel] = src[r, :] R^T for the panels (indices, in any
        order) of one group: their accumulators are independent FMA chains, the k loop
        is shared."""
        t, h, rows = self.t, self.shape.hidden, self.rows
        count = len(panels)
        starts = [b.mul(panel, _i64(h)) for panel in panels]

        def step(b, k, accs):
            hk = [gemm.splat(b, b.load(self._at(src, b.add(_i64(r * h), k)), typ=F32), t.vtype)
                  for r in range(rows)]
            new = list(accs)
            for p in range(count):
                base = b.mul(b.add(starts[p], k), _i64(t.nr))
                for v in range(t.nv):
                    vec = b.load(self._at(self.rpack, b.add(base, _i64(v * t.vec))),
                                 typ=t.vtype, align=4)
                    for r in range(rows):
                        i = (r * count + p) * t.nv + v
                        new[i] = gemm.mul_add(b, t, hk[r], vec, accs[i])
            return new

        zeros = [ir.Constant(t.vtype, None)] * (rows * count * t.nv)
        accs = gemm._phi_loop(b, h, zeros, step, name="recurrence.k")
        for r in range(rows):
            for p in range(count):
                col = b.mul(panels[p], _i64(t.nr))
                for v in range(t.nv):
                    off = b.add(_i64(r * self.gp + v * t.vec), col)
                    _store(b, accs[(r * count + p) * t.nv + v], self._at(dst, off))

    # -- the gate math ----------------------------------------------------------------

    def _reset(self, b, r, s) -> None:
        """A split GRU's r h, for the hidden gate's product."""
        _, t = self._time(b, r, s)
        x, g, h = self._xw(b, r, t), self._row_of(self.g, r, self.gp), self._row_of(self.hs, r)
        hid = self.shape.hidden

        def unit(b, u, ty):
            at = b.add(u, _i64(hid))
            gate = self._act(b, mathlib.sigmoid_f32, b.fadd(_load(b, x, at, ty),
                                                            _load(b, g, at, ty)))
            _store(b, b.fmul(gate, _load(b, h, u, ty)), self._at(self._row_of(self.rh, r), u))

        _units(b, hid, self.t, unit)

    def _row_of(self, base, r, width: int | None = None):
        return self._at(base, self.b.mul(r, _i64(width or self.shape.hidden)))

    def _act(self, b, fn, x):
        """fn(clip(x)): the activation with the node's clip on its input."""
        c = self.shape.clip
        if c > 0:
            hi, lo = _splat(b, x.type, c), _splat(b, x.type, -c)
            x = b.select(b.fcmp_ordered(">", x, hi), hi, x)
            x = b.select(b.fcmp_ordered("<", x, lo), lo, x)
        return fn(b, x)

    def _row(self, b, r, s) -> None:
        """Row r's gate math and state update at step s (nothing past its length)."""
        active, t = self._time(b, r, s)
        with b.if_then(active):
            self._cells(b, r, t, lambda body: _units(b, self.shape.hidden, self.t, body))

    def _cells(self, b, r, t, over_units) -> None:
        """Row r's gate math at timestep t, on the units `over_units(body)` visits."""
        out = self._state("out", t, b.add(self.row0, r))
        x, g = self._xw(b, r, t), self._row_of(self.g, r, self.gp)
        cell = {"lstm": self._lstm, "gru": self._gru, "rnn": self._rnn}[self.shape.cell]
        over_units(lambda b, u, ty: cell(b, r, u, ty, x, g, out))

    def _prev_row(self, b, r):
        """Row r's hidden state before this step."""
        return self._row_of(self.hs, r)

    def _gate(self, b, x, g, i: int, u, ty):
        at = b.add(u, _i64(i * self.shape.hidden))
        return b.fadd(_load(b, x, at, ty), _load(b, g, at, ty))

    def _commit(self, b, r, u, h, out) -> None:
        _store(b, h, self._at(self._row_of(self.hs, r), u))
        _store(b, h, self._at(out, u))

    def _rnn(self, b, r, u, ty, x, g, out) -> None:
        self._commit(b, r, u, self._act(b, mathlib.tanh_f32, self._gate(b, x, g, 0, u, ty)),
                     out)

    def _lstm(self, b, r, u, ty, x, g, out) -> None:
        hid = self.shape.hidden
        cptr = self._at(self._row_of(self.cs, r), u)
        c = _load(b, cptr, _i64(0), ty)
        gi, go, gf, gc = (self._gate(b, x, g, i, u, ty) for i in range(4))
        if "p" in self.p:  # peepholes, ONNX order i o f
            prow = self._at(self.p["p"], b.mul(self.d, _i64(3 * hid)))
            peep = [_load(b, prow, b.add(u, _i64(i * hid)), ty) for i in range(3)]
            gi = b.fadd(gi, b.fmul(peep[0], c))
            gf = b.fadd(gf, b.fmul(peep[2], c))
        i = self._act(b, mathlib.sigmoid_f32, gi)
        f = self._act(b, mathlib.sigmoid_f32, gf)
        c = b.fadd(b.fmul(f, c), b.fmul(i, self._act(b, mathlib.tanh_f32, gc)))
        if "p" in self.p:
            go = b.fadd(go, b.fmul(peep[1], c))
        o = self._act(b, mathlib.sigmoid_f32, go)
        _store(b, c, cptr)
        # the cell state's tanh takes no clip (onnxruntime's rule: clip bounds the gates)
        self._commit(b, r, u, b.fmul(o, mathlib.tanh_f32(b, c)), out)

    def _gru(self, b, r, u, ty, x, g, out) -> None:
        hid = self.shape.hidden
        z = self._act(b, mathlib.sigmoid_f32, self._gate(b, x, g, 0, u, ty))
        at = b.add(u, _i64(2 * hid))
        if self.shape.linear_before_reset:
            rg = self._act(b, mathlib.sigmoid_f32, self._gate(b, x, g, 1, u, ty))
            rb = _load(b, self._at(self.p["rbh"], b.mul(self.d, _i64(hid))), u, ty)
            pre = b.fadd(_load(b, x, at, ty), b.fmul(rg, b.fadd(_load(b, g, at, ty), rb)))
        else:
            g2 = self._row_of(self.g2, r, self.gp)
            pre = b.fadd(_load(b, x, at, ty), _load(b, g2, at, ty))
        cand = self._act(b, mathlib.tanh_f32, pre)
        h = _load(b, self._prev_row(b, r), u, ty)
        one = _splat(b, ty, 1.0)
        self._commit(b, r, u, b.fadd(b.fmul(b.fsub(one, z), cand), b.fmul(z, h)), out)


class _SplitItem(_Item):
    """The one item of a split kernel (`RecurrenceShape.split`), on thread tid of nth: it
    takes hidden units [first, end) of every gate (whole panels), so per step its share
    of R^T's columns and its units' gate math; the previous h is read whole from the
    previous step's Y rows (h0 at the first), which every thread wrote its units of
    before the barrier that ends each step. c stays with the thread owning its units."""

    def __init__(self, b, shape: RecurrenceShape, scratch, last, ptrs, packed: bool, tid,
                 nth):
        super().__init__(b, shape, shape.rows, _i64(0), _i64(0), scratch, last, ptrs, packed)
        self.first, self.end = shape.units(tid, nth, b)

    def run(self) -> None:
        b, shape = self.b, self.shape
        for r in range(self.rows):
            b.store(_i64(shape.t), b.gep(self.lens, [_i64(r)], source_etype=I64,
                                         inbounds=True))
            self._start(r, _i64(shape.t))
        barrier = _decl(b, "GOMP_barrier", ir.VoidType(), [])
        counted_loop(b, _i64(0), _i64(shape.t), lambda b, s: self._split_step(b, s, barrier))
        for r in range(self.rows):
            self._finish_units(r)

    def _split_step(self, b, s, barrier) -> None:
        shape = self.shape
        self.prev = self._previous(b, s)
        self._product_of_units(self.prev, self.g)
        t = b.select(self.reverse, b.sub(_i64(shape.t - 1), s), s)
        vec = self.t.vec

        def units(body):
            counted_loop(b, b.udiv(self.first, _i64(vec)), b.udiv(self.end, _i64(vec)),
                         lambda b, i: body(b, b.mul(i, _i64(vec)), self.t.vtype))

        counted_loop(b, _i64(0), _i64(self.rows), lambda b, r: self._cells(b, r, t, units))
        b.call(barrier, [])

    def _previous(self, b, s):
        """The rows of h before step s: h0's, or the previous timestep's Y rows."""
        shape = self.shape
        prev_t = b.select(self.reverse, b.sub(_i64(shape.t), s), b.sub(s, _i64(1)))
        first = b.icmp_unsigned("==", s, _i64(0))
        safe_t = b.select(first, _i64(0), prev_t)
        return b.select(first, self._state("h0", None, self.row0),
                        self._state("out", safe_t, self.row0))

    def _prev_row(self, b, r):
        return self._row_of(self.prev, r)

    def _product_of_units(self, src, dst) -> None:
        """The product's columns of this thread's units in every gate: panel j of its
        share of each gate together (with `gates` panels and more, as many shares as
        `_group` allows), so the FMA chains of one k loop are independent. One gate's
        share at a time was a loop of a panel or two per thread (LSTM, H = 256, two
        threads: 4 panels a gate), whose two accumulators waited on the FMA's latency."""
        b, shape, nr = self.b, self.shape, self.t.nr
        gates = shape.gates
        per = max(1, _group(shape, self.rows) // gates)  # shares per group
        lo = [b.udiv(b.add(_i64(g * shape.hidden), self.first), _i64(nr)) for g in range(gates)]
        share = b.udiv(b.sub(self.end, self.first), _i64(nr))  # panels of each gate

        def group(b, j, n):
            self._panel_group(b, src, dst, [b.add(lo[g], b.add(j, _i64(i)))
                                            for i in range(n) for g in range(gates)])

        groups = b.udiv(share, _i64(per))
        counted_loop(b, _i64(0), groups, lambda b, i: group(b, b.mul(i, _i64(per)), per))
        if per > 1:
            counted_loop(b, b.mul(groups, _i64(per)), share, lambda b, j: group(b, j, 1))

    def _finish_units(self, r: int) -> None:
        """This thread's units of the final h (and c)."""
        b, shape = self.b, self.shape
        row = b.add(self.row0, _i64(r))
        for i, s in enumerate([self.hs, self.cs][:states(shape.cell)]):
            src = self._at(s, _i64(r * shape.hidden))
            dst = self._state("out", _i64(shape.t + i), row)
            counted_loop(b, self.first, self.end, lambda b, u: _store(
                b, _load(b, src, u, F32), b.gep(dst, [u], source_etype=F32, inbounds=True)))


def emit_split(b: ir.IRBuilder, shape: RecurrenceShape, scratch, last, ptrs: dict,
               packed: bool) -> None:
    """A split kernel's body (`RecurrenceShape.split`): this thread's share of the one
    item (all of it outside a parallel region, where the team is one thread)."""
    omp = lambda name: b.sext(b.call(_decl(b, name, I32, []), []), I64)  # noqa: E731
    _SplitItem(b, shape, scratch, last, ptrs, packed, omp("omp_get_thread_num"),
               omp("omp_get_num_threads")).run()


def _decl(b, name: str, ret, args):
    from compiler.codegen.symbols import declare

    return declare(b.module, name, ret, args)


def emit_item(b: ir.IRBuilder, shape: RecurrenceShape, item, scratch, last, ptrs: dict,
              packed: bool) -> None:
    """Work item `item`: direction item / row_blocks, batch block item % row_blocks.
    `ptrs` maps "xw", "r" (its pack when `packed`), "h0", "lens", "out" and the cell's
    extra inputs ("c0", "p"; "rbh") to their buffers; scratch: `scratch_floats` floats
    (zeroed), last: the direction whose R the scratch holds (-1: none)."""
    blocks = shape.row_blocks
    d, rb = b.udiv(item, _i64(blocks)), b.urem(item, _i64(blocks))
    row0 = b.mul(rb, _i64(shape.rows))
    tail = shape.batch % shape.rows
    run = lambda b, rows: _Item(b, shape, rows, d, row0, scratch, last, ptrs,  # noqa: E731
                                packed).run()
    if tail == 0:
        run(b, shape.rows)
        return
    with b.if_else(b.icmp_unsigned("==", rb, _i64(blocks - 1))) as (then, otherwise):
        with then:
            run(b, tail)
        with otherwise:
            run(b, shape.rows)


# -- helpers ------------------------------------------------------------------------------

def _splat(b, ty, value: float):
    if isinstance(ty, ir.VectorType):
        return gemm.splat_constant(b, value, ty)
    return ir.Constant(F32, float(value))


def _load(b, base, off, ty):
    ptr = b.gep(base, [off], source_etype=F32, inbounds=True)
    return b.load(ptr, typ=ty, align=4)


def _store(b, x, ptr) -> None:
    b.store(x, ptr, align=4)


def _copy(b, src, dst, n: int) -> None:
    gemm.for_range(b, n, lambda b, i: _store(b, _load(b, src, i, F32),
                                             b.gep(dst, [i], source_etype=F32, inbounds=True)))


def _units(b, hidden: int, t: Tile, body) -> None:
    """body(b, u, type) over the hidden units: vectors of t.vec, then scalars."""
    whole = hidden // t.vec
    if whole:
        counted_loop(b, _i64(0), _i64(whole),
                     lambda b, i: body(b, b.mul(i, _i64(t.vec)), t.vtype))
    if hidden % t.vec:
        counted_loop(b, _i64(whole * t.vec), _i64(hidden), lambda b, u: body(b, u, F32))


def scratch(b: ir.IRBuilder, shape: RecurrenceShape, packed: bool) -> tuple:
    """(scratch, last): the thread's zeroed heap block and the direction its R pack
    holds."""
    return batched.scratch(b, shape.scratch_floats(packed))
