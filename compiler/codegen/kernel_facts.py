"""What a fused kernel is before it is rendered: its trip count and whether it runs
threaded (`extent`), whether a row kernel runs by columns, whether a matmul sums
nothing, how far its vectorized loop interleaves (`interleave`), and the signature
under which kernels share rendered code (twins). cpu.py renders from these;
SplitRender sizes its parts with `code_size`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.codegen import short_rows as _short
from compiler.codegen.faults import code_of
from compiler.codegen.lowering import is_flat
from compiler.codegen.mathlib import FAST_F32
from compiler.ir import Value
from compiler.ops import Family
from compiler.kernels import choice, inverted
from compiler.passes.fuse import Kernel, moves_last_axis

PACKED = "packed"  # slot-table tag of a weight packed for the GEMM (compiled.py fills it)
# Kernels that touch fewer elements than this run on one thread: a warm OpenMP
# launch costs a few microseconds, more than two threads save below ~32K elements.
PARALLEL_MIN_ELEMENTS = 1 << 15
# Linear elements per row of a flat elementwise kernel: big enough for the
# vectorized loop to amortize its prologue, small enough to split among threads.
LOOP_BLOCK = 4096
# Constants up to this many elements are part of a kernel's signature (their values may
# be inlined in its code); a kernel reading a larger one that is not packed has none.
SIGNATURE_CONST_ELEMENTS = 64
# A rough relative size of a contraction kernel's code, by implementation (Winograd and
# direct convs render the most: transforms, micro-kernels and their tails); others 2.0.
CODE_SIZE = {choice.WINOGRAD: 6.0, choice.DIRECT_CONV: 3.0, choice.GROUPED: 3.0}


def may_fault(k: Kernel) -> bool:
    """Whether a kernel computes a node that records faults (compiler/codegen/faults.py)."""
    return any(code_of(n) for n in k.nodes)


# How a threaded kernel's items are shared (cpu.py's entry): ITEMS, any thread may run any
# range of them (compiler/codegen/parallel.py's braze_parallel); TEAM, every thread of an
# OpenMP team runs its own part at once (a split recurrence meets at barriers each step).
ITEMS, TEAM = "items", "team"


def extent(k: Kernel) -> tuple[int, str | None]:
    """(outer trip count, how it runs threaded: ITEMS, TEAM, or None for one thread) of a
    kernel's function: its work items (tiles, rows, blocks), threaded when it touches
    PARALLEL_MIN_ELEMENTS or more."""
    root, node = k.root, k.contraction
    if root.type.size == 0:
        return 0, False
    impl = k.impl.name if k.impl is not None else None
    if impl == choice.EMPTY_MATMUL:
        outer, work = root.type.size // (root.shape[-1] if root.shape else 1), root.type.size
    elif k.expand is not None:  # kernels/inverted.py: one output row per item
        shape = inverted.InvertedShape.of(k.expand.contraction, node, k.impl.tile)
        outer, work = shape.items, shape.macs
    elif impl == choice.GEMM:
        shape = choice.shape(node, k.impl)
        outer, work = shape.items, shape.m * shape.n * shape.k
    elif impl == choice.BATCHED:
        shape = choice.shape(node, k.impl)
        outer, work = shape.items, shape.entries * shape.m * shape.n * shape.k
    elif impl == choice.RECURRENCE:
        shape = choice.shape(node, k.impl)
        if shape.split:
            return shape.outer, TEAM
        outer, work = shape.outer, shape.macs
    elif impl == choice.SCATTER:  # kernels/scatter.py: runs of rows, each walking the updates
        shape = choice.shape(node, k.impl)
        outer, work = shape.items, shape.total
    elif impl in (choice.ATTENTION, choice.GROUPED, choice.WINOGRAD, choice.DIRECT_CONV):
        shape = choice.shape(node, k.impl)
        outer, work = shape.items, shape.macs
    elif impl == choice.ROW_MATMUL:
        outer = int(np.prod(root.shape[:-1], dtype=np.int64))
        work = root.type.size * node.inputs[0].shape[-1]
    elif k.kind == "row":
        outer = int(np.prod(k.row_shapes()[1], dtype=np.int64))
        outer //= k.domain[-1] if by_columns(k) else 1
        work = int(np.prod(k.domain, dtype=np.int64))
    elif (groups := row_group(k)) is not None:
        outer, work = groups.items, root.type.size
    elif is_flat(k):
        work = root.type.size
        outer = -(-work // LOOP_BLOCK)
    elif (short := short_rows(k)) is not None:
        outer, work = short.rows(root), root.type.size
    else:
        inner = root.shape[-1] if root.shape else 1
        work = root.type.size
        outer = work // inner if inner else 0
    return outer, ITEMS if work >= PARALLEL_MIN_ELEMENTS and outer > 1 else None


# Vectorized copies of an elementwise loop's body that LLVM interleaves (runs side by side
# in one iteration) where the body runs float32 math of long latency (LATENCY_OPS):
# mathlib's exp, log, tanh, sigmoid and erf are chains of 10-20 dependent FMAs and a
# divide, and LLVM's cost model interleaves only small loops, so such a loop ran one
# vector's chain at a time with the core's out-of-order window holding little more than
# one iteration: latency-bound at any vector width. 4 copies for one to three such ops,
# 8 for LONG_CHAIN or more. 2^20 floats, one thread, CPU time, min of 15 interleaved, on
# Zen 4 (AVX-512 host / AVX2 znver3 build), copies 1 -> 4: exp 266 -> 248 / 562 -> 397
# us; x * sigmoid(x) 445 -> 340 / 860 -> 610; GELU (erf) 424 -> 381 / 697 -> 614; tanh
# of 8192 x 100 342 -> 252 / 558 -> 461; Add (memory-bound) unchanged. 16 ops with
# tanh, sigmoid, sqrt, exp, log (benchmarks.fusion's chain), 1 / 4 / 8 copies: 3.58 /
# 2.00 / 1.57 ms (AVX-512), 6.92 / 3.32 / 2.75 ms (AVX2); 8 copies lost 5-20% on the
# single-op loops above (AVX2's 16 registers spill). Counts are powers of two (6 and 12
# copies measured 2.5x slower than 8 on the chain, AVX2).
INTERLEAVE = 4
LONG_INTERLEAVE = 8
LONG_CHAIN = 4
LATENCY_OPS = frozenset(FAST_F32) | {"sqrt", "div", "reciprocal"}
# ... and no more copies than leave MIN_MAIN_TRIPS iterations of the interleaved loop in a
# row: the rest runs in LLVM's remainder loops. tanh(x + bias) over rows of 100, AVX-512's
# 16 lanes: 4 copies (one 64-float iteration, 36 left over) 357 -> 441 us, 2 copies 325.
MIN_MAIN_TRIPS = 2


def _slow_ops(k: Kernel) -> int:
    """How many of a kernel's nodes run long-latency float32 math (LATENCY_OPS)."""
    return sum(n.op in LATENCY_OPS and n.outputs[0].dtype == "f32" for n in k.nodes)


