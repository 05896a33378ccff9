"""Kernel formation inside a compiled cluster: which values get a buffer, which are inlined.

A kernel is one loop nest that writes one materialized value (its root); every
non-materialized value it reads is recomputed inline, element by element, by
the elemental emitter (loop fusion; movement ops are index arithmetic).

Reductions fuse both ways. A kernel whose inlined ops include reductions is a
*row kernel*: its outer loop runs over the rows (the kept dims of the domain D,
the reductions' common input shape) and, per row, makes one pass over the
reduced dims for each level of reductions (a reduction reading another's result
is one level later), then a last pass that writes the root's row. Softmax
(max; sum of exp; normalize) is one kernel of three passes, layer norm (mean;
variance; normalize, scale, shift) one of three; a reduction's result stays in
a register for its row and is never materialized. Values read by several passes
of one row kernel are recomputed in each pass (the row is still in cache, and
recomputation costs a few vector ops per element where a buffer would cost a
store and a load), except costly ones (an op of EXPENSIVE_OPS): those are kept
for the row in a per-thread scratch row by the first pass that computes them
(`Kernel.row_cached`), so softmax's exp runs once per element, not once per pass.

A value is materialized (gets a buffer; `plan(graph).reasons` says why) when:
  - it is a cluster output;
  - it is a contraction's (matmul's) result or operand: a contraction is its
    own kernel, reading each operand element many times (except a 1x1 expand conv's
    result that only a depthwise conv reads, large enough: that kernel computes it row
    by row into a scratch, kernels/inverted.py, and the 1x1 conv is its `expand`);
  - several kernels read it and it is a reduction, contains an op of
    EXPENSIVE_OPS, or costs more than INLINE_COST ops to recompute (a pool costs
    its window's taps times what it reads: DenseNet's 3x3 max pool, read by the
    six layers of its first block, was recomputed by each; cheaper values are
    recomputed by each kernel: `plan(graph).notes` lists them);
  - one pass of a kernel reads it along several paths (e.g. x and transpose(x):
    each path recomputes it at its own index) and it is costly as above;
  - a row kernel cannot take it in: a reduction over other axes or another
    domain, or a row-dependent value read through a movement op or at a shape
    other than D or D with the reduced dims kept as 1 (see `_row_refusal`);
  - its inline expression is MAX_INLINE_DEPTH ops deep (a long chain of ops is
    one kernel per MAX_INLINE_DEPTH of them; a contraction's epilogue stops there);
  - it is small (at most 1/SMALL_MOVED_RATIO of a loop kernel's root) and made by a
    chain of movement ops the loop would run at each of its elements.
A value chosen for being shared or read along several paths that is a reshape stores
its input instead (`_stored`): the reshape of a buffer is read in place.
Materializing only ever adds values, so `plan` reaches its fixed point in at
most as many rounds as the cluster has values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from compiler import dtypes
from compiler.ir import Graph, Node, Value
from compiler import target as targets
from compiler.kernels import batched, inverted, recurrent
from compiler.kernels import choice
from compiler.kernels.choice import Impl, choose
from compiler.ops import Family
from compiler.ops.reduction import reduced_shape

# Ops worth a buffer when several kernels would each recompute them.
EXPENSIVE_OPS = frozenset({"exp", "log", "tanh", "erf", "sigmoid", "pow", "sin", "cos", "tan",
                           "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
                           "expm1", "log1p", "div", "sqrt", "gather"})
# Bytes of scratch a row kernel may keep per thread for costly values read by several
# passes (on the stack of each thread: a few rows of 4K floats, well inside L2).
ROW_CACHE_BYTES = 1 << 16
# A value read by several kernels whose inline expression has more ops than this
# is materialized: past it, recomputation costs more than a store and a load.
INLINE_COST = 8
# Ops along one inlined path of a kernel: a value whose inline expression would be deeper
# gets a buffer. The emitter recurses once per inlined op (as do this module's walks over
# a kernel's nodes), and a valid model's chain of 350 elementwise ops ran out of Python's
# stack; a store and a load every 64 ops cost little next to 64 ops per element.
MAX_INLINE_DEPTH = 64


def reduce_axes(node: Node) -> tuple:
    """The axes a reduction node reduces (argmax/argmin: its one axis)."""
    if node.op in ("argmax", "argmin"):
        return (node.attrs["axis"],) if node.inputs[0].shape else ()
    return tuple(node.attrs["axes"])


def is_reduction(node: Node | None) -> bool:
    return node is not None and node.opdef.family is Family.REDUCTION


@dataclass
class Kernel:
    """One loop nest writing `root`; `nodes` are the ops it computes (topological).

    Row kernels (`kind == "row"`) also have `domain` (the reductions' input
    shape), `axes` (the reduced dims) and `levels` (reduction nodes, one list
    per pass over a row, in order). Contraction kernels have `impl`.
    """

    root: Value
    nodes: list[Node] = field(default_factory=list)
    domain: tuple | None = None
    axes: tuple = ()
    levels: list[list[Node]] = field(default_factory=list)
    row_cached: list[Value] = field(default_factory=list)
    # a contraction kernel's implementation and why (compiler/kernels/choice.py), chosen
    # once by `plan`; codegen, packing and benchmarks read it, never re-decide it
    impl: Impl | None = None
    # a depthwise conv kernel that computes its input too (kernels/inverted.py): the 1x1
    # expand conv and its epilogue, as a kernel of their own whose root has no buffer
    expand: Kernel | None = None

    @property
    def kind(self) -> str:
        if self.contraction is not None:
            return "contraction"
        return "row" if self.domain is not None else "loop"

    @property
    def contraction(self) -> Node | None:
        """A contraction kernel's matmul or conv (its root is that node's result, or the
        result of the epilogue applied to it); with an `expand`, the depthwise conv (the
        last contraction: the expand conv comes before it)."""
        return next((n for n in reversed(self.nodes) if n.opdef.family is Family.CONTRACTION),
                    None)

    def parts(self) -> list[Kernel]:
        """The kernels whose contractions this one runs: its expand's, then its own."""
        return ([self.expand] if self.expand is not None else []) + [self]

    @property
    def reductions(self) -> list[Node]:
        return [n for level in self.levels for n in level]

    def row_shapes(self) -> tuple[tuple, tuple]:
        """(D with the reduced dims kept as 1, D without them)."""
        return (reduced_shape(self.domain, self.axes, True),
                reduced_shape(self.domain, self.axes, False))


