"""Loop kernels whose rows are short: the inner loop runs over the second-to-last dim.

A loop kernel's inner loop normally runs over its root's last dim. Where that dim holds
fewer elements than a vector (a channels-last image of 3 channels, rows of 12 floats),
the loop cannot vectorize and each row also pays a delinearize (urem/udiv) and the
loop's own overhead. The model input's conversion of every CNN, pad(transpose(x)) from
f32[1,3,224,224] to f32[1,226,226,3], ran 51076 such rows of 3 elements at ~80 us (one
thread, Zen 4).

Such a kernel (`plan`) runs instead over blocks of its second-to-last dim (index w): the
inner loop runs over w with the last dim unrolled inside it (its index a constant, so a
constant pad or concat along it folds away), LLVM's loop vectorizer widens the w loop
and forms interleaved load and store groups from the unrolled copies, and the row's
delinearize runs once per block. A constant pad whose bounds check along some axis
follows w (through transposes, slices, broadcasts, elementwise ops) splits the w loop
into the padded edges, with every check, and an interior where those checks are known
to pass (`ShortRows.inside`): the interior's reads are contiguous. The remaining checks
(along the row's other dims, fixed for the whole block) become selects over a read at a
clamped index where the kernel records no faults, so no branch is left in the loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from compiler.codegen.emitter import reshape_groups
from compiler.codegen.faults import code_of
from compiler.codegen.lowering import is_flat
from compiler.ir import Node, Value
from compiler.ops import Family
from compiler.passes.fuse import Kernel

# A loop kernel's rows are short at up to this many elements: LLVM's x86 vectorizer
# forms interleaved loads and stores (shuffles) of up to 8 members; over 8 it reads and
# writes with gathers and scatters (AVX-512, the unrolled rows of 9 to 15).
SHORT_ROW = 8
# ... or, in a kernel that runs long-latency float math (kernel_facts.LATENCY_OPS), below
# a vector of floats: the gathers and scatters cost less than scalar math there. One
# thread, Zen 4, min of 300 calls: tanh(x + b) over f32[8192, 12] 400 -> 142-148 us
# (462 -> 98 us built for AVX2, znver3), but transpose + bias to f32[1, 56, 56, 12],
# movement only, 13.9 -> 19.5 us.
SHORT_MATH_ROW = 15
# ... and its second-to-last dim (the loop that vectorizes instead) at least this long.
MIN_INNER = 8
# The unrolled body (last dim x the kernel's nodes) at most this many node copies, so
# the code of a long elementwise chain over rows of 15 stays small.
MAX_BODY = 512
# A threaded kernel's blocks hold about this many elements (a flat kernel's LOOP_BLOCK),
# a whole number of VECTOR indices w (AVX-512's float lanes: no remainder loop inside a
# block); one that runs on one thread is one block per row (tanh(x + b) over
# f32[8192, 3]: blocks of 1376 rows took 15.6 us, one block 14.0).
BLOCK_ELEMENTS = 4096
VECTOR = 16
# Index maps followed through the kernel (per value and map) before giving up on proving
# any bounds check (a pathological DAG would otherwise be walked once per path).
MAX_VISITS = 4096


@dataclass(frozen=True)
class ShortRows:
    """How a short-row loop kernel runs: its rows are blocks of `block` indices w of the
    root's second-to-last dim (`blocks` of them per index of the dims before it); on w in
    [interior[0], interior[1]) the constant pads' checks along `inside`'s axes pass.
    `selects`: the other checks may read at a clamped index (no node records faults)."""

    block: int
    blocks: int
    interior: tuple[int, int]
    inside: dict
    selects: bool

    def rows(self, root: Value) -> int:
        """The kernel's outer trip count: blocks of every index of the dims before w."""
        return math.prod(root.shape[:-2]) * self.blocks


