"""The floating-point mode of braze's CPU kernels: summing kernels flush denormals.

A denormal (|x| < 2^-126 in float32) operand or result costs x86 cores a microcode
assist per instruction, about a hundred cycles. Models make them where no one asked:
a softmax over masked scores (-100 added, as Swin's shifted windows do) rounds
exp(-90) to a denormal, and the next product multiplies by thousands of them. Measured
on Swin-V2-T, one thread: 111-115 ms a call with IEEE denormals, 84-86 ms flushed.

So kernels that sum many terms (`flushes`: a contraction, or a row kernel's reduction
such as a softmax or a norm) run as XLA's CPU runtime and most inference libraries run
everything: denormal results flushed to zero and denormal inputs read as zero (x86:
MXCSR's FTZ and DAZ bits; AArch64: FPCR.FZ, which does both). A term below 1.2e-38
changes such a sum by less than its rounding unless every term is that small.
Element-wise and data-movement kernels keep IEEE gradual underflow, so an element-wise
op (nextafter, frexp, a division, a cast) gives the host framework's bits.

The mode is per thread. Each kernel function sets its own on entry when the thread's
differs (`ensure`: one read of the control register, a write only on a change); a
cluster's entry `run` saves the caller's mode and puts it back before it returns
(`save`, `restore`), as does a GNU OpenMP thread's share (an exported library's, or a
TEAM kernel's: the application's threads); braze's pool workers run only kernels, and
each kernel sets what it needs. Other architectures keep their mode (`supported`).
"""

from __future__ import annotations

from llvmlite import ir

from compiler.codegen.symbols import declare
from compiler.target import arch_of

I32, I64 = ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()
VOID = ir.VoidType()

MXCSR_DAZ = 1 << 6  # denormal inputs read as zero
MXCSR_FTZ = 1 << 15  # denormal results flushed to zero
FPCR_FZ = 1 << 24  # AArch64: both, for scalar and Advanced SIMD float32/float64


def supported(triple: str) -> bool:
    """Whether the functions here change the mode on this architecture."""
    return arch_of(triple) in ("x86_64", "aarch64")


def flushes(k) -> bool:
    """Whether kernel `k` (compiler/passes/fuse.py's Kernel) runs with denormals
    flushed: it has a contraction, or it is a row kernel (its rows reduced)."""
    return k.contraction is not None or k.expand is not None or k.kind == "row"


def save(b: ir.IRBuilder, triple: str):
    """This thread's mode, for `restore` (None where the architecture's is left alone)."""
    return _read(b, triple) if supported(triple) else None


def restore(b: ir.IRBuilder, triple: str, saved) -> None:
    """Put back the mode `save` found."""
    if saved is not None:
        _write(b, triple, saved)


def ensure(b: ir.IRBuilder, triple: str, flush: bool) -> None:
    """Flush denormals on this thread from here on, or keep them (IEEE), writing the
    control register only when its mode is not that already."""
    if not supported(triple):
        return
    now = _read(b, triple)
    bits = _flush_bits(now.type, triple)
    want = b.or_(now, bits) if flush else b.and_(now, ir.Constant(now.type, ~bits.constant))
    with b.if_then(b.icmp_unsigned("!=", want, now), likely=False):
        _write(b, triple, want)


def _flush_bits(ty, triple: str) -> ir.Constant:
    return ir.Constant(ty, MXCSR_DAZ | MXCSR_FTZ if arch_of(triple) == "x86_64" else FPCR_FZ)


def _read(b: ir.IRBuilder, triple: str):
    m = b.module
    if arch_of(triple) == "aarch64":
        return b.call(declare(m, "llvm.aarch64.get.fpcr", I64, []), [])
    with b.goto_entry_block():
        slot = b.alloca(I32)
    b.call(declare(m, "llvm.x86.sse.stmxcsr", VOID, [PTR]), [slot])
    return b.load(slot, typ=I32)


def _write(b: ir.IRBuilder, triple: str, value) -> None:
    m = b.module
    if arch_of(triple) == "aarch64":
        b.call(declare(m, "llvm.aarch64.set.fpcr", VOID, [I64]), [value])
        return
    with b.goto_entry_block():
        slot = b.alloca(I32)
    b.store(value, slot)
    b.call(declare(m, "llvm.x86.sse.ldmxcsr", VOID, [PTR]), [slot])