@dataclass
class FusionPlan:
    kernels: list[Kernel]
    materialized: set[Value]
    reasons: dict[Value, str]  # materialized value -> why it has a buffer
    notes: dict[Value, str]  # inlined value shared by kernels -> why it is recomputed

    def explain(self) -> str:
        """One line per kernel (its ops, and a contraction's implementation and why), then
        one per decision: what `braze explain --kernels` prints for each cluster."""
        lines = []
        for i, k in enumerate(self.kernels):
            ops = " ".join(n.op for n in k.nodes)
            kept = "".join(f"; %{v.name} kept per row" for v in k.row_cached)
            impl = f" [{k.impl.label}: {k.impl.reason}]" if k.impl is not None else ""
            if k.expand is not None:
                impl += f" [expand %{k.expand.root.name} per row in a scratch: " \
                        "kernels/inverted.py]"
            lines.append(f"kernel {i} ({k.kind}) -> %{k.root.name}: {ops}{kept}{impl}")
        lines += [f"%{v.name} materialized: {r}" for v, r in self.reasons.items()]
        lines += [f"%{v.name} recomputed: {r}" for v, r in self.notes.items()]
        return "\n".join(lines)


def describe_kernels(graph: Graph, clusters: list, target: str = "cpu") -> str:
    """Each compiled cluster's fusion plan: every kernel, its ops, a contraction's
    implementation and why, then the plan's decisions (`braze explain --kernels`)."""
    from compiler.passes.cluster import outline

    lines = []
    for c in clusters:
        if c.compiled:
            lines.append(f"cluster {c.id} kernels:")
            lines += ["  " + line
                      for line in plan(outline(graph, c), target).explain().splitlines()]
    return "\n".join(lines) + "\n" if lines else ""


