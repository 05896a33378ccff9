"""Run-time faults of compiled code: out-of-range gather indices and scatter positions,
integer division by 0, recurrence sequence lengths outside [0, T].

onnxruntime and torch raise on these; braze's kernels must neither trap nor read out
of bounds, so the generated code keeps going on a safe value (a clamped index, a
divisor of 1) and records the fault instead. Each kernel function ORs fault codes into
a word of its own (an alloca, so it lives in a register and vectorizes as an
or-reduction) and, on return, ORs a non-zero word into the cluster's fault word (one
atomic op per kernel call and thread); the runtime reads that word once after the
call and raises (`check`). A cluster with no faulting node has no fault slot and pays
nothing.
"""

from __future__ import annotations

from llvmlite import ir

from compiler import dtypes
from compiler.errors import BrazeIndexError, DivisionByZeroError, InputError
from compiler.ir import Graph, Node

FAULTS = "faults"  # slot-table key of the cluster's fault word (an int32)
INDEX = 1  # a gather index outside [-n, n), a scatter position outside [0, size)
ZERO_DIVISOR = 2  # an integer div / mod by zero
LENGTH = 4  # a recurrence's sequence length outside [0, T] (onnxruntime refuses those)

I32 = ir.IntType(32)
INT_DIVIDES = ("div", "mod", "fmod")


def code_of(node: Node) -> int:
    """The fault `node` may raise at run time (0 if none)."""
    if node.op == "gather":
        return 0 if _constant_in_range(node) else INDEX
    if node.op == "scatter":  # a flat position outside [0, size) is not written
        return 0 if _constant_positions_in_range(node) else INDEX
    if node.op == "recurrence":  # run-time lengths (graph inputs) are checked
        return 0 if node.inputs[3].is_const else LENGTH
    if node.op in INT_DIVIDES and node.outputs[0].dtype not in dtypes.FLOATS:
        divisor = node.inputs[1].producer
        if divisor is not None and divisor.op == "const" and divisor.attrs["value"].all():
            return 0  # a constant divisor with no zero: nothing to check
        return ZERO_DIVISOR
    return 0


def _constant_in_range(node: Node) -> bool:
    """Whether a gather's indices are a constant, each within its axis (negative ones
    count from the end): nothing to check at run time. Resize's taps are such (a fault
    word updated per element kept LLVM from vectorizing their rows)."""
    indices = node.inputs[1]
    if not indices.is_const:
        return False
    size = node.inputs[0].shape[node.attrs["axis"]]
    values = indices.const_value
    return values.size == 0 or bool((values >= -size).all() and (values < size).all())


def _constant_positions_in_range(node: Node) -> bool:
    """Whether a scatter's flat positions are a constant, each inside its data."""
    indices = node.inputs[1]
    if not indices.is_const:
        return False
    values = indices.const_value
    return values.size == 0 or bool((values >= 0).all() and
                                    (values < node.inputs[0].type.size).all())


def sites(graph: Graph) -> list[Node]:
    """The nodes of `graph` whose kernels check for a fault."""
    return [n for n in graph.nodes if code_of(n)]


class FaultWord:
    """A kernel function's own fault bits (see the module docstring)."""

    def __init__(self, b: ir.IRBuilder):
        with b.goto_entry_block():
            self.word = b.alloca(I32)
        b.store(ir.Constant(I32, 0), self.word)

    def note(self, b: ir.IRBuilder, bad, code: int) -> None:
        """word |= code where `bad` (an i1) holds; branch-free."""
        bit = b.select(bad, ir.Constant(I32, code), ir.Constant(I32, 0))
        b.store(b.or_(b.load(self.word, typ=I32), bit), self.word)

    def flush(self, b: ir.IRBuilder, target) -> None:
        """OR the bits into the cluster's word at `target` if any is set."""
        word = b.load(self.word, typ=I32)
        with b.if_then(b.icmp_unsigned("!=", word, ir.Constant(I32, 0)), likely=False):
            b.atomic_rmw("or", target, word, "monotonic")


def check(word: int, graph: Graph) -> None:
    """Raise the error a non-zero fault word stands for, naming the nodes that may have."""
    if word & INDEX:
        raise BrazeIndexError(f"index out of range in {_names(graph, INDEX)}")
    if word & ZERO_DIVISOR:
        raise DivisionByZeroError(f"integer division by zero in {_names(graph, ZERO_DIVISOR)}")
    if word & LENGTH:
        raise InputError(f"a sequence length outside [0, sequence length] in "
                         f"{_names(graph, LENGTH)}")


def _names(graph: Graph, code: int) -> str:
    nodes = [n for n in sites(graph) if code_of(n) == code]
    shown = ", ".join(_describe(n) for n in nodes[:3])
    return shown + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")


def _describe(node: Node) -> str:
    if node.op == "scatter":
        return f"{node.describe()} (data of {node.inputs[0].type.size} elements)"
    if node.op != "gather":
        return node.describe()
    return f"{node.describe()} (axis of size {node.inputs[0].shape[node.attrs['axis']]})"
