"""Register-blocked float32 GEMM for a matmul whose right operand is computed at run time.

    C[b, M, N] = A[b, M, K] @ B[b, K, N]      (b: the broadcast batch dims, flattened)

Both operands are activations (attention's Q x K^T and P x V, batched over batch and
heads), or the weight is a graph input. B cannot be packed at compile time, so each
thread packs it at run time, one batch entry at a time, into a scratch of its own
(`gemm.pack_b`'s layout: panels of K rows of NR floats, zero-padded past N), and runs
gemm.py's micro-kernel (`gemm.accumulate`, `gemm.store_tile`) on it. Work items are
(batch entry, row block), batch-major, so a thread's run of items packs each batch
entry's B once; every item computes all the panels of its row block.

B is read through the elemental emitter while packing, so a movement op between B and
its buffer (K^T: a transpose of the keys; a reshape splitting heads) is index
arithmetic in the packing loop: the fusion plan leaves such an operand unmaterialized
(`folds_operand`), and K^T is never written. A's rows are read in place (contiguous K),
from its own buffer at its broadcast batch entry. When B has no batch dims, A's batch
dims fold into M (one batch entry: a Linear layer whose weight is an input).

The scratch is one heap block per thread per kernel call (malloc'd at the call's
start, K * ceil(N / NR) * NR floats), zeroed once so the padding columns read 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from compiler.kernels import gemm, summation
from compiler.kernels.gemm import F32, I64, PTR, Tile

# Widest panel of any target's tile (gemm.MIN_NR rounds NR up to 16 or 32): the bound the
# refusal checks a pack's size with, before a target is known.
WIDEST_NR = 32
# B packs above this many bytes per thread are refused (the scratch is a heap block per
# thread; past L3 the packing no longer pays for itself over the row kernel's streaming).
SCRATCH_MAX_BYTES = 1 << 26


def _i64(n: int) -> ir.Constant:
    return ir.Constant(I64, int(n))


def refusal(node) -> str | None:
    """None if matmul `node` runs on this kernel, else why not."""
    a, w = node.inputs
    if node.outputs[0].dtype != "f32":
        return f"dtype {node.outputs[0].dtype}: the run-time-packed GEMM is float32 only"
    if gemm.refusal(node) is None:
        return "the right operand is a constant: the compile-time-packed GEMM takes it"
    if not (a.type.static and w.type.static):
        return "operands with symbolic dims"
    if 0 in a.shape or 0 in w.shape:
        return "an empty operand (the micro-kernel's loops run at least once)"
    k, n = a.shape[-1], w.shape[-1]
    floats = k * -(-n // WIDEST_NR) * WIDEST_NR
    if floats * 4 > SCRATCH_MAX_BYTES:
        return f"B's pack of {floats * 4} bytes exceeds SCRATCH_MAX_BYTES={SCRATCH_MAX_BYTES}"
    return None


def folds_operand(node, u) -> bool:
    """Whether `u`, the right operand of a matmul that runs on this kernel (the caller
    knows from choice.choose), is read through the packing loop's index arithmetic (a
    movement op's result) instead of a buffer of its own."""
    from compiler.ops import Family

    return (u is node.inputs[1] and u is not node.inputs[0]
            and u.producer is not None and u.producer.opdef.family is Family.MOVEMENT)


