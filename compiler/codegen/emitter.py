"""The elemental emitter (XLA's ElementalIrEmitter): a value's element at an index.

`ElementEmitter.at(v, idx)` returns v's element at the multi-index `idx` (LLVM
i64 values) as a register value: a load if v has a buffer, else the producer's
op applied to its operands' elements at the indices the op maps to. So a chain
of elementwise and movement ops becomes one expression in one loop: fusion
needs no per-pair code. Elementwise ops go through one table (ops_llvm.py);
movement ops are index maps here. Registers hold bool as i1; buffers hold it as
i8 (numpy's layout).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from compiler import dtypes
from compiler.codegen import faults, ops_llvm
from compiler.codegen.ops_llvm import I1, I64, llvm_type, storage_type
from compiler.ir import IRError, Value
from compiler.ops import Family


def i64(n: int) -> ir.Constant:
    return ir.Constant(I64, int(n))


def linear_index(b: ir.IRBuilder, idx: list, shape: tuple):
    """Row-major offset of `idx` in `shape`."""
    off = i64(0)
    for i, d in zip(idx, shape):
        off = b.add(b.mul(off, i64(d)), i)
    return off


def delinearize(b: ir.IRBuilder, off, shape: tuple) -> list:
    """The multi-index of row-major offset `off` in `shape`."""
    idx = []
    for k, d in enumerate(reversed(shape)):
        if d == 1:
            idx.append(i64(0))
        elif k == len(shape) - 1:
            idx.append(off)  # the outermost index needs no modulo: off < prod(shape)
        else:
            idx.append(b.urem(off, i64(d)))
            off = b.udiv(off, i64(d))
    return idx[::-1]


def reshape_groups(before: tuple, after: tuple) -> list | None:
    """The reshape before -> after as consecutive groups of dims with equal products:
    [((i0, i1), (o0, o1)), ...], before[i0:i1] holding what after[o0:o1] holds (row-major
    order makes each group's elements a contiguous run of the other's). Size-1 dims join
    the group before them (or the first). None for an empty shape or a 0 dim."""
    if not before or not after or 0 in before or 0 in after:
        return None
    groups, i, o = [], 0, 0
    while i < len(before) or o < len(after):
        i0, o0 = i, o
        i, o = i + 1, o + 1
        pi, pa = before[i0], after[o0]
        while pi != pa:
            if pi < pa:
                pi, i = pi * before[i], i + 1
            else:
                pa, o = pa * after[o], o + 1
        while i < len(before) and before[i] == 1 and (o >= len(after) or after[o] != 1):
            i += 1
        while o < len(after) and after[o] == 1 and (i >= len(before) or before[i] != 1):
            o += 1
        groups.append(((i0, i), (o0, o)))
    return groups


class ElementEmitter:
    """Emits elements of values for one kernel body (see the module docstring)."""

    def __init__(self, b: ir.IRBuilder, buffers: dict[Value, ir.Value],
                 registers: dict | None = None, flat: bool = False, faults=None):
        self.b = b
        self.buffers = buffers  # value -> pointer to its first element
        # values already computed for the whole current row (reduction results):
        # the fusion plan guarantees they are only read at that row's indices
        self.registers = registers or {}
        # flat: every value is read at the same linear index (or at 0 if it has
        # one element); idx is then [linear index]
        self.flat = flat
        # faults: the kernel's faults.FaultWord, where out-of-range indices and integer
        # division by zero are recorded (None: they are only made safe, as on CUDA)
        self.faults = faults
        self.memo: dict = {}
        self._invariant: dict[Value, bool] = {}  # _row_invariant's answers
        self._flat_reads: dict[Value, bool] = {}  # _reads_flat's answers
        self._flat_twin: ElementEmitter | None = None
        # concat node -> (input number, its first index on the axis): the loop over
        # that axis was split by input (kernel_facts.concat_segments), so this element
        # reads that input with no branch
        self.pinned: dict = {}
        # constant pad node -> the axes along which its reads are known to be inside its
        # input (short_rows.py: the interior of a loop split at the padded edges)
        self.inside: dict = {}
        # constant pads test their other axes with a select over a read at a clamped
        # index, not a branch (short_rows.py: only where no read records a fault)
        self.selects = False

    def at(self, v: Value, idx: list):
        key = (v, tuple(idx))  # constants compare by value; instructions by identity
        if key not in self.memo:
            self.memo[key] = self._emit(v, idx)
        return self.memo[key]

    def index_at(self, v: Value, idx: list):
        """An element used as an index (a gather's): one scalar, whatever the emitter's
        values are (row_vectors.VectorEmitter's are vectors)."""
        return self.at(v, idx)

    # -- leaves -------------------------------------------------------------

    def load(self, v: Value, idx: list, base=None):
        """v's element at idx from its buffer (or from `base`, a buffer holding v's
        elements in row-major order: a reshaped value's operand)."""
        off = idx[0] if self.flat else linear_index(self.b, idx, v.shape)
        base = self.buffers[v] if base is None else base
        ptr = self.b.gep(base, [off], source_etype=storage_type(v.dtype), inbounds=True)
        x = self.b.load(ptr, typ=storage_type(v.dtype))
        if v.is_const:  # never written while the code runs: LLVM may hoist the load
            x.set_metadata("invariant.load", self.b.module.add_metadata([]))
        return self.b.icmp_unsigned("!=", x, ir.Constant(x.type, 0)) if v.dtype == "bool" else x

    def _operand_index(self, idx: list, u: Value, out: Value) -> list:
        if self.flat:
            return [i64(0)] if u.type.size == 1 else idx
        return broadcast_index(idx, u.shape, out.shape)

    def _emit(self, v: Value, idx: list):
        if v in self.registers:
            return self.registers[v]
        if v in self.buffers:
            return self.load(v, idx)
        p = v.producer
        if p is None:
            raise IRError(f"%{v.name} has no buffer and no producer")
        if p.op == "const":
            arr = p.attrs["value"]
            if arr.size != 1:
                raise IRError(f"constant %{v.name} of {arr.size} elements needs a buffer")
            return scalar_constant(arr.reshape(-1)[0], v.dtype)
        handler = getattr(self, "_" + p.op, None)
        if handler is not None:
            return handler(p, idx)
        args = [self.at(u, self._operand_index(idx, u, v)) for u in p.inputs]
        return ops_llvm.emit(self.b, p, args)

    def _div(self, n, idx):
        """x / y; where y is fixed for the whole row of a row kernel (softmax's sum, layer
        norm's deviation) or a scalar constant, through r = 1 / y (one division per row,
        hoisted out of the loop) and q = x * r, within an ulp of the quotient (what torch's
        and onnxruntime's softmax and norms compute too). By a constant, where a framework
        divides (x / 255, a quantizer's x / scale, which must round as the division does),
        one correction step follows (Markstein's): q + (x - q * y) * r, the residual exact
        in an FMA, is x / y correctly rounded wherever nothing overflows or underflows;
        where the residual is not finite (x or y infinite, y zero, x / y overflowing) q is
        already the quotient. Without FMA (SSE targets) the residual is rounded and the
        result within an ulp."""
        out = n.outputs[0]
        x, y = (self.at(u, self._operand_index(idx, u, out)) for u in n.inputs)
        if out.dtype in dtypes.FLOATS and self._row_invariant(n.inputs[1]):
            divisor = n.inputs[1].producer
            exact = divisor is not None and divisor.op == "const"
            return _divide_by_reciprocal(self.b, x, y, exact)
        self._note_zero_divisor(n, y)
        return ops_llvm.emit(self.b, n, [x, y])

    def _mod(self, n, idx):
        out = n.outputs[0]
        x, y = (self.at(u, self._operand_index(idx, u, out)) for u in n.inputs)
        self._note_zero_divisor(n, y)
        return ops_llvm.emit(self.b, n, [x, y])

    _fmod = _mod

    def _note_zero_divisor(self, n, y) -> None:
        """Record an integer divisor of 0 (ops_llvm divides by 1 there instead of trapping)."""
        if self.faults is not None and faults.code_of(n) == faults.ZERO_DIVISOR:
            self.faults.note(self.b, self.b.icmp_unsigned("==", y, ir.Constant(y.type, 0)),
                             faults.ZERO_DIVISOR)

    def _row_invariant(self, v: Value) -> bool:
        """Whether v is computed from reduction registers and scalar constants only."""
        if v not in self._invariant:
            p = v.producer
            if v in self.registers:
                self._invariant[v] = True
            elif p is None or v in self.buffers:
                self._invariant[v] = False
            elif p.op == "const":
                self._invariant[v] = p.attrs["value"].size == 1
            else:
                self._invariant[v] = bool(self.registers) and \
                    p.opdef.family is Family.ELEMENTWISE and all(
                        self._row_invariant(u) for u in p.inputs)
        return self._invariant[v]

    # -- movement: index maps ------------------------------------------------

    def _broadcast(self, n, idx):
        x = n.inputs[0]
        return self.at(x, broadcast_index(idx, x.shape, n.outputs[0].shape))

    def _reshape(self, n, idx):
        """A reshape maps each group of dims with equal products on its own (Swin's
        [1, 56, 56, C] -> [1, 8, 7, 8, 7, C] splits two dims and passes C through: two
        small divisions per element, not one per dim of the whole offset)."""
        x = n.inputs[0]
        if self.flat:  # the same row-major offset in x
            return self.at(x, idx)
        if x in self.buffers and x not in self.registers:
            return self.load(n.outputs[0], idx, self.buffers[x])  # same row-major offset
        if self._reads_flat(x):
            return self._flat_view().at(x, [linear_index(self.b, idx, n.outputs[0].shape)])
        groups = reshape_groups(x.shape, n.outputs[0].shape)
        if groups is None:
            off = linear_index(self.b, idx, n.outputs[0].shape)
            return self.at(x, delinearize(self.b, off, x.shape))
        src = []
        for (i0, i1), (o0, o1) in groups:
            if i1 - i0 == 1 and o1 - o0 == 1:
                src.append(idx[o0])
                continue
            # a group's map is shared by every element that has its indices (a short
            # row's unrolled elements: short_rows.py)
            key = (n, o0, tuple(idx[o0:o1]))
            if key not in self.memo:
                off = linear_index(self.b, idx[o0:o1], n.outputs[0].shape[o0:o1])
                self.memo[key] = delinearize(self.b, off, x.shape[i0:i1])
            src += self.memo[key]
        return self.at(x, src)

    def _reads_flat(self, v: Value) -> bool:
        """Whether v's element at a row-major offset reads each buffer behind it at that
        same offset (or a single element): elementwise ops over operands of v's shape or
        of one element, down to buffers, row registers and reshapes of such. A reshape of
        one (GroupNorm's (N, C, H, W) sum viewed as (N, G, C/G*H*W) rows) is then read at
        the row's offset, not through a division and a remainder per dim per element
        (PoolFormer's 1-group norm rows of 56 x 56 x 64: 849 -> 140 us)."""
        if v not in self._flat_reads:
            p = v.producer
            if v in self.registers or v in self.buffers:
                ok = True
            elif p is None:
                ok = False
            elif p.op == "const":
                ok = p.attrs["value"].size == 1
            elif p.op == "reshape":
                ok = self._reads_flat(p.inputs[0])
            else:
                ok = p.opdef.family is Family.ELEMENTWISE and all(
                    (u.type.size == 1 or u.shape == v.shape) and self._reads_flat(u)
                    for u in p.inputs)
            self._flat_reads[v] = ok
        return self._flat_reads[v]

    def _flat_view(self) -> ElementEmitter:
        """This emitter's flat twin (same buffers, registers and fault word), made once."""
        if self._flat_twin is None:
            self._flat_twin = ElementEmitter(self.b, self.buffers, self.registers, flat=True,
                                             faults=self.faults)
        return self._flat_twin

    def _transpose(self, n, idx):
        perm = n.attrs["perm"]
        src = [None] * len(perm)
        for i, p in enumerate(perm):
            src[p] = idx[i]
        return self.at(n.inputs[0], src)

    def _slice(self, n, idx):
        a = n.attrs
        src = [self.b.add(i64(s), self.b.mul(i, i64(st)))
               for i, s, st in zip(idx, a["starts"], a["steps"])]
        return self.at(n.inputs[0], src)

    def _gather(self, n, idx):
        data, indices = n.inputs
        axis = n.attrs["axis"]
        r = len(indices.shape)
        j = self.index_at(indices, idx[axis:axis + r])
        j = self.b.sext(j, I64) if j.type.width < 64 else j
        size = i64(data.shape[axis])
        j = self.b.select(self.b.icmp_signed("<", j, i64(0)), self.b.add(j, size), j)
        if self.faults is not None:  # unsigned: a still-negative index is huge
            self.faults.note(self.b, self.b.icmp_unsigned(">=", j, size), faults.INDEX)
        # out-of-range indices are a model error (recorded above); clamp so the load stays
        # in bounds
        j = self.b.select(self.b.icmp_signed("<", j, i64(0)), i64(0), j)
        j = self.b.select(self.b.icmp_signed(">=", j, size), self.b.sub(size, i64(1)), j)
        return self.at(data, idx[:axis] + [j] + idx[axis + r:])

    # -- pooling (channels-last: idx is [n, y, x, c]) ------------------------

    def _window(self, n, idx):
        """(element, inside) for each window position of pool node n at output idx; outside
        the image the element is read at a clamped index and `inside` is false."""
        a = n.attrs
        x = n.inputs[0]
        h, w = x.shape[1:3]
        b = self.b
        out = []
        for ky in range(a["kernel"][0]):
            for kx in range(a["kernel"][1]):
                iy = b.add(b.mul(idx[1], i64(a["strides"][0])),
                           i64(ky * a["dilations"][0] - a["pads"][0]))
                ix = b.add(b.mul(idx[2], i64(a["strides"][1])),
                           i64(kx * a["dilations"][1] - a["pads"][1]))
                inside = b.and_(b.icmp_unsigned("<", iy, i64(h)),
                                b.icmp_unsigned("<", ix, i64(w)))
                iy, ix = b.select(inside, iy, i64(0)), b.select(inside, ix, i64(0))
                out.append((self.at(x, [idx[0], iy, ix, idx[3]]), inside))
        return out

    def _max_pool(self, n, idx):
        dtype = n.outputs[0].dtype
        best = scalar_constant(-np.inf, dtype)
        for v, inside in self._window(n, idx):
            best = self.b.select(inside, ops_llvm.binary_float(self.b, "max", best, v), best)
        return best

    def _avg_pool(self, n, idx):
        b = self.b
        dtype = n.outputs[0].dtype
        total, count = scalar_constant(0.0, dtype), scalar_constant(0.0, dtype)
        for v, inside in self._window(n, idx):
            total = b.fadd(total, b.select(inside, v, scalar_constant(0.0, dtype)))
            count = b.fadd(count, b.uitofp(inside, llvm_type(dtype)))
        if n.attrs["count_include_pad"]:
            count = scalar_constant(float(np.prod(n.attrs["kernel"])), dtype)
        return b.fdiv(total, count)

    def _select(self, n, idx):
        out = n.outputs[0]
        c, a, b_ = (self.at(u, self._operand_index(idx, u, out)) for u in n.inputs)
        return self.b.select(c, a, b_)

    def _concat(self, n, idx):
        """A balanced tree of branches on the index (log2 of the inputs compares per
        element): each input is only read where it owns the index (or the one input the
        caller pinned for this segment of the loop). The block reading input k is
        `concat.in{k}`."""
        axis = n.attrs["axis"]
        if n in self.pinned:
            k, lo = self.pinned[n]
            src = list(idx)
            src[axis] = self.b.sub(idx[axis], i64(lo))
            return self.at(n.inputs[k], src)
        if n.outputs[0].shape[axis] == 0:  # an empty result: no element is ever read
            return scalar_constant(0, n.outputs[0].dtype)
        b = self.b
        spans, lo = [], 0  # (input number, its first index along the axis), non-empty ones
        for k, u in enumerate(n.inputs):
            if u.shape[axis]:
                spans.append((k, lo))
            lo += u.shape[axis]
        end = b.append_basic_block("concat.end")
        incoming = []

        def emit(first: int, last: int) -> None:  # spans[first:last]
            if last - first == 1:
                k, at = spans[first]
                src = list(idx)
                src[axis] = b.sub(idx[axis], i64(at))
                saved = self.memo
                self.memo = dict(saved)  # values emitted here do not dominate others
                incoming.append((self.at(n.inputs[k], src), b.block))
                self.memo = saved
                b.branch(end)
                return
            mid = (first + last) // 2
            left = b.append_basic_block(f"concat.in{spans[first][0]}")
            right = b.append_basic_block(f"concat.in{spans[mid][0]}")
            b.cbranch(b.icmp_unsigned("<", idx[axis], i64(spans[mid][1])), left, right)
            b.position_at_end(left)
            emit(first, mid)
            b.position_at_end(right)
            emit(mid, last)

        emit(0, len(spans))
        b.position_at_end(end)
        phi = b.phi(llvm_type(n.outputs[0].dtype))
        for val, blk in incoming:
            phi.add_incoming(val, blk)
        return phi

    def _pad(self, n, idx):
        x = n.inputs[0]
        a = n.attrs
        r = len(x.shape)
        begin = a["pads"][:r]
        b = self.b
        src = [b.sub(i, i64(p)) for i, p in zip(idx, begin)]
        if a["mode"] == "constant":
            return self._pad_constant(n, x, src)
        fix = {"edge": _edge, "reflect": _reflect, "wrap": _wrap}[a["mode"]]
        return self.at(x, [fix(b, s, d) if (p or q) else s
                           for s, d, p, q in zip(src, x.shape, begin, a["pads"][r:])])

    def _pad_constant(self, n, x, src):
        b = self.b
        known = self.inside.get(n, frozenset())
        if len(known) == len(src):
            return self.at(x, src)
        inside = ir.Constant(I1, 1)
        for a, (s, d) in enumerate(zip(src, x.shape)):
            if a not in known:  # unsigned: negative -> huge
                inside = b.and_(inside, b.icmp_unsigned("<", s, i64(d)))
        fill = scalar_constant(np.array(n.attrs["value"]).astype(dtypes.to_numpy(x.dtype)),
                               x.dtype)
        if self.selects:
            safe = [s if a in known else b.select(inside, s, i64(0)) for a, s in enumerate(src)]
            return b.select(inside, self.at(x, safe), fill)
        take = b.append_basic_block("pad.in")
        end = b.append_basic_block("pad.end")
        before = b.block
        b.cbranch(inside, take, end)
        b.position_at_end(take)
        saved = self.memo
        self.memo = dict(saved)
        val = self.at(x, src)
        self.memo = saved
        take_end = b.block
        b.branch(end)
        b.position_at_end(end)
        phi = b.phi(val.type)
        phi.add_incoming(val, take_end)
        phi.add_incoming(fill, before)
        return phi


def _edge(b, s, d):
    s = b.select(b.icmp_signed("<", s, i64(0)), i64(0), s)
    return b.select(b.icmp_signed(">=", s, i64(d)), i64(d - 1), s)


def _reflect(b, s, d):
    period = 2 * (d - 1)
    m = b.srem(s, i64(period))
    m = b.select(b.icmp_signed("<", m, i64(0)), b.add(m, i64(period)), m)
    return b.select(b.icmp_signed(">=", m, i64(d)), b.sub(i64(period), m), m)


def _wrap(b, s, d):
    m = b.srem(s, i64(d))
    return b.select(b.icmp_signed("<", m, i64(0)), b.add(m, i64(d)), m)


def broadcast_index(idx: list, in_shape: tuple, out_shape: tuple) -> list:
    """numpy broadcasting: align right, size-1 dims read index 0."""
    off = len(out_shape) - len(in_shape)
    return [i64(0) if d == 1 else idx[off + k] for k, d in enumerate(in_shape)]


def scalar_constant(x, dtype: str) -> ir.Constant:
    t = llvm_type(dtype)
    if dtype == "bool":
        return ir.Constant(I1, int(bool(x)))
    if dtype in dtypes.FLOATS:
        return ir.Constant(t, float(x))
    return ir.Constant(t, int(x))


def _divide_by_reciprocal(b: ir.IRBuilder, x, y, exact: bool):
    """x / y from y's reciprocal, corrected to the exact quotient if `exact`
    (ElementEmitter._div)."""
    r = b.fdiv(ir.Constant(y.type, 1.0), y)
    q = b.fmul(x, r)
    if not exact:
        return q
    t = x.type
    fmuladd = ops_llvm.intrinsic(b, "llvm.fmuladd", t, 3)
    fabs = ops_llvm.intrinsic(b, "llvm.fabs", t)
    residual = b.call(fmuladd, [b.fneg(q), y, x])
    corrected = b.call(fmuladd, [residual, r, q])
    finite = b.fcmp_ordered("<", b.call(fabs, [residual]), ir.Constant(t, float("inf")))
    return b.select(finite, corrected, q)