def interleave(k: Kernel, trip: int, lanes: int) -> int | None:
    """How many vectorized copies of a loop kernel's body run side by side (LLVM's
    interleave count) in its element loop of `trip` elements on vectors of `lanes`
    floats, or None for LLVM's own choice: see INTERLEAVE."""
    slow = _slow_ops(k)
    if not slow:
        return None
    copies = LONG_INTERLEAVE if slow >= LONG_CHAIN else INTERLEAVE
    while copies > 1 and copies * lanes * MIN_MAIN_TRIPS > trip:
        copies //= 2
    return copies if copies > 1 else None


def short_rows(k: Kernel) -> _short.ShortRows | None:
    """How loop kernel k runs over blocks of its second-to-last dim, its short rows
    unrolled (compiler/codegen/short_rows.py), or None where it runs row by row."""
    return _short.plan(k, k.root.type.size >= PARALLEL_MIN_ELEMENTS, _slow_ops(k) > 0)


# A loop kernel whose root is a transpose moving its source's contiguous (last) axis to
# one of the root's row dims writes ROW_GROUP rows at a time, the rows of ROW_GROUP
# consecutive indices of that dim, one source line per step of the inner loop
# (`row_group`): row by row, each element read is a new line, and a source row a
# power-of-two stride apart maps them to a few L1 sets, evicted before the next row's
# elements in them are read (wav2vec2's 3199 x 512 channels-last conv output
# transposed for its GroupNorm: 5.8 ms; NHWC -> NCHW before a GroupNorm alike). Only for
# roots of at least ROW_GROUP_MIN_ELEMENTS (smaller ones stay in L1 either way).
ROW_GROUP = 16
ROW_GROUP_MIN_ELEMENTS = 1 << 14