@dataclass(frozen=True)
class BatchedShape:
    batch: tuple  # C's batch dims (empty when A's fold into M)
    m: int
    k: int
    n: int
    tile: Tile

    @property
    def entries(self) -> int:
        return int(np.prod(self.batch, dtype=np.int64))

    @property
    def row_blocks(self) -> int:
        return -(-self.m // gemm.tile_rows(self.m, self.tile.mr))

    @property
    def panels(self) -> int:
        return -(-self.n // self.tile.nr)

    @property
    def items(self) -> int:
        return self.entries * self.row_blocks

    @property
    def scratch_floats(self) -> int:
        return self.k * self.panels * self.tile.nr

    @classmethod
    def of(cls, node, tile: Tile) -> BatchedShape:
        a, w = node.inputs
        out = node.outputs[0].shape
        if all(d == 1 for d in w.shape[:-2]) and len(w.shape) <= len(a.shape):
            return cls((), int(np.prod(out[:-1], dtype=np.int64)), a.shape[-1], w.shape[-1],
                       tile)
        return cls(tuple(out[:-2]), out[-2], a.shape[-1], w.shape[-1], tile)


def scratch(b: ir.IRBuilder, floats: int) -> tuple:
    """(pack, last) for this call: the thread's zeroed heap block of `floats` floats for
    a pack and the batch entry it holds (-1: none yet). `release` frees the block."""
    size = _i64(floats * 4)
    pack = b.call(_decl(b, "malloc", PTR, [I64]), [size])
    memset = _decl(b, "llvm.memset.p0.i64", ir.VoidType(), [PTR, ir.IntType(8), I64,
                                                             ir.IntType(1)])
    b.call(memset, [pack, ir.Constant(ir.IntType(8), 0), size, ir.Constant(ir.IntType(1), 0)])
    with b.goto_entry_block():
        last = b.alloca(I64)
    b.store(_i64(-1), last)
    return pack, last


def release(b: ir.IRBuilder, pack) -> None:
    b.call(_decl(b, "free", ir.VoidType(), [PTR]), [pack])


def _decl(b: ir.IRBuilder, name: str, ret, args):
    try:
        return b.module.get_global(name)
    except KeyError:
        return ir.Function(b.module, ir.FunctionType(ret, args), name)


def emit_item(b: ir.IRBuilder, shape: BatchedShape, item, pack, last, read_b, a_row,
              c_ptr, after=None, before=None, transform=None, b_rows_inner=False) -> None:
    """Work item `item`: row block (item % row_blocks) of batch entry (item / row_blocks),
    all panels. `read_b(b, entry, kk, col) -> float` reads B[entry, kk, col] (an emitter
    expression); `a_row(b, entry, row) -> ptr` points at A's row (K contiguous floats);
    `after`, `before`, `transform` are gemm.emit_item's hooks, given C's global row.
    `b_rows_inner`: pack B with kk innermost (B is K^T: its K is contiguous)."""
    blocks = shape.row_blocks
    entry, rb = b.udiv(item, _i64(blocks)), b.urem(item, _i64(blocks))
    stale = b.icmp_signed("!=", b.load(last, typ=I64), entry)
    with b.if_then(stale):
        pack_panels(b, shape.tile.nr, shape.k, shape.n, entry, pack, read_b, b_rows_inner)
        b.store(entry, last)
    t = shape.tile
    mr = gemm.tile_rows(shape.m, t.mr)
    local0 = b.mul(rb, _i64(mr))
    row0 = b.add(b.mul(entry, _i64(shape.m)), local0)  # C's global row

    def tile(b, rows):
        ptrs = [a_row(b, entry, b.add(local0, _i64(r))) for r in range(rows)]

        def panel_body(b, panel):
            if before is not None:
                before(b, rows, row0, panel)
            vals = summation.accumulate(b, t, rows, pack, b.mul(panel, _i64(shape.k)), 1,
                                        shape.k, lambda b, kk: ptrs)
            gemm.store_tile(b, t, shape.n, rows, vals, c_ptr, row0, panel, transform=transform)
            if after is not None:
                after(b, rows, row0, panel)

        gemm.for_range(b, shape.panels, panel_body)

    tail = shape.m % mr
    if tail == 0:
        tile(b, mr)
        return
    with b.if_else(b.icmp_unsigned("==", rb, _i64(blocks - 1))) as (then, otherwise):
        with then:
            tile(b, tail)
        with otherwise:
            tile(b, mr)


def pack_panels(b: ir.IRBuilder, nr: int, k: int, n: int, entry, pack, read_b,
                rows_inner) -> None:
    """B[entry] (K x N, `read_b(b, entry, kk, col)`) into `pack` as panels [panels, K, nr]
    (the padding is left as it is: zero)."""

    def put(b, kk, col):
        panel, c = b.udiv(col, _i64(nr)), b.urem(col, _i64(nr))
        off = b.add(b.mul(b.add(b.mul(panel, _i64(k)), kk), _i64(nr)), c)
        b.store(read_b(b, entry, kk, col),
                b.gep(pack, [off], source_etype=F32, inbounds=True))

    if rows_inner:
        gemm.for_range(b, n, lambda b, col: gemm.for_range(b, k, lambda b, kk: put(b, kk, col)))
    else:
        gemm.for_range(b, k, lambda b, kk: gemm.for_range(b, n, lambda b, col: put(b, kk, col)))