def plan(graph: Graph, target="cpu", fold_operands: bool | None = None) -> FusionPlan:
    """Decide the materialized values of a compiled cluster and its kernels, in order, and
    each contraction kernel's implementation on `target` (choice.choose).
    `fold_operands` (default: on CPU targets): a run-time matmul operand made by a
    movement op is read through it by the CPU's batched GEMM (kernels/batched.py), and
    attention's operands by its kernel, instead of getting a buffer."""
    if fold_operands is None:
        fold_operands = targets.kind(target) != "cuda"
    reasons: dict[Value, str] = {}
    for v in graph.outputs:
        if v.producer is not None and v.producer.op != "const":
            reasons.setdefault(v, "cluster output")
    users = graph.users()
    claimed: set[Node] = set()  # epilogue nodes, each applied by one contraction's kernel
    for at, n in enumerate(graph.nodes):
        if n.opdef.family is Family.CONTRACTION:
            # attention's, recurrence's and scatter's kernels (kernels/attention.py,
            # recurrent.py, scatter.py) write their result and nothing more
            chain = [] if n.op in ("attention", "recurrence", "scatter") else \
                _epilogue(n, at, users, graph, claimed)
            claimed.update(chain)
            if chain:
                ops = " ".join(e.op for e in chain)
                reasons.setdefault(chain[-1].outputs[0], f"{n.op} result after its epilogue "
                                   f"({ops}): written by the {n.op}'s kernel")
                for u in _epilogue_operands(n, chain):
                    reasons.setdefault(u, f"read by the epilogue of {n.op} %{n.outputs[0].name}")
            else:
                reasons.setdefault(n.outputs[0], f"{n.op} result: written by its own kernel")
            for u in n.inputs:
                if fold_operands and _folds(n, u, target):
                    _materialize_under_fold(n, u, reasons)
                    continue  # read through its movement ops while it is packed
                if n.op == "recurrence":
                    u = recurrent.source(u)  # read in place through reshapes
                if u.producer is not None and u.producer.op != "const":
                    reasons.setdefault(u, f"{n.op} operand: each element is read many times")
    _materialize_deep(graph, reasons, claimed)
    expands = inverted.fusions(graph, reasons, users, target) \
        if targets.kind(target) != "cuda" else {}
    order = {v: i for i, n in enumerate(graph.nodes) for v in n.outputs}
    while True:
        kernels = _kernels(graph, set(reasons))
        notes: dict[Value, str] = {}
        if not (_materialize_shared(kernels, reasons, notes, order) or
                _materialize_repeated(kernels, reasons) or
                _materialize_row_refusals(kernels, reasons) or
                _materialize_small_moved(kernels, reasons)):
            for k in kernels:
                if k.contraction is not None:
                    k.impl = choose(k.contraction, target)
                if k.contraction in expands and expands[k.contraction] not in reasons:
                    k.expand = _expand_kernel(expands[k.contraction], k, target)
            return FusionPlan(kernels, set(reasons), reasons, notes)


def _expand_kernel(root: Value, k: Kernel, target) -> Kernel:
    """The expand part of depthwise kernel `k`: the nodes of `k` that compute `root`."""
    inside = set(_fused_nodes(root, set()))
    e = Kernel(root, [n for n in k.nodes if n in inside])
    e.impl = choose(e.contraction, target)
    return e


def _folds(node: Node, u: Value, target) -> bool:
    """Whether contraction `node` reads its operand `u` (a movement op's result) through
    the emitter while packing it, so that `u` needs no buffer: the batched GEMM's B
    (kernels/batched.py), every operand of attention (kernels/attention.py), every
    operand of scatter made by movement or elementwise ops (kernels/scatter.py). Which kernel
    runs `node` is choice.choose's to say (the same answer the plan records)."""
    impl = choose(node, target).name
    if impl == choice.ATTENTION:
        return u.producer is not None and u.producer.opdef.family is Family.MOVEMENT
    if impl == choice.SCATTER:  # each element read once (an index once per item)
        return u.producer is not None and u.producer.opdef.family in (Family.MOVEMENT,
                                                                       Family.ELEMENTWISE)
    return impl == choice.BATCHED and batched.folds_operand(node, u)


