"""The `scatter` op's kernel (compiler/ops/scatter.py): data copied to the result, then
the updates written at their run-time flat positions, in order.

A work item owns a run of whole rows of the result (rows of data's last dim): it copies
data's elements there (read through the element emitter: a buffer, or a folded
expression such as a broadcast zero, so `zeros.scatter_add(...)` writes no zeros
first), then walks every update in row-major order and applies those whose position
falls in its run:

    out[p] = u                       reduction "none" (the last write wins)
    out[p] = f(out[p], u)            add, mul, max, min

Each position is owned by one item and each item walks the updates in order, so the
result is the sequential one however the items are spread over threads. Walking the
updates costs each item an index computation per update, so a result is cut into
several items only where that stays below the copy itself: items = min(ceil(size /
COPY_BLOCK), size // updates) (a KV cache of 8M floats updated at one position of 4K:
128 items, each reading the 4K indices once; a GNN's scatter_add of many edges into few
nodes: one item). An update's value is read only where its item owns the position.

Positions outside [0, size) are recorded as faults.INDEX (BrazeIndexError at the end of
the call) and not written: the importers map an index out of its own axis to `size`.
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from compiler import dtypes
from compiler.codegen import faults
from compiler.codegen.emitter import delinearize, i64
from compiler.codegen.lowering import counted_loop, store_element
from compiler.codegen.ops_llvm import I64, binary_float, binary_int, storage_type

# Elements of the result one work item copies (at least): a few hundred KiB, enough to
# amortize a thread's start, small enough to spread a large cache over the threads.
COPY_BLOCK = 1 << 16


@dataclass(frozen=True)
class ScatterShape:
    """A scatter kernel's work: `total` elements of data in `rows` rows of `inner`, cut into
    `items` runs of `rows_per_item` rows; `updates` updates walked by each item."""

    total: int
    inner: int
    rows: int
    updates: int
    items: int
    rows_per_item: int

    @classmethod
    def of(cls, node) -> "ScatterShape":
        data, indices = node.inputs[:2]
        total = data.type.size
        inner = data.shape[-1] if data.shape else 1
        rows = total // inner if inner else 0
        n_upd = indices.type.size
        items = max(1, min(-(-total // COPY_BLOCK), total // max(n_upd, 1), rows))
        per = -(-rows // items) if rows else 0
        items = -(-rows // per) if per else 1
        return cls(total, inner, rows, n_upd, items, per)


def _combine(b, reduction: str, dtype: str, old, new):
    if dtype in dtypes.FLOATS:
        return binary_float(b, reduction, old, new)
    return binary_int(b, reduction, dtype, old, new)


def _loops(b: ir.IRBuilder, shape: tuple, body, idx=()) -> None:
    """body(b, idx) for every multi-index of `shape` in row-major order (a loop per dim
    longer than 1)."""
    if len(idx) == len(shape):
        body(b, list(idx))
        return
    d = shape[len(idx)]
    if d == 1:
        _loops(b, shape, body, idx + (i64(0),))
        return
    counted_loop(b, i64(0), i64(d), lambda b, i: _loops(b, shape, body, idx + (i,)))


def emit_item(b: ir.IRBuilder, shape: ScatterShape, o, node, out, emitter, fault) -> None:
    """Work item o of scatter `node` (module doc): its rows of data copied to `out`, then
    the updates that land there applied. `emitter(b)` gives a fresh element emitter over
    the kernel's buffers; `fault` is the kernel's faults.FaultWord (None: not recorded)."""
    data, indices, updates = node.inputs
    dtype = data.dtype
    reduction = node.attrs["reduction"]
    inner = shape.inner
    row_lo = b.mul(o, i64(shape.rows_per_item))
    row_hi = b.add(row_lo, i64(shape.rows_per_item))
    row_hi = b.select(b.icmp_signed("<", row_hi, i64(shape.rows)), row_hi, i64(shape.rows))

    def copy_row(b, r):
        head = delinearize(b, r, data.shape[:-1]) if data.shape else []
        base = b.mul(r, i64(inner))

        def element(b, j):
            idx = head + [j] if data.shape else []
            store_element(b, out, dtype, b.add(base, j), emitter(b).at(data, idx))

        counted_loop(b, i64(0), i64(inner), element)

    counted_loop(b, row_lo, row_hi, copy_row)
    lo = b.mul(row_lo, i64(inner))
    span = b.sub(b.mul(row_hi, i64(inner)), lo)

    def update(b, idx):
        em = emitter(b)
        p = em.index_at(indices, idx)
        p = b.sext(p, I64) if p.type.width < 64 else p
        if fault is not None:  # unsigned: a negative position is huge
            fault.note(b, b.icmp_unsigned(">=", p, i64(shape.total)), faults.INDEX)
        # this item's run only (an out-of-range p is in no run)
        with b.if_then(b.icmp_unsigned("<", b.sub(p, lo), span)):
            value = em.at(updates, idx)
            if reduction != "none":
                ptr = b.gep(out, [p], source_etype=storage_type(dtype), inbounds=True)
                value = _combine(b, reduction, dtype, b.load(ptr, typ=storage_type(dtype)),
                                 value)
            store_element(b, out, dtype, p, value)

    _loops(b, tuple(indices.shape), update)
