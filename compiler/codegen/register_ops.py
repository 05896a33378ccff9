"""Epilogue ops on whole accumulator vectors, and how a register epilogue reads its
other operands (cpu.Renderer._register_epilogue)."""

from __future__ import annotations

from compiler.codegen.mathlib import FAST_F32
from compiler.codegen.ops_llvm import binary_float
from compiler.ir import Value
from compiler.ops import facets
from compiler.kernels import gemm

# Epilogue ops applied to whole accumulator vectors (cpu.Renderer._register_epilogue):
# the scalar emitter's own lowering (ops_llvm), which is type-generic for these ops, and
# braze's float32 math (mathlib: exp, sigmoid, tanh, erf, log on vectors too), so SiLU,
# GELU and the like run on the registers, never as a scalar loop over the stored tile.
REGISTER_OPS = facets.attach("cpu_vector", {
    **{op: (lambda op: lambda b, x, y: binary_float(b, op, x, y))(op)
       for op in ("add", "sub", "mul", "div", "max", "min")},
    **{op: (lambda fn: lambda b, x: fn(b, x))(fn) for op, fn in FAST_F32.items()},
    "neg": lambda b, x: b.fneg(x),
})


def buffer_of(u: Value, ptrs: dict) -> Value:
    """The value whose buffer holds `u`'s elements in `u`'s row-major order: `u`, or
    where `u` has no buffer, the value its reshapes read (a reshape keeps the order)."""
    while u not in ptrs and u.producer is not None and u.producer.op == "reshape":
        u = u.producer.inputs[0]
    return u


def operand_kind(u: Value, root: Value, ptrs: dict) -> str | None:
    """How a register epilogue reads `u`: "scalar", "full" (root's shape, a buffer),
    "row" (N values along the last dim, broadcast over the rows), or None (it cannot).
    A reshape of a buffer is read in that buffer (compiler/passes/sink.py leaves the
    residual stream reshaped to the GEMM's rows)."""
    if u.is_const and u.const_value.size == 1:
        return "scalar"
    if buffer_of(u, ptrs) not in ptrs or u.dtype != "f32":
        return None
    if u.shape == root.shape:
        return "full"
    n = root.shape[-1]
    if u.shape and u.shape[-1] == n and all(d == 1 for d in u.shape[:-1]):
        return "row"
    return None


def operand_vector(b, u: Value, root: Value, ptrs: dict, off, col, vtype, mask=None):
    """The lanes of `u` for one output vector of type `vtype` (element offset `off` of the
    root, channel `col`), per `operand_kind`; with `mask` (a vector of i1), only the lanes
    it sets are read (the others are zero)."""
    kind = operand_kind(u, root, ptrs)
    if kind == "scalar":
        return gemm.splat_constant(b, u.const_value.reshape(-1)[0], vtype)
    ptr = b.gep(ptrs[buffer_of(u, ptrs)], [off if kind == "full" else col],
                source_etype=gemm.F32, inbounds=True)
    if mask is None:
        return b.load(ptr, typ=vtype, align=4)
    return gemm.masked_load(b, ptr, vtype, mask)