def _materialize_under_fold(node: Node, u: Value, reasons: dict) -> None:
    """A folded operand is computed inside the packing loop, element by element: its
    expression may hold movement and elementwise ops only. Give a buffer to every value
    under it made by anything else (a reduction, a pool, another contraction): Swin V2's
    cosine attention normalizes K (x / max(sqrt(sum(x * x)), eps)) right under the
    transpose its batched GEMM reads through, and the emitter cannot inline a sum."""
    inline = (Family.MOVEMENT, Family.ELEMENTWISE)
    stack, seen = [u], set()
    while stack:
        v = stack.pop()
        p = v.producer
        if v in seen or p is None or p.op == "const" or v in reasons:
            continue
        seen.add(v)
        if p.opdef.family in inline:
            stack.extend(p.inputs)
        else:
            reasons[v] = (f"{p.op} result under a folded operand of {node.op} "
                          f"%{node.outputs[0].name}: only movement and elementwise ops "
                          "are computed while it is packed")


def _epilogue(node: Node, at: int, users: dict, graph: Graph, claimed: set) -> list[Node]:
    """The elementwise ops applied to a contraction's result before anything else reads
    it (bias, ReLU, GELU, residual add...), in graph order. They form a DAG fed by the
    result and by values that do not depend on it, of the result's shape, whose values
    are read only inside it except one, the root, of the result's dtype (the kernel stores
    each tile in the root's buffer, then applies the epilogue there while it is in cache:
    the raw result never gets a buffer). Nodes another contraction's epilogue claimed
    are not taken (a residual add of two convs belongs to the first)."""
    c = node.outputs[0]
    inside, tainted = {c}, {c}  # the DAG's values; every value computed from c
    depth = {c: 0}  # ops between c and each value of the DAG (at most MAX_INLINE_DEPTH)
    chain: list[Node] = []
    for n in graph.nodes[at + 1:]:  # `at`: node's position in graph.nodes
        from_c = [u for u in n.inputs if u in tainted]
        if not from_c:
            continue
        if (n.opdef.family is Family.ELEMENTWISE and n not in claimed
                and n.outputs[0].shape == c.shape and all(u in inside for u in from_c)
                and max(depth[u] for u in from_c) < MAX_INLINE_DEPTH):
            chain.append(n)
            inside.add(n.outputs[0])
            depth[n.outputs[0]] = 1 + max(depth[u] for u in from_c)
        tainted.update(n.outputs)
    outputs = set(graph.outputs)
    while chain:  # drop the latest ops until exactly one value leaves: the root
        taken = set(chain)
        leaving = [v for v in [c] + [n.outputs[0] for n in chain]
                   if v in outputs or any(r not in taken for r in users.get(v, []))]
        if leaving == [chain[-1].outputs[0]] and chain[-1].outputs[0].type == c.type:
            return chain
        chain.pop()
    return []


def _materialize_deep(graph: Graph, reasons: dict, claimed: set) -> None:
    """Give a buffer to each value whose inline expression (the ops from the nearest
    buffers, inputs or constants) reaches MAX_INLINE_DEPTH: a chain of ops becomes one
    kernel per MAX_INLINE_DEPTH of them. One walk in graph order (no recursion); epilogue
    nodes are never cut (`_epilogue` bounds their depth), and values materialized later
    only make expressions shallower."""
    depth: dict[Value, int] = {}
    for n in graph.nodes:
        if n.op == "const":
            continue
        d = 0 if n.opdef.family is Family.CONTRACTION else \
            1 + max((depth.get(u, 0) for u in n.inputs), default=0)
        for v in n.outputs:
            if v in reasons:
                depth[v] = 0
            elif d >= MAX_INLINE_DEPTH and n not in claimed:
                reasons[v] = (f"its inline expression is {d} ops deep (MAX_INLINE_DEPTH="
                              f"{MAX_INLINE_DEPTH}): a buffer bounds each kernel's depth")
                depth[v] = 0
            else:
                depth[v] = d


