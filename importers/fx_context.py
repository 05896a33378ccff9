"""What an aten converter sees, and the one converter table (aten overload -> converter).

A converter is `fn(cx: Ctx, *args, **kwargs)`: the aten node's own arguments, with
every fx node replaced by what it became (an IR `Value`, a tuple of them, or a
Python scalar for SymInt nodes, concrete at this specialization). It returns one
IR Value, or a tuple (None where the aten output is not a tensor or is unused).
It refuses an instance it cannot express by raising `Fallback(reason)`; the node
then becomes a `host` node that runs the real aten op on torch. Output types are
never guessed: `cx.out()` reads them from the node's fake value (`meta["val"]`).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from compiler import dtypes
from compiler.ir import Graph, TensorType, Value

Converter = Callable[..., object]
CONVERTERS: dict = {}  # torch OpOverload -> Converter; filled by the fx_* converter modules
# Ops torch tags as drawing random numbers whose converters refuse the random cases
# themselves (SDPA: only its dropout draws, and its converter refuses dropout_p > 0).
SEEDED_CHECKED: set = set()


class Fallback(Exception):
    """A converter cannot express this aten node in braze's IR; the message says why."""


def converts(*targets):
    """Register the decorated function as the converter of each aten overload."""
    def register(fn: Converter) -> Converter:
        for t in targets:
            if t in CONVERTERS:
                raise ValueError(f"two converters for {t}")
            CONVERTERS[t] = fn
        return fn
    return register


def ir_dtype(torch_dtype: torch.dtype) -> str:
    """The IR element type of a torch dtype (Fallback when braze has none)."""
    if torch_dtype == torch.bfloat16:
        return "bf16"
    try:
        return dtypes.from_numpy(torch.empty(0, dtype=torch_dtype).numpy().dtype)
    except (TypeError, RuntimeError, ValueError):
        raise Fallback(f"dtype {torch_dtype} has no braze equivalent") from None


def tensor_type(val) -> TensorType:
    """The IR type of a (fake) tensor; dims that are not plain ints become None."""
    shape = tuple(d if isinstance(d, int) else None for d in val.shape)
    return TensorType(ir_dtype(val.dtype), shape)


class Ctx:
    """One aten node being converted: its fake output values and IR builders."""

    def __init__(self, graph: Graph, name: str, target, vals, used: frozenset):
        self.graph = graph
        self.name = name
        self.target = target
        self.vals = vals  # the node's fake output: a tensor or a tuple of them
        self.used = used  # for tuple outputs: the indices something reads
        self.arg_vals: list = []  # the fake values of the node's positional node args
        # (aten op, fake value) of each node reading this one's result
        self.readers: list[tuple] = []
        # graph inputs that are module weights not frozen (import_fx's `trainable`)
        self.trainable: set = set()

    # -- what aten says the result is ---------------------------------------

    def out(self, i: int | None = None) -> TensorType:
        """Type of the node's output (the i-th, for tuple outputs)."""
        val = self.vals if i is None else self.vals[i]
        t = tensor_type(val)
        if not t.static:
            raise Fallback(f"output {i or 0} has a data-dependent shape")
        return t

    def result_type(self, a, b) -> str:
        """torch's type promotion of two args (Values or Python scalars), as an IR dtype."""
        return ir_dtype(torch.result_type(_proxy(a), _proxy(b)))

    # -- IR builders ---------------------------------------------------------

    def op(self, op: str, *inputs: Value, **attrs) -> Value:
        """One IR node named after the aten node."""
        return self.graph.op(op, *inputs, name=self.name, **attrs)

    def const(self, array, dtype: str | None = None) -> Value:
        """A constant; bf16 is built as f32 and cast (numpy has no bf16)."""
        if dtype == "bf16":
            return self.cast(self.graph.const(np.asarray(array, np.float32), self.name), "bf16")
        arr = np.asarray(array, dtypes.to_numpy(dtype)) if dtype else np.asarray(array)
        return self.graph.const(arr, self.name)

    def scalar(self, x, dtype: str) -> Value:
        """A 0-d constant of `dtype` (Fallback for values that do not fit)."""
        if dtype in dtypes.INTEGERS and isinstance(x, float) and not x.is_integer():
            raise Fallback(f"scalar {x} does not fit {dtype}")
        if isinstance(x, complex) or (isinstance(x, float) and math.isnan(x)
                                      and dtype not in dtypes.FLOATS):
            raise Fallback(f"scalar {x} does not fit {dtype}")
        return self.const(x, dtype)

    def cast(self, v: Value, dtype: str) -> Value:
        return v if v.dtype == dtype else self.op("cast", v, to=dtype)

    def tensor(self, x, dtype: str) -> Value:
        """A Value (cast to dtype) or a Python scalar (as a constant of dtype)."""
        if isinstance(x, Value):
            return self.cast(x, dtype)
        if isinstance(x, (bool, int, float)):
            return self.scalar(x, dtype)
        raise Fallback(f"argument {x!r} is neither a tensor nor a number")

    def reshape(self, v: Value, shape) -> Value:
        shape = tuple(int(d) for d in shape)
        return v if v.shape == shape else self.op("reshape", v, shape=shape)


def _proxy(x):
    """An empty tensor with x's dtype and dim-0-ness (what type promotion looks at)."""
    if not isinstance(x, Value):
        return x
    shape = (0,) * min(x.type.rank, 1)
    if x.dtype == "bf16":
        return torch.empty(shape, dtype=torch.bfloat16)
    return torch.from_numpy(np.empty(shape, dtypes.to_numpy(x.dtype)))


def norm_dim(d: int, rank: int) -> int:
    """A dim in [0, rank) (rank 0 tensors accept dims 0 and -1, as torch does)."""
    r = max(rank, 1)
    if not -r <= d < r:
        raise Fallback(f"dim {d} out of range for rank {rank}")
    return d % r


def norm_dims(dims, rank: int) -> tuple:
    """Sorted, unique dims; None or [] means all dims (aten's reduce-all)."""
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return tuple(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    if rank == 0:
        for d in dims:
            norm_dim(d, 0)
        return ()
    return tuple(sorted({norm_dim(d, rank) for d in dims}))
