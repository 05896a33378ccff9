"""Module-level symbols of an LLVM module: declaring a function once."""

from __future__ import annotations

from llvmlite import ir


def declare(module: ir.Module, name: str, ret: ir.Type, args: list) -> ir.Function:
    """The function `name` of `module`, declared as `ret(args)` if it is not there yet
    (intrinsics, libm, OpenMP, libdevice and NVVM calls, other parts' kernels)."""
    try:
        return module.get_global(name)
    except KeyError:
        return ir.Function(module, ir.FunctionType(ret, list(args)), name)