def _epilogue_operands(node: Node, chain: list[Node]) -> list[Value]:
    """The epilogue's other operands that need a buffer (not constants); an operand made
    by reshapes is read in the buffer of the value they reshape (the same order)."""
    inside = {node.outputs[0]} | {e.outputs[0] for e in chain}
    out = []
    for u in (u for e in chain for u in e.inputs if u not in inside):
        u = recurrent.source(u)
        if u.producer is not None and u.producer.op != "const":
            out.append(u)
    return out


def _kernels(graph: Graph, materialized: set) -> list[Kernel]:
    kernels = []
    for n in graph.nodes:
        for v in n.outputs:
            if v in materialized:
                kernels.append(_make_kernel(v, materialized))
    return kernels


def _make_kernel(root: Value, materialized: set) -> Kernel:
    nodes = _fused_nodes(root, materialized)
    k = Kernel(root, nodes)
    reds = [n for n in nodes if is_reduction(n)]
    if reds:
        last = reds[-1]  # the reduction nearest the root defines the rows
        k.domain, k.axes = last.inputs[0].shape, reduce_axes(last)
        k.levels = _levels(reds, set(nodes))
        k.row_cached = _row_cached(k)
    return k


def _row_cached(k: Kernel) -> list[Value]:
    """Costly values of shape D that several passes of row kernel `k` read: each is kept
    in a scratch row (outermost first: a value inside another kept one is not kept)."""
    reads = [_pass_reads(k, starts) for starts in _pass_starts(k)]
    nodes = set(k.nodes)
    shared = [v for v in _values_of(k) if sum(v in r for r in reads) >= 2
              and v.shape == k.domain and not is_reduction(v.producer)
              and _costly_in(v, nodes)]
    inner = {u for v in shared for u in _pass_reads(k, [v]) if u is not v}
    row = int(np.prod([k.domain[d] for d in k.axes], dtype=np.int64))
    kept, budget = [], ROW_CACHE_BYTES
    for v in shared:
        size = row * dtypes.itemsize(v.dtype)
        if v not in inner and size <= budget:
            kept.append(v)
            budget -= size
    return kept


def _values_of(k: Kernel) -> list[Value]:
    return [v for n in k.nodes for v in n.outputs]


def _pass_reads(k: Kernel, starts: list[Value]) -> set[Value]:
    """The kernel's values one pass computes from `starts` (it stops at buffers and at
    reductions, whose results are registers by then)."""
    nodes = set(k.nodes)
    seen: set[Value] = set()
    stack = list(starts)
    while stack:
        v = stack.pop()
        if v in seen or v.producer not in nodes:
            continue
        seen.add(v)
        if v in starts or not is_reduction(v.producer):
            stack.extend(v.producer.inputs)
    return seen


def _costly_in(v: Value, nodes: set, memo: dict | None = None) -> bool:
    """Whether computing `v` inside the kernel takes an op of EXPENSIVE_OPS per element
    (ops on a row's reduction results alone, like layer norm's mean = sum / n, run once
    per row and do not count)."""
    memo = {} if memo is None else memo
    if v not in memo:
        p = v.producer
        memo[v] = p in nodes and not is_reduction(p) and not _row_invariant(v, nodes, memo) \
            and (p.op in EXPENSIVE_OPS or any(_costly_in(u, nodes, memo) for u in p.inputs))
    return memo[v]


def _row_invariant(v: Value, nodes: set, memo: dict) -> bool:
    """Whether v is computed from reduction results and constants only (one per row);
    `memo` keeps answers under ("row", v)."""
    key = ("row", v)
    if key not in memo:
        p = v.producer
        if p is None or p not in nodes:  # a scalar constant; not a buffer, nor a tensor
            memo[key] = p is not None and p.op == "const" and p.attrs["value"].size == 1
        else:
            memo[key] = is_reduction(p) or (p.opdef.family is Family.ELEMENTWISE and all(
                _row_invariant(u, nodes, memo) for u in p.inputs))
    return memo[key]