@dataclass(frozen=True)
class RowGroups:
    """How a loop kernel's rows go in groups: `group` consecutive indices of row dim
    `dim` (extent `count`) per item, with `outer` the product of the row dims before it
    and `inner` of those after it (the rows of consecutive indices are `inner` apart)."""

    group: int
    dim: int
    outer: int
    count: int
    inner: int

    @property
    def items(self) -> int:
        return self.outer * -(-self.count // self.group) * self.inner


def row_group(k: Kernel) -> RowGroups | None:
    """How loop kernel k writes its rows in groups (ROW_GROUP), or None: k only moves
    data (arithmetic stays in row loops, which vectorize it), and its root is a
    transpose that does not keep its source's last axis last, and puts it on a row dim
    of at least ROW_GROUP indices."""
    root = k.root
    p = root.producer
    if (k.kind != "loop" or not moves_last_axis(p) or len(root.shape) < 2
            or root.type.size < ROW_GROUP_MIN_ELEMENTS
            or any(n.opdef.family is not Family.MOVEMENT for n in k.nodes)):
        return None
    dim = tuple(p.attrs["perm"]).index(len(root.shape) - 1)
    if root.shape[dim] < ROW_GROUP:
        return None
    rows = root.shape[:-1]
    return RowGroups(ROW_GROUP, dim, int(np.prod(rows[:dim], dtype=np.int64)), rows[dim],
                     int(np.prod(rows[dim + 1:], dtype=np.int64)))


# A by-columns row kernel keeps one scratch row per reduction of at most this many bytes.
COLUMN_ROW_BYTES = 1 << 16


def by_columns(k: Kernel) -> bool:
    """Whether a row kernel runs as `cpu_rows.RowKernels._column_kernel`: one level of reductions
    (no argmax/argmin), the last dim kept (its elements contiguous: reducing row by row
    would read them a whole stride apart), a root of one element per kept index, and
    nothing kept per row."""
    if len(k.levels) != 1 or k.row_cached or not k.axes:
        return False
    last = len(k.domain) - 1
    if last < 1 or last in k.axes or k.root.shape not in k.row_shapes():
        return False
    if any(r.op in ("argmax", "argmin") for r in k.levels[0]):
        return False
    return k.domain[last] * 8 <= COLUMN_ROW_BYTES


def concat_segments(k: Kernel) -> tuple | None:
    """(concat node, [(lo, hi, input number)]) where a loop kernel's inner loop (over
    its root's last dim) may run as one loop per input of that concat: a concat along
    its last axis, as long as the root's, whose result reaches the root through
    elementwise ops and channels-last pools only (the index of every read of it is then
    the root's along that axis: SqueezeNet's max pool over a fire module's concat). Each segment then reads its input with no branch per element, so the loop
    vectorizes (a DenseNet layer's BN-ReLU over the concat of every earlier layer's
    features ran scalar through a chain of up to 32 compares). The concat with the
    most inputs wins; None when there is none."""
    root = k.root
    if k.kind != "loop" or not root.shape or root.shape[-1] < 2:
        return None
    downstream = _elementwise_cone(k)
    best = None
    for n in k.nodes:
        out = n.outputs[0]
        if (n.op != "concat" or n.attrs["axis"] != len(out.shape) - 1
                or out.shape[-1] != root.shape[-1] or out not in downstream):
            continue
        if best is None or len(n.inputs) > len(best.inputs):
            best = n
    if best is None:
        return None
    segments, lo = [], 0
    for i, u in enumerate(best.inputs):
        if u.shape[-1]:
            segments.append((lo, lo + u.shape[-1], i))
        lo += u.shape[-1]
    return best, segments


# Ops that read their operands at their own index along the last axis: elementwise ops,
# and pools (channels-last: their window moves over the rows and columns only).
_LAST_AXIS_KEPT = frozenset({Family.ELEMENTWISE, Family.POOL})


def _elementwise_cone(k: Kernel) -> set[Value]:
    """The values of kernel k read only at the root's index along its last axis: the
    root, and what it reaches through ops of _LAST_AXIS_KEPT whose every user in k is
    such an op (a value also read by a movement op is left out)."""
    users: dict[Value, list] = {}
    for n in k.nodes:
        for u in n.inputs:
            users.setdefault(u, []).append(n)
    last = k.root.shape[-1]
    cone = {k.root}
    for n in reversed(k.nodes):  # topological order reversed: users before producers
        out = n.outputs[0]
        if out is k.root or (out in users and all(
                m.opdef.family in _LAST_AXIS_KEPT and m.outputs[0] in cone
                and tuple(m.outputs[0].shape[-1:]) == (last,) for m in users[out])):
            cone.add(out)
    return cone


def transposed_last(v: Value) -> bool:
    """Whether v is a transpose that swaps in its last axis from the one before (K^T):
    its rows are then contiguous in its source, and packing reads them down the rows."""
    p = v.producer
    return p is not None and p.op == "transpose" and p.attrs["perm"][-1] == len(v.shape) - 2


def signature(k: Kernel, local: dict) -> tuple | None:
    """What a kernel's code depends on, with its buffers named by their place in its
    table (`local`) and its other values by position: kernels with equal signatures
    render to the same function. None (never a twin) when a node reads a value that is
    neither a buffer, nor computed in the kernel, nor a small constant. A buffer's type is
    part of its name: two matmuls with equal outputs but different depths (a stack of
    Linear layers whose weights are inputs), or an add broadcasting one operand, read
    their inputs at other strides and are not twins. Whether a buffer holds a constant is
    part of it too (the emitter marks loads of constants `!invariant.load`)."""
    ids = {v: ("buf", i, (str(v.type), v.is_const) if isinstance(v, Value) else None)
           for v, i in local.items()}
    parts: list = [k.kind, k.domain, k.axes]
    for n in k.nodes:
        args = []
        for u in n.inputs:
            if u in ids:
                args.append(ids[u])
            elif u.is_const:
                value = np.asarray(u.const_value)
                if value.size > SIGNATURE_CONST_ELEMENTS and (PACKED, u) not in local:
                    return None
                args.append(("const", str(u.type), value.tobytes()
                             if value.size <= SIGNATURE_CONST_ELEMENTS else None))
            else:
                return None
        for o in n.outputs:
            ids.setdefault(o, ("val", len(ids)))
        attrs = tuple(sorted((key, _attr_key(a)) for key, a in n.attrs.items()))
        parts.append((n.op, attrs, tuple(str(o.type) for o in n.outputs), tuple(args),
                      tuple(ids[o] for o in n.outputs)))
    parts.append(tuple(tuple(ids.get(n.outputs[0]) for n in level) for level in k.levels))
    parts.append(tuple(ids.get(v) for v in k.row_cached))
    parts.append(ids[k.root])
    return tuple(parts)


def _attr_key(a):
    if isinstance(a, np.ndarray):
        return ("array", str(a.dtype), a.shape, a.tobytes())
    if isinstance(a, (list, tuple)):
        return tuple(_attr_key(x) for x in a)
    if isinstance(a, dict):
        return tuple(sorted((key, _attr_key(x)) for key, x in a.items()))
    return (type(a).__name__, repr(a))
