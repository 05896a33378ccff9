"""Row kernels of the CPU renderer (cpu.Renderer): reductions fused with what they read.

A row kernel (compiler/passes/fuse.py) runs per row one inner loop per level of
reductions, its accumulators in registers (float sums reassociable, so they vectorize
with one partial sum per lane), then one inner loop writing the root's row; values
kept per row live in scratch rows (row_state.py). A row kernel that keeps its last
dim (a global pool over channels-last activations: `kernel_facts.by_columns`) runs by
columns instead, the kept dim contiguous and vectorized, its positions added in blocks
of about sqrt(count) (`column_blocks`).
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir

from compiler.codegen.emitter import ElementEmitter, delinearize, i64, linear_index
from compiler.codegen.lowering import (combine, counted_loop, reduce_init, store_element,
                                       without)
from compiler.codegen.ops_llvm import llvm_type
from compiler.codegen.row_state import Accumulator as _Accumulator
from compiler.codegen.row_state import RowCache as _RowCache
from compiler.ir import Value
from compiler.kernels import gemm
from compiler.passes.fuse import Kernel

# Reduced positions at least for a column reduction to go in blocks (fewer: one pass).
COLUMN_BLOCK_MIN = 16
# A column reduction's kept dim accumulates in explicit vectors (registers) up to this
# many floats (longer ones: the loop vectorizer serves them, contiguous; see
# Renderer._column_lanes).
COLUMN_VECTORS_MAX = 64


def column_blocks(count: int) -> tuple[int, int]:
    """(positions per block, blocks) for a column reduction over `count` positions.
    Added one after another, a float32 sum's rounding grows with the count (a 13x13
    global pool: the last of 169 additions rounds at 169x the mean's size; measured 3-4
    ulps of the result against torch's ~1); in blocks of about sqrt(count) it grows
    with about 2 sqrt(count) (26 for 13x13), for one more pass over a scratch row per
    block."""
    if count < COLUMN_BLOCK_MIN:
        return count, 1
    size = math.isqrt(count - 1) + 1  # ceil(sqrt(count))
    return size, -(-count // size)


class RowKernels:
    """cpu.Renderer's row and column reduction kernels (a mixin: it uses the
    renderer's `_emitter` and `target`)."""

    def _row_kernel(self, b, ptrs, k: Kernel, o) -> None:
        """One row: a pass per level of reductions, then the root's row."""
        keep_dims = [d for d in range(len(k.domain)) if d not in k.axes]
        red_shape = tuple(k.domain[d] for d in k.axes)
        n_red = int(np.prod(red_shape, dtype=np.int64))
        kept_idx = delinearize(b, o, tuple(k.domain[d] for d in keep_dims))

        def full_index(b, j):
            idx = [None] * len(k.domain)
            for d, i in zip(keep_dims, kept_idx):
                idx[d] = i
            for d, i in zip(k.axes, delinearize(b, j, red_shape)):
                idx[d] = i
            return idx

        registers: dict[Value, ir.Value] = {}
        rows = _RowCache(b, k.row_cached, n_red)
        for level in k.levels:
            accs = [_Accumulator(b, r) for r in level]

            def step(b, j):
                em = self._emitter(b, ptrs, registers)
                idx = full_index(b, j)
                rows.seed(b, em, idx, j)
                for acc in accs:
                    acc.update(b, em.at(acc.node.inputs[0], idx), j)
                rows.keep(b, em, idx, j)

            counted_loop(b, i64(0), i64(n_red), step)
            rows.end_pass()
            for acc in accs:
                registers[acc.node.outputs[0]] = acc.result(b)
        root = k.root
        if root in registers:  # the root is a reduction: one element per row
            store_element(b, ptrs[root], root.dtype, o, registers[root])
        elif root.shape == k.domain:  # a last pass writes the row
            def write(b, j):
                em = self._emitter(b, without(ptrs, root), registers)
                idx = full_index(b, j)
                rows.seed(b, em, idx, j)
                off = linear_index(b, idx, k.domain)
                store_element(b, ptrs[root], root.dtype, off, em.at(root, idx))

            counted_loop(b, i64(0), i64(n_red), write)
        else:  # a row-shaped root (D_keep or D_nokeep, fuse.py): one element per row
            idx = list(kept_idx)
            if root.shape == k.row_shapes()[0] and len(root.shape) == len(k.domain):
                idx = full_index(b, i64(0))
            em = self._emitter(b, without(ptrs, root), registers)
            store_element(b, ptrs[root], root.dtype, o, em.at(root, idx))

    def _column_kernel(self, b, ptrs, k: Kernel, o) -> None:
        """A row kernel that keeps its last dim (`by_columns`: a global pool over
        channels-last activations), for the outer kept index o: one pass over the reduced
        dims with the last dim innermost (contiguous, vectorized), each reduction
        accumulating into a scratch row of that dim, then the root's row from them. The
        reduced positions go in blocks (`column_blocks`): each block accumulates into a
        second scratch row, combined into the first at the block's end."""
        dom, reds = k.domain, k.levels[0]
        last, n = len(dom) - 1, dom[-1]
        outer = delinearize(b, o, tuple(dom[d] for d in range(last) if d not in k.axes))
        red_shape = tuple(dom[d] for d in k.axes)
        count = int(np.prod(red_shape, dtype=np.int64))
        size, blocks = column_blocks(count)
        types = [llvm_type(r.inputs[0].dtype) for r in reds]
        with b.goto_entry_block():  # scratch rows per reduction, on this thread's stack
            rows = [b.alloca(t, size=i64(n)) for t in types]
            parts = [b.alloca(t, size=i64(n)) for t in types] if blocks > 1 else rows

        def index(reduced: list, c) -> list:
            idx, kept = [None] * len(dom), iter(outer)
            for d in range(last):
                idx[d] = reduced[k.axes.index(d)] if d in k.axes else next(kept)
            return idx[:last] + [c]

        def slot(b, scratch, i, c):
            return b.gep(scratch[i], [c], source_etype=types[i], inbounds=True)

        def init(b, scratch):
            counted_loop(b, i64(0), i64(n), lambda b, c: [
                b.store(reduce_init(r.op, r.inputs[0].dtype), slot(b, scratch, i, c))
                for i, r in enumerate(reds)])

        def fold(b, scratch, c, value_of):  # scratch[i][c] = combine(it, value_of(i))
            for i, r in enumerate(reds):
                cur = b.load(slot(b, scratch, i, c), typ=types[i])
                b.store(combine(b, r.op, r.inputs[0].dtype, cur, value_of(i)),
                        slot(b, scratch, i, c))

        lanes = self._column_lanes(k, ptrs)
        wide = n - n % lanes if lanes else 0  # columns in whole vectors, from 0
        vt = ir.VectorType(gemm.F32, lanes) if lanes else None

        def vector_at(b, reduced, c0, i):  # lanes c0.. of reduction i's input
            idx = index(reduced, i64(c0))
            off = i64(0)
            for d, extent in enumerate(dom):
                off = b.add(b.mul(off, i64(extent)), idx[d])
            src = b.gep(ptrs[reds[i].inputs[0]], [off], source_etype=gemm.F32, inbounds=True)
            return b.load(src, typ=vt, align=4)

        def span(b, lo, hi, scratch):
            """Positions [lo, hi) into `scratch`: whole vectors in registers (their own
            allocas, promoted), the other columns through the scratch row."""
            with b.goto_entry_block():
                accs = {(i, c0): b.alloca(vt) for i in range(len(reds))
                        for c0 in range(0, wide, lanes or 1)}
            for (i, c0), a in accs.items():
                b.store(ir.Constant(vt, [reduce_init(reds[i].op, "f32")] * lanes), a)

            def step(b, j):
                reduced = delinearize(b, j, red_shape)
                for (i, c0), a in accs.items():
                    x = vector_at(b, reduced, c0, i)
                    b.store(combine(b, reds[i].op, "f32", b.load(a, typ=vt), x), a)

                def column(b, c):
                    em = ElementEmitter(b, ptrs)
                    fold(b, scratch, c, lambda i: em.at(reds[i].inputs[0], index(reduced, c)))

                counted_loop(b, i64(wide), i64(n), column)

            counted_loop(b, lo, hi, step)
            for (i, c0), a in accs.items():
                dst = b.gep(scratch[i], [i64(c0)], source_etype=gemm.F32, inbounds=True)
                b.store(b.load(a, typ=vt), b.bitcast(dst, vt.as_pointer()), align=4)

        def block(b, q):
            lo = b.mul(q, i64(size))
            end = b.add(lo, i64(size))
            hi = b.select(b.icmp_signed("<", end, i64(count)), end, i64(count))
            init(b, parts)
            span(b, lo, hi, parts)
            counted_loop(b, i64(0), i64(n), lambda b, c: fold(
                b, rows, c, lambda i: b.load(slot(b, parts, i, c), typ=types[i])))

        init(b, rows)
        if blocks > 1:
            counted_loop(b, i64(0), i64(blocks), block)
        else:
            span(b, i64(0), i64(count), rows)
        root = k.root
        full = len(root.shape) == len(dom)  # keepdims: the reduced dims are 1s

        def write(b, c):
            registers = {r.outputs[0]: b.load(slot(b, rows, i, c), typ=types[i])
                         for i, r in enumerate(reds)}
            em = ElementEmitter(b, without(ptrs, root), registers)
            idx = index([i64(0)] * len(k.axes), c) if full else list(outer) + [c]
            store_element(b, ptrs[root], root.dtype, b.add(b.mul(o, i64(n)), c),
                          em.at(root, idx))

        counted_loop(b, i64(0), i64(n), write)

    def _column_lanes(self, k: Kernel, ptrs) -> int:
        """Lanes of the explicit vectors a column reduction accumulates in registers, or 0
        for none. LLVM's loop vectorizer left a short kept dim badly served: below its
        vector body's VF x interleave iterations it fully unrolled that loop and vectorized
        the positions' loop instead, with gathers (a global pool over 112x112x32: 158 us,
        explicit vectors ~20). Taken for float32 sums, maxima and minima read straight
        from a buffer of the domain's shape, when the kept dim holds a vector at least and
        at most COLUMN_VECTORS_MAX elements (accumulators in registers)."""
        lanes, n = self.tile.vec, k.domain[-1]
        if not lanes <= n <= COLUMN_VECTORS_MAX:
            return 0
        for r in k.levels[0]:
            u = r.inputs[0]
            if (r.op not in ("reduce_sum", "reduce_max", "reduce_min") or u.dtype != "f32"
                    or u not in ptrs or u.shape != k.domain):
                return 0
        return lanes