def _levels(reds: list[Node], inside: set) -> list[list[Node]]:
    """Group reductions into passes: a reduction comes one pass after those it reads."""
    level: dict[Node, int] = {}
    memo: dict[Value, int] = {}

    def depth(v: Value) -> int:  # 1 + the latest pass among reductions behind v
        p = v.producer
        if p is None or p not in inside:
            return 0
        if v not in memo:
            memo[v] = level[p] + 1 if p in level else max(
                (depth(u) for u in p.inputs), default=0)
        return memo[v]

    for r in reds:  # topological order: inner reductions are placed first
        level[r] = depth(r.inputs[0])
    out: list[list[Node]] = [[] for _ in range(max(level.values()) + 1)]
    for r in reds:
        out[level[r]].append(r)
    return out


def _fused_nodes(root: Value, materialized: set) -> list[Node]:
    """The ops a kernel computes: root's producer and every inlined producer behind it."""
    seen: dict[Node, None] = {}  # in post-order: each node after its inlined inputs
    stack: list[tuple[Value, bool]] = [(root, False)]  # (value, its inputs pushed?)
    while stack:  # iterative: a long chain of inlined ops must not exhaust Python's stack
        v, expanded = stack.pop()
        p = v.producer
        if p is None or p.op == "const" or p in seen or (v in materialized and v is not root):
            continue
        if expanded:
            seen[p] = None
            continue
        stack.append((v, True))
        stack.extend((u, False) for u in reversed(p.inputs))
    return list(seen)


# -- shared values: recompute or materialize ------------------------------------

def _materialize_shared(kernels: list[Kernel], reasons: dict, notes: dict,
                        order: dict[Value, int]) -> bool:
    """Values computed by several kernels: materialize the costly ones; True if any."""
    count: dict[Value, int] = {}
    for k in kernels:
        for n in k.nodes:
            for v in n.outputs:
                if v is not k.root:
                    count[v] = count.get(v, 0) + 1
    materialized = set(reasons)
    memo: dict = {}
    changed = False
    # Latest values first: once a shared value gets a buffer, the values inlined into it
    # are read by its kernel only, so they are not decided this round (a residual
    # stream x + f(x) gets one buffer per block, not one per op of f).
    covered: set[Value] = set()
    for v, c in sorted(count.items(), key=lambda vc: -order.get(vc[0], -1)):
        if c < 2 or v in covered:
            continue
        ops, costly = _cost(v, materialized, memo)
        if is_reduction(v.producer):
            reasons[v] = f"reduction read by {c} kernels: computed once"
        elif costly or ops > INLINE_COST:
            why = "an expensive op" if costly else f"{ops} ops (> INLINE_COST={INLINE_COST})"
            v = _stored(v, materialized)
            reasons[v] = f"read by {c} kernels and costly to recompute ({why})"
        else:
            notes[v] = f"read by {c} kernels; {ops} ops, cheaper to recompute than to store"
            continue
        covered.update(u for n in _fused_nodes(v, materialized) for u in n.outputs)
        changed = True
    return changed



def _cost(v: Value, materialized: set, memo: dict) -> tuple[int, bool]:
    """(ops to recompute v inline, whether an expensive op is among them)."""
    if v in memo:
        return memo[v]
    p = v.producer
    if p is None or p.op == "const" or v in materialized:
        return 0, False
    n, costly = 1, p.op in EXPENSIVE_OPS or is_reduction(p)
    for u in p.inputs:
        c, e = _cost(u, materialized, memo)
        n, costly = n + c, costly or e
    if p.opdef.family is Family.POOL:  # its input is read (and recomputed) per window tap
        n *= int(np.prod(p.attrs["kernel"]))
    memo[v] = (n, costly)
    return memo[v]


def _materialize_repeated(kernels: list[Kernel], reasons: dict) -> bool:
    """Costly values one pass of a kernel reads along several paths (through movement
    ops, at different indices: recomputed per path, exponentially in chains)."""
    materialized = set(reasons)
    memo: dict = {}
    for k in kernels:
        for start in _pass_starts(k):
            for v, n in _read_paths(k, start).items():
                if n < 2 or is_reduction(v.producer) or v.producer not in k.nodes:
                    continue
                ops, costly = _cost(v, materialized, memo)
                if costly or ops > INLINE_COST:
                    reasons[_stored(v, materialized)] = (
                        f"read along {n} paths per element of the kernel of "
                        f"%{k.root.name} and costly to recompute")
                    return True
    return False