def plan(k: Kernel, threaded: bool, slow_math: bool) -> ShortRows | None:
    """The short-row form of loop kernel k (see the module docstring), or None where its
    rows are long enough, its second-to-last dim too short, or the unrolled body too big.
    `threaded`: the kernel's rows are shared among threads; `slow_math`: it runs
    long-latency float math."""
    root = k.root
    if k.kind != "loop" or len(root.shape) < 2 or root.type.size == 0 or is_flat(k):
        return None
    last, inner = root.shape[-1], root.shape[-2]
    if (last > (SHORT_MATH_ROW if slow_math else SHORT_ROW) or inner < MIN_INNER
            or last * len(k.nodes) > MAX_BODY):
        return None
    block = inner
    if threaded:
        block = min(inner, -(-max(1, BLOCK_ELEMENTS // last) // VECTOR) * VECTOR)
    interior, inside = _interior(k)
    return ShortRows(block, -(-inner // block), interior, inside,
                     not any(code_of(n) for n in k.nodes))


# An index map per axis: a pair (s, t) for the index s * w + t, ROW for an index fixed
# within a block, or None for anything else (a gathered or wrapped index).
ROW = "row"


def _interior(k: Kernel) -> tuple[tuple[int, int], dict]:
    """((lo, hi), {pad node: axes}): the range of w on which the listed bounds checks of
    the kernel's constant pads pass at every read of them; ((0, 0), {}) for none."""
    rank = len(k.root.shape)
    start = tuple(ROW if a != rank - 2 else (1, 0) for a in range(rank))
    computed = {n.outputs[0]: n for n in k.nodes}
    reads: dict[Node, list[tuple]] = {}  # pad node -> its operand's maps, one per read
    seen: set = set()
    todo = [(k.root, start)]
    while todo:
        v, maps = todo.pop()
        if (v, maps) in seen or v not in computed:
            continue
        if len(seen) >= MAX_VISITS:
            return (0, 0), {}
        seen.add((v, maps))
        n = computed[v]
        if n.op == "pad" and n.attrs["mode"] == "constant":
            reads.setdefault(n, []).append(_operand_maps(n, maps)[0])
        todo += [(u, m) for u, m in zip(n.inputs, _operand_maps(n, maps))]
    lo, hi, inside = 0, k.root.shape[-2], {}
    for n, all_maps in reads.items():
        shape = n.inputs[0].shape
        axes = [a for a in range(len(shape)) if all(
            isinstance(m[a], tuple) and m[a][0] for m in all_maps)]
        for a in axes:
            for m in all_maps:
                first, end = _inside(m[a], shape[a])
                lo, hi = max(lo, first), min(hi, end)
        if axes:
            inside[n] = frozenset(axes)
    return ((lo, hi), inside) if inside and lo < hi else ((0, 0), {})


def _inside(m: tuple, d: int) -> tuple[int, int]:
    """The range of w with 0 <= s * w + t < d."""
    s, t = m
    if s > 0:
        return -(t // s), (d - 1 - t) // s + 1
    return -((d - 1 - t) // -s), t // -s + 1


def _operand_maps(n: Node, maps: tuple) -> list[tuple]:
    """The index maps of node n's operands, given its output's (as the elemental emitter
    reads them: compiler/codegen/emitter.py)."""
    out = n.outputs[0]
    handler = _MOVES.get(n.op)
    if handler is not None:
        return handler(n, maps)
    if n.opdef.family is Family.POOL:  # channels-last windows over axes 1 and 2
        x = [m if a in (0, 3) or m == ROW else None for a, m in enumerate(maps)]
        return [tuple(x)]
    return [_broadcast(u.shape, out.shape, maps) for u in n.inputs]


def _broadcast(shape: tuple, out: tuple, maps: tuple) -> tuple:
    off = len(out) - len(shape)
    return tuple(ROW if d == 1 else maps[off + a] for a, d in enumerate(shape))


def _shift(m, scale: int, offset: int):
    """The map of scale * index + offset, for index's map m."""
    if m is None or m == ROW:
        return m
    return (m[0] * scale, m[1] * scale + offset)


def _transpose(n: Node, maps: tuple) -> list[tuple]:
    src = [None] * len(maps)
    for i, p in enumerate(n.attrs["perm"]):
        src[p] = maps[i]
    return [tuple(src)]


def _slice(n: Node, maps: tuple) -> list[tuple]:
    a = n.attrs
    return [tuple(_shift(m, st, s) for m, s, st in zip(maps, a["starts"], a["steps"]))]


def _pad(n: Node, maps: tuple) -> list[tuple]:
    r = len(maps)
    pads = n.attrs["pads"]
    wrapped = n.attrs["mode"] != "constant"
    return [tuple(None if wrapped and (pads[a] or pads[r + a]) else _shift(m, 1, -pads[a])
                  for a, m in enumerate(maps))]


def _reshape(n: Node, maps: tuple) -> list[tuple]:
    """Dims that pass through a reshape keep their map; a merged or split group keeps
    ROW where all its dims do."""
    x = n.inputs[0]
    groups = reshape_groups(x.shape, n.outputs[0].shape)
    if groups is None:
        return [tuple(ROW if all(m == ROW for m in maps) else None for _ in x.shape)]
    src: list = []
    for (i0, i1), (o0, o1) in groups:
        if i1 - i0 == 1 and o1 - o0 == 1:
            src.append(maps[o0])
        else:
            fixed = all(m == ROW for m in maps[o0:o1])
            src += [ROW if fixed else None] * (i1 - i0)
    return [tuple(src)]


def _concat(n: Node, maps: tuple) -> list[tuple]:
    axis = n.attrs["axis"]
    m = maps[axis]
    along = m if m == ROW else None  # each input read at index - its start: a branch on w
    return [maps[:axis] + (along,) + maps[axis + 1:] for _ in n.inputs]


def _gather(n: Node, maps: tuple) -> list[tuple]:
    axis = n.attrs["axis"]
    r = len(n.inputs[1].shape)
    return [maps[:axis] + (None,) + maps[axis + r:], maps[axis:axis + r]]


_MOVES = {"transpose": _transpose, "slice": _slice, "pad": _pad, "reshape": _reshape,
          "concat": _concat, "gather": _gather,
          "broadcast": lambda n, maps: [_broadcast(n.inputs[0].shape, n.outputs[0].shape,
                                                   maps)]}
