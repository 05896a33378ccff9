"""Per-row state of a row kernel (cpu_rows.RowKernels._row_kernel): scratch rows for values
kept between passes, and a reduction's running value."""

from __future__ import annotations

from llvmlite import ir

from compiler.codegen.emitter import ElementEmitter, i64
from compiler.codegen.lowering import arg_take, combine, reduce_init
from compiler.codegen.ops_llvm import I64, llvm_type
from compiler.ir import Value

class RowCache:
    """Scratch rows for a row kernel's `row_cached` values (fuse.py): the first pass
    that computes one at the pass's own index stores it; later passes load it there."""

    def __init__(self, b: ir.IRBuilder, values: list[Value], n_red: int):
        self.values, self.stored, self.pending = values, set(), set()
        self.rows = {}
        with b.goto_entry_block():  # one scratch row per value, on this thread's stack
            for v in values:
                self.rows[v] = b.alloca(llvm_type(v.dtype), size=i64(n_red))

    def seed(self, b, em: ElementEmitter, idx: list, j) -> None:
        """Offer the kept values to this pass's emitter, at the pass's index."""
        for v in self.stored:
            ptr = b.gep(self.rows[v], [j], source_etype=llvm_type(v.dtype), inbounds=True)
            em.memo[(v, tuple(idx))] = b.load(ptr, typ=llvm_type(v.dtype))

    def keep(self, b, em: ElementEmitter, idx: list, j) -> None:
        """Store the kept values this pass computed at its index (not yet stored)."""
        for v in self.values:
            x = em.memo.get((v, tuple(idx)))
            if v not in self.stored and x is not None:
                b.store(x, b.gep(self.rows[v], [j], source_etype=llvm_type(v.dtype),
                                 inbounds=True))
                self.pending.add(v)

    def end_pass(self) -> None:
        self.stored |= self.pending
        self.pending = set()


class Accumulator:
    """One reduction's running value (and argmax/argmin's index) over a row."""

    def __init__(self, b: ir.IRBuilder, node):
        self.node = node
        self.dtype = node.inputs[0].dtype
        self.arg = node.op in ("argmax", "argmin")
        self.t = llvm_type(self.dtype)
        with b.goto_entry_block():  # allocas in the entry block: promoted to registers
            self.acc = b.alloca(self.t)
            self.best = b.alloca(I64) if self.arg else None
        b.store(reduce_init(node.op, self.dtype), self.acc)
        if self.arg:
            b.store(i64(0), self.best)

    def update(self, b: ir.IRBuilder, val, j) -> None:
        cur = b.load(self.acc, typ=self.t)
        if self.arg:
            take = arg_take(b, self.node, val, cur, self.dtype)
            b.store(b.select(take, val, cur), self.acc)
            b.store(b.select(take, j, b.load(self.best, typ=I64)), self.best)
        else:
            b.store(combine(b, self.node.op, self.dtype, cur, val), self.acc)

    def result(self, b: ir.IRBuilder):
        return b.load(self.best, typ=I64) if self.arg else b.load(self.acc, typ=self.t)