# A value moved by index arithmetic (a reshape that splits a dim, a broadcast) and at
# most 1/SMALL_MOVED_RATIO of a loop kernel's root gets a buffer of its own: computed once
# per element of it, not once per element of the root.
SMALL_MOVED_RATIO = 64


def _materialize_small_moved(kernels: list[Kernel], reasons: dict) -> bool:
    """Small values a large loop kernel reads through movement ops of their own (a
    GroupNorm's per-group statistics repeated over each group's channels: reshape,
    broadcast, reshape), which it would compute again at each of its elements, with a
    division per element and no vector loads (the channels-last GroupNorm's last loop:
    1.7 ms for 64 x 64 x 256, 0.23 ms with its statistics stored per channel)."""
    changed = False
    materialized = set(reasons)
    for k in kernels:
        if k.kind != "loop":
            continue
        size = k.root.type.size
        covered: set[Value] = set()
        for n in reversed(k.nodes):  # the value read, not the steps that make it
            v = n.outputs[0]
            if (v is k.root or v in covered or n.opdef.family is not Family.MOVEMENT
                    or v.type.size * SMALL_MOVED_RATIO > size
                    or not any(_moved_chain(u, materialized) for u in n.inputs)):
                continue
            reasons[v] = (f"moved by {n.op}, {v.type.size} elements read by the kernel of "
                          f"%{k.root.name} ({size}): computed once")
            covered.update(u for m in _fused_nodes(v, materialized) for u in m.outputs)
            changed = True
    return changed


def _moved_chain(u: Value, materialized: set) -> bool:
    """Whether u is itself computed by a movement op of more than one element: with the
    movement op reading it, index arithmetic on index arithmetic (one movement op of a
    buffer is a load at a mapped index, cheap enough to repeat)."""
    p = u.producer
    return (p is not None and u not in materialized and u.type.size > 1
            and p.opdef.family is Family.MOVEMENT)


def _stored(v: Value, materialized: set) -> Value:
    """Where a value chosen for a buffer because it is shared or read along several paths
    gets it: for a reshape, its input (computed by an op and not stored yet), since the
    reshape then reads that buffer at the same offsets for free, and the kernel writing
    it runs over the input's own shape. Funnel's relative shift under torch.compile
    wrote a 2-d concat through a reshape to 1-d: each element's flat index split back
    into the concat's rows and columns, 1.4 ms for 391680 elements (0.39 ms stored as
    the concat)."""
    p = v.producer
    while p is not None and p.op == "reshape":
        x = p.inputs[0]
        if x in materialized or x.producer is None or x.producer.op == "const":
            break
        v, p = x, x.producer
    return v


def _pass_starts(k: Kernel) -> list[list[Value]]:
    """The values each pass of k reads per element: reduction inputs, then the root."""
    return [[r.inputs[0] for r in level] for level in k.levels] + [[k.root]]


def _read_paths(k: Kernel, starts: list[Value]) -> dict[Value, int]:
    """How many different index maps each value is read through in one pass.

    A path's index map is the movement ops and broadcasting operands along it;
    reads through the same map hit the emitter's memo and cost nothing more.
    Reductions end a pass (their results are registers). Counts are capped.
    """
    maps: dict[Value, set] = {v: {()} for v in starts}
    for n in reversed(k.nodes):
        out = n.outputs[0]
        if out not in maps or (is_reduction(n) and out not in starts):
            continue
        moves = n.opdef.family is Family.MOVEMENT
        # a pool reads its input at each position of its window
        reads = range(int(np.prod(n.attrs["kernel"]))) if n.opdef.family is Family.POOL \
            else (0,)
        for pos, u in enumerate(n.inputs):
            step = moves or u.shape != out.shape or len(reads) > 1
            new = {m + ((n, pos, r),) for m in maps[out] for r in reads} if step else maps[out]
            maps.setdefault(u, set()).update(list(new)[:_MAX_MAPS])
    return {v: len(m) for v, m in maps.items()}


