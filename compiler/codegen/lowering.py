"""Lowering helpers both backends share (cpu.py for the host, cuda.py for NVPTX): loops,
element stores, multiply-add and reduction steps, and which buffers a kernel reads."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from llvmlite import ir

from compiler import dtypes
from compiler.codegen.emitter import i64, scalar_constant
from compiler.codegen.ops_llvm import I32, I64, binary_float, binary_int, llvm_type, storage_type
from compiler.ir import Value
from compiler.ops import Family

if TYPE_CHECKING:  # fuse imports the kernel choice, whose kernels import these helpers
    from compiler.passes.fuse import Kernel


def counted_loop(b: ir.IRBuilder, lo, hi, body, step=None, hints=None) -> None:
    """for (i = lo; i < hi; i += step) body(b, i), step 1 by default (cuda.py strides by
    the grid's size); `hints`, LLVM loop metadata ({"llvm.loop.interleave.count": 4})."""
    pre = b.block
    cond = b.append_basic_block("loop.cond")
    blk = b.append_basic_block("loop.body")
    done = b.append_basic_block("loop.end")
    b.branch(cond)
    b.position_at_end(cond)
    i = b.phi(I64)
    i.add_incoming(lo, pre)
    b.cbranch(b.icmp_signed("<", i, hi), blk, done)
    b.position_at_end(blk)
    body(b, i)
    i.add_incoming(b.add(i, i64(1) if step is None else step, flags=["nsw"]), b.block)
    latch = b.branch(cond)
    if hints:
        latch.set_metadata("llvm.loop", LoopID(b.module, hints))
    b.position_at_end(done)


class LoopID(ir.values.MDValue):
    """A loop's `llvm.loop` metadata node: itself first (LLVM parses a node that names
    itself as distinct, one per loop; llvmlite makes no distinct plain node), then one
    {name, i32 value} node per hint. Compared and hashed by identity (its operands hold
    itself)."""

    def __init__(self, module: ir.Module, hints: dict[str, int]):
        ops = [module.add_metadata([ir.MetaDataString(module, name), ir.Constant(I32, v)])
               for name, v in hints.items()]
        super().__init__(module, [], name=str(len(module.metadata)))
        self.operands = (self, *ops)

    __eq__ = object.__eq__
    __ne__ = object.__ne__
    __hash__ = object.__hash__


def mul_add(b: ir.IRBuilder, dtype: str, acc, x, y):
    """acc + x * y (floats: contractable into one FMA)."""
    if dtype not in dtypes.FLOATS:
        return binary_int(b, "add", dtype, acc, binary_int(b, "mul", dtype, x, y))
    prod = binary_float(b, "mul", x, y)
    total = binary_float(b, "add", acc, prod)
    prod.flags.append("contract")
    total.flags.append("contract")
    return total


def store_element(b: ir.IRBuilder, base, dtype: str, off, x) -> None:
    ptr = b.gep(base, [off], source_etype=storage_type(dtype), inbounds=True)
    if dtype == "bool":
        x = b.zext(x, storage_type("bool"))
    b.store(x, ptr)


def without(ptrs: dict, v: Value) -> dict:
    return {u: p for u, p in ptrs.items() if u is not v}


def kernel_leaves(k: Kernel, slots: dict) -> list[Value]:
    """Values with a buffer that the kernel reads, in first-use order."""
    leaves: dict[Value, None] = {}
    for n in k.nodes:
        for u in n.inputs:
            if u in slots:
                leaves[u] = None
    return list(leaves)


def is_flat(k: Kernel) -> bool:
    """An elementwise kernel whose operands all have the root's shape or one element:
    every value is then read at the root's linear index (or at 0)."""
    shape = k.root.shape
    return all(n.opdef.family is Family.ELEMENTWISE and
               all(u.shape == shape or u.type.size == 1 for u in n.inputs + n.outputs)
               for n in k.nodes)


def reduce_init(op: str, dtype: str):
    t = llvm_type(dtype)
    is_f = dtype in dtypes.FLOATS
    if op == "reduce_sum":
        return ir.Constant(t, 0.0 if is_f else 0)
    if op == "reduce_prod":
        return ir.Constant(t, 1.0 if is_f else 1)
    low = op in ("reduce_max", "argmax")
    if is_f:
        return ir.Constant(t, -np.inf if low else np.inf)
    info = np.iinfo(dtypes.to_numpy(dtype))
    return scalar_constant(info.min if low else info.max, dtype)


_COMBINE = {"reduce_sum": "add", "reduce_prod": "mul", "reduce_max": "max",
            "reduce_min": "min"}


def combine(b, op: str, dtype: str, acc, x):
    base = _COMBINE[op]
    if dtype in dtypes.FLOATS:
        out = binary_float(b, base, acc, x)
        if base in ("add", "mul"):
            out.flags.append("reassoc")  # lets the vectorizer keep partial sums per lane
        return out
    return binary_int(b, base, dtype, acc, x)


def arg_take(b, node, val, cur, dtype: str):
    """Whether element `val` replaces the best so far (numpy: first NaN wins, ties first)."""
    last = node.attrs["select_last"]
    is_max = node.op == "argmax"
    pred = (">=" if last else ">") if is_max else ("<=" if last else "<")
    if dtype in dtypes.FLOATS:
        nan_new = b.fcmp_unordered("uno", val, val)  # numpy: the first (last) NaN wins
        if not last:
            nan_new = b.and_(nan_new, b.fcmp_ordered("ord", cur, cur))
        return b.or_(b.fcmp_ordered(pred, val, cur), nan_new)
    cmp = b.icmp_signed if dtype in dtypes.SIGNED else b.icmp_unsigned
    return cmp(pred, val, cur)
