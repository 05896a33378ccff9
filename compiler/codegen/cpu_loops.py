"""Loop kernels of the CPU renderer (cpu.Renderer): elementwise and movement roots.

The inner loop runs over the root's last dim (`_row_of_loop`; a concat read at the
root's own last-axis index as one branch-free loop per input), so it is contiguous and
the loop vectorizer widens it; a flat elementwise kernel runs blocks of LOOP_BLOCK
linear elements (`_flat_block`); where the last dim is short (up to 8 elements,
short_rows.py), over the dim before it, each short row unrolled inside (`_short_block`);
a transpose that moves its source's last axis to a row dim writes a group of rows per
step of the inner loop (`_row_group`, kernel_facts.row_group).
"""

from __future__ import annotations

from compiler.codegen.emitter import delinearize, i64
from compiler.codegen.kernel_facts import LOOP_BLOCK, RowGroups, concat_segments
from compiler.codegen.kernel_facts import interleave as _interleave
from compiler.codegen.lowering import counted_loop, store_element, without
from compiler.codegen.short_rows import ShortRows
from compiler.passes.fuse import Kernel


class LoopKernels:
    """cpu.Renderer's loop kernels (a mixin: it uses the renderer's `_emitter` and
    `target`)."""

    def _flat_block(self, b, ptrs, k: Kernel, o, size: int) -> None:
        start = b.mul(o, i64(LOOP_BLOCK))
        end = b.add(start, i64(LOOP_BLOCK))
        end = b.select(b.icmp_signed("<", end, i64(size)), end, i64(size))

        def element(b, j):
            em = self._emitter(b, without(ptrs, k.root), flat=True)
            store_element(b, ptrs[k.root], k.root.dtype, j, em.at(k.root, [j]))

        counted_loop(b, start, end, element, hints=self._loop_hints(k, min(size, LOOP_BLOCK)))

    def _loop_hints(self, k: Kernel, trip: int) -> dict | None:
        """LLVM loop metadata for a loop kernel's element loop of `trip` elements
        (kernel_facts.interleave)."""
        copies = _interleave(k, trip, self.target.vec)
        return {"llvm.loop.interleave.count": copies} if copies else None

    def _row_of_loop(self, b, ptrs, k: Kernel, o, inner: int, known=None) -> None:
        """Row o of a loop kernel's root; `known` maps values to constant registers (an
        empty contraction's zero result)."""
        root = k.root
        head = delinearize(b, o, root.shape[:-1]) if root.shape else []
        base = b.mul(o, i64(inner))

        def element(b, j, pinned=None):
            em = self._emitter(b, without(ptrs, root), known)
            em.pinned = pinned or {}
            idx = head + [j] if root.shape else []
            store_element(b, ptrs[root], root.dtype, b.add(base, j), em.at(root, idx))

        split = concat_segments(k) if known is None else None
        if split is None:
            counted_loop(b, i64(0), i64(inner), element, hints=self._loop_hints(k, inner))
            return
        node, segments = split
        for lo, hi, i in segments:  # one branch-free loop per input of the concat
            counted_loop(b, i64(lo), i64(hi),
                         lambda b, j, pin={node: (i, lo)}: element(b, j, pin),
                         hints=self._loop_hints(k, hi - lo))

    def _row_group(self, b, ptrs, k: Kernel, o, groups: RowGroups) -> None:
        """Item o of a loop kernel whose rows go in groups (kernel_facts.row_group): the
        rows of `group` consecutive indices of one row dim, the inner loop over the row's
        elements outside and the group's rows unrolled inside, so each step reads
        `group` neighbours of one source row. A last group short of indices runs row by
        row."""
        root = k.root
        inner, group = root.shape[-1], groups.group
        blocks = -(-groups.count // group)
        outer, block, within = delinearize(b, o, (groups.outer, blocks, groups.inner))
        first = b.mul(block, i64(group))

        def row(b, index):  # the row of index `index` of the grouped dim
            at = b.add(b.mul(outer, i64(groups.count)), index)
            return b.add(b.mul(at, i64(groups.inner)), within)

        full = b.icmp_signed("<=", b.add(first, i64(group)), i64(groups.count))
        with b.if_else(full) as (whole, part):
            with whole:
                rows = [row(b, b.add(first, i64(r))) for r in range(group)]
                heads = [delinearize(b, r, root.shape[:-1]) for r in rows]
                bases = [b.mul(r, i64(inner)) for r in rows]

                def step(b, j):
                    em = self._emitter(b, without(ptrs, root))
                    for head, base in zip(heads, bases):
                        store_element(b, ptrs[root], root.dtype, b.add(base, j),
                                      em.at(root, head + [j]))

                counted_loop(b, i64(0), i64(inner), step)
            with part:
                counted_loop(b, first, i64(groups.count), lambda b, index: self._row_of_loop(
                    b, ptrs, k, row(b, index), inner))

    def _short_block(self, b, ptrs, k: Kernel, o, short: ShortRows) -> None:
        """Block o of a short-row loop kernel (short_rows.py): a loop over indices w of the
        root's second-to-last dim, each iteration writing w's whole row, unrolled (LLVM's
        vectorizer widens it over w); where constant pads' checks are known to pass on an
        interior of w, the loop splits into the padded edges and that interior."""
        root = k.root
        inner, last = root.shape[-2:]
        if short.blocks == 1:
            row, first, end = o, i64(0), i64(inner)
        else:
            row = b.udiv(o, i64(short.blocks))
            first = b.mul(b.urem(o, i64(short.blocks)), i64(short.block))
            end = b.add(first, i64(short.block))
            end = b.select(b.icmp_signed("<", end, i64(inner)), end, i64(inner))
        head = delinearize(b, row, root.shape[:-2])
        start = b.mul(row, i64(inner))

        def element(b, w, inside):
            em = self._emitter(b, without(ptrs, root))
            em.inside, em.selects = inside, short.selects
            base = b.mul(b.add(start, w), i64(last))
            for c in range(last):
                store_element(b, ptrs[root], root.dtype, b.add(base, i64(c)),
                              em.at(root, head + [w, i64(c)]))

        if not short.inside:
            counted_loop(b, first, end, lambda b, w: element(b, w, {}))
            return
        lo, hi = (i64(x) for x in short.interior)
        lo = b.select(b.icmp_signed("<", lo, first), first, lo)  # clamped to [first, end)
        lo = b.select(b.icmp_signed(">", lo, end), end, lo)
        hi = b.select(b.icmp_signed("<", hi, lo), lo, hi)
        hi = b.select(b.icmp_signed(">", hi, end), end, hi)
        edge = {"llvm.loop.vectorize.width": 1}  # the pads' widths: no vector code for them
        counted_loop(b, first, lo, lambda b, w: element(b, w, {}), hints=edge)
        counted_loop(b, lo, hi, lambda b, w: element(b, w, short.inside))
        counted_loop(b, hi, end, lambda b, w: element(b, w, {}), hints=edge)