_MAX_MAPS = 64  # index maps tracked per value (enough to tell 1 from many)


# -- row kernels: what they can take in ----------------------------------------

def _materialize_row_refusals(kernels: list[Kernel], reasons: dict) -> bool:
    changed = False
    for k in kernels:
        if k.kind != "row":
            continue
        refusal = _row_refusal(k)
        if refusal is not None:
            v, why = refusal
            reasons[v] = why
            changed = True
    return changed


# A transpose of at least this many elements that moves its source's last axis is not
# inlined into a row kernel reducing its domain's last axis: each of the row kernel's
# passes (a norm's mean, variance and output) would walk the reduced axis a whole source
# row apart, a cache line per element. wav2vec2's GroupNorm (512 groups) over its first
# conv's channels-last output (3199 x 512) took 15.2 ms that way.
STRIDED_ROW_ELEMENTS = 1 << 14


def moves_last_axis(n: Node | None) -> bool:
    """Whether `n` is a transpose that does not keep its source's last (contiguous) axis
    last: its output's rows are read down its source's columns."""
    return n is not None and n.op == "transpose" and \
        n.attrs["perm"][-1] != len(n.outputs[0].shape) - 1


def _strided_transpose(k: Kernel) -> Value | None:
    """The first large transpose in row kernel k that moves its source's last axis,
    when k reduces its domain's last axis (see STRIDED_ROW_ELEMENTS)."""
    if len(k.domain) - 1 not in k.axes:
        return None
    for n in k.nodes:
        out = n.outputs[0]
        if (moves_last_axis(n) and out.type.size >= STRIDED_ROW_ELEMENTS
                and n is not k.root.producer):
            return out
    return None


def _row_refusal(k: Kernel) -> tuple[Value, str] | None:
    """The first value a row kernel cannot inline, with the reason; None if legal.

    A reduction's register holds its row's value only, so every value derived
    from it must be read at an index of the same row: row-dependent values may
    have shape D (the domain) or D_keep (D with reduced dims 1; elementwise
    broadcasting then maps D's index to the row's), or D_nokeep (D without the
    reduced dims) when every row-dependent operand is D_nokeep too; they pass
    through no movement op but D_keep -> D broadcast and D_keep <-> D_nokeep
    reshape.
    """
    strided = _strided_transpose(k)
    if strided is not None:
        return strided, ("a transpose read down its source's rows by a row kernel "
                         "reducing its last axis: one copy, then the passes read rows "
                         "in order")
    keep, nokeep = k.row_shapes()
    full = {k.domain, keep}
    # the movement ops that keep a row-dependent value's index within its row
    moves = {("broadcast", keep, k.domain), ("reshape", keep, nokeep),
             ("reshape", nokeep, keep)}
    dep: set[Value] = set()
    for n in k.nodes:
        row_in = [u for u in n.inputs if u in dep]
        out = n.outputs[0]
        if is_reduction(n):
            x = n.inputs[0]
            if x.shape != k.domain or reduce_axes(n) != k.axes:
                return out, (f"reduction over axes {reduce_axes(n)} of {x.shape}: its "
                             f"consumer's row kernel reduces axes {k.axes} of {k.domain}")
        elif row_in and n.opdef.family is Family.MOVEMENT:
            if (n.op, row_in[0].shape, out.shape) not in moves:
                return row_in[0], (f"{n.op} of a value derived from a reduction: "
                                   f"the row kernel ends before it")
        elif row_in:
            # D and D_keep mix by broadcasting; D_nokeep values only mix among themselves
            ok = full if out.shape in full else {nokeep}
            bad = [u for u in row_in if u.shape not in ok]
            if bad or out.shape not in ok:
                u = bad[0] if bad else row_in[0]
                return u, (f"{n.op} reads it at shape {out.shape}, outside the row "
                           f"kernel's domain {k.domain}")
        if is_reduction(n) or row_in:
            dep.add(out)
    return None

