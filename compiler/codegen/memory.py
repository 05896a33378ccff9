"""The memory plan both targets share: slot numbering and the intermediates' arena.

A compiled cluster's buffers are numbered once (its slots): the cluster inputs, then
its outputs (materialized graph outputs, each once), then its constants (packed ones
included), then the intermediates, which live at byte offsets in one arena laid out
by liveness, then the fault word where the cluster has one (compiler/codegen/faults.py:
an int32 per calling thread that the runtime reads after each call). Codegen bakes the slots into its pointer tables; runtime/cpu.py and
runtime/cuda.py fill those tables (arena base rounded up to ALIGN).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler import dtypes
from compiler.ir import Graph, Value

ALIGN = 64  # arena buffers start on cache lines (and on any GPU's alignment)


@dataclass
class MemoryPlan:
    """Slot numbering and arena of one cluster (see the module docstring).

    `slots`: buffer key (a Value, or a (PACKED, Value) pair) -> slot; `constants`:
    [(slot, array)]; `offsets`: slot of each intermediate -> byte offset in an arena of
    `arena_bytes`; `fault_slot`: the fault word's slot, None when nothing can fault."""

    slots: dict
    inputs: list[Value]
    outputs: list[Value]
    constants: list[tuple[int, np.ndarray]]
    offsets: dict[int, int]
    arena_bytes: int
    fault_slot: int | None = None


def plan_memory(graph: Graph, kplan, constants: list[tuple[object, np.ndarray]],
                fault_key: object | None = None) -> MemoryPlan:
    """The memory plan of `graph` compiled as `kplan` (a FusionPlan), with `constants`
    [(buffer key, array)] given their slots in that order, and a last slot for the fault
    word under `fault_key` when given."""
    constants = [(key, aligned(a) if _realign(key, a) else a) for key, a in constants]
    outputs = list(dict.fromkeys(v for v in graph.outputs if v in kplan.materialized))
    inter = [k.root for k in kplan.kernels if k.root not in outputs]
    order = list(graph.inputs) + outputs + [key for key, _ in constants] + inter + (
        [fault_key] if fault_key is not None else [])
    slots = {v: i for i, v in enumerate(order)}
    offsets, arena_bytes = arena_plan(kplan, inter)
    return MemoryPlan(slots, list(graph.inputs), outputs,
                      [(slots[key], a) for key, a in constants],
                      {slots[v]: off for v, off in offsets.items()}, arena_bytes,
                      slots.get(fault_key) if fault_key is not None else None)


# Unpacked constants (the graph's own arrays) are copied onto cache lines up to this size;
# a larger one (an embedding table) stays where it is rather than be held twice.
REALIGN_MAX_UNPACKED_BYTES = 1 << 20


def _realign(key, a: np.ndarray) -> bool:
    """Whether constant `a` is copied onto a cache line: packed ones (made for this
    cluster: the copy replaces them) and small unpacked ones, where not already there."""
    if a.ctypes.data % ALIGN == 0 or a.nbytes == 0:
        return False
    return isinstance(key, tuple) or a.nbytes <= REALIGN_MAX_UNPACKED_BYTES


def aligned(a: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of `a` that starts on a cache line (numpy's allocations are
    16-byte aligned, so a 64-byte vector load from a packed weight at a random 16-byte
    offset spans two lines three times in four. nn.LSTM's recurrence kernels read their
    packed weights at offsets 16 and 32 through torch.compile and 32 and 48 through
    compile_onnx, and took 1.95 and 1.66 ms; aligned, 1.33 both)."""
    raw = np.empty(a.nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    out = raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def padded_bytes(v: Value) -> int:
    return -(-max(v.type.size * dtypes.itemsize(v.dtype), 1) // ALIGN) * ALIGN


def arena_plan(kplan, intermediates: list[Value]) -> tuple[dict[Value, int], int]:
    """Byte offsets of intermediates in one arena, and its size.

    Kernels run in order; a buffer is live from the kernel that writes it to
    the last kernel that reads it, and its bytes are reused (first fit) by
    buffers written after that. A kernel never gets a block freed by its own
    readers, so its inputs and output never overlap.
    """
    last: dict[Value, int] = {}
    for i, k in enumerate(kplan.kernels):
        for n in k.nodes:
            for u in n.inputs:
                last[u] = i
    wanted = set(intermediates)
    free: list[tuple[int, int]] = []  # (offset, size), sorted by offset
    offsets: dict[Value, int] = {}
    live: list[Value] = []
    top = 0
    for i, k in enumerate(kplan.kernels):
        v = k.root
        if v in wanted:
            size = padded_bytes(v)
            fit = next((blk for blk in free if blk[1] >= size), None)
            if fit is None:
                offsets[v], top = top, top + size
            else:
                free.remove(fit)
                offsets[v] = fit[0]
                if fit[1] > size:
                    free.append((fit[0] + size, fit[1] - size))
                    free.sort()
            live.append(v)
        for u in [u for u in live if last.get(u, -1) <= i and u is not v]:
            live.remove(u)
            free.append((offsets[u], padded_bytes(u)))
            free.sort()
    return offsets, top
