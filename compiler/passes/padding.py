"""Padding a dynamic length: one graph compiled at a bucket length L serves every length n <= L.

The front end pads the inputs' length axes from n to L with zeros, passes a bool
`valid` input of shape [L] (true at positions < n), runs the graph and slices the
outputs' length axes back to n. That is right when every valid output element (each
length coordinate < n) is computed from valid input elements only, or from padded
ones that the graph sets to the identity of what reads them. This pass proves it or
refuses with a sentence (the front end then compiles the exact shapes, as before).

Which axes carry the length. Not guessed from sizes (a bucket of 256 would meet
d_model 256): the front end imports and optimizes the model twice, at L (`bucket`)
and at another length (`probe`: bridge/dynamic.py takes L - 1), and node i of one is
node i of the other.
An axis whose size is L in one and the probe length in the other carries the length;
any other difference refuses: a different structure (a pass decided by size), a dim
that is a multiple of the length (merged into another axis), an attribute that moves
with the length other than as a size (a slice at L - 1), a constant whose values
change with it (a mean's 1/L). A constant with length axes (a causal mask built from
the length) must agree with the probe's on their common positions. That is checked at
L, L - 1 and the shortest length the bucket serves, not proven for every n: a constant
built from the length that agrees at those three but not at some n between would pass
(the ones exported models build from a length are functions of the position: masks,
ranges, position tables).

What each op needs, given its operands' length axes (RULES):
- elementwise, const, transpose, broadcast: position-wise, nothing.
- reshape: each length axis must survive whole (same size, same product of the dims
  before it), so element i of the axis stays element i.
- slice, pad, concat, gather: none on a length axis (they move positions), but for
  reading position 0 alone (a slice [0:1]: a [CLS] token) and a gather whose constant
  indices never exceed their own position along the length (0, or an arange), valid
  at every length; gather's indices may carry the length only when they are a graph
  input (zero padded, so an index in range) or a constant (positions 0..L-1 of a table).
- reductions over a length axis: padded elements become the reduction's identity
  (0 for a sum, -inf for a max, ...) with `select(valid, x, identity)`; argmax/argmin
  likewise (not select_last, which would pick a padded tie).
- matmul over a length axis (k): both operands' padded k become 0 (select, so that
  a NaN computed at a padded position cannot leak as 0 * NaN).
- attention with length keys: padded keys and values become 0 and the additive mask
  -inf at padded keys (select of the existing mask, or of 0): softmax gives them weight
  exactly 0. A valid query always has key 0 valid, so no valid row is empty.
- conv, pools: the length may only be the batch axis. host: no length axes at all.
- any other op: no length axes.
Padded rows of a value may hold anything (NaN included); `select` replaces them where
they would be read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from compiler import dtypes
from compiler.ir import Graph, Node, TensorType, Value

# the bool [L] graph input the pass adds, true at positions < n (this name unless the
# graph has a value of that name: Padding.valid says)
VALID = "braze.valid"


class PaddingRefused(Exception):
    """The graph cannot serve shorter lengths by padding; the message says why."""


@dataclass(frozen=True)
class Padding:
    """What running the padded graph takes: `length` (L), per graph input its length
    axes (padded with zeros), per graph output its length axes (sliced to n), and the
    name of the `valid` input."""

    length: int
    inputs: dict
    outputs: list
    valid: str = VALID


Axes = frozenset


def pad_length(bucket: Graph, probe: Graph, length: int, probe_length: int,
               more: tuple = ()) -> Padding:
    """Rewrite `bucket` (the model at `length`, after the passes) so that it serves every
    length up to `length` from zero-padded inputs; `probe` is the same model at
    `probe_length`, `more` further (graph, length) probes that must agree with it (the
    front ends add the shortest length the bucket serves). PaddingRefused (nothing
    changed) when that is not proven."""
    axes = length_axes(bucket, probe, length, probe_length)
    for other, other_length in more:
        if length_axes(bucket, other, length, other_length) != axes:
            raise PaddingRefused(f"the length axes at {other_length} differ from those at "
                                 f"{probe_length}")
    edits: list[Callable[[_Masks], None]] = []
    for node in bucket.nodes:
        edit = _rule(node, axes, bucket)
        if edit is not None:
            edits.append(edit)
    # attributes and constants after the rules, whose reason is the clearer one where
    # both refuse (a host node reading the length also has a payload naming its shapes)
    for graph, at in ((probe, probe_length), *more):
        for nb, nx in zip(bucket.nodes, graph.nodes):
            _same_attrs(nb, nx, length, at, axes)
    masks = _Masks(bucket, length)
    for edit in edits:
        edit(masks)
    bucket.toposort()
    return Padding(length, {v.name: tuple(sorted(axes[v])) for v in bucket.inputs
                            if v is not masks.valid and axes.get(v)},
                   [tuple(sorted(axes.get(v, ()))) for v in bucket.outputs], masks.valid.name)


# -- which axes carry the length ------------------------------------------------

def length_axes(bucket: Graph, probe: Graph, length: int, probe_length: int) -> dict:
    """Value of `bucket` -> the axes carrying the length (PaddingRefused unless `probe`
    has the same nodes, with the same shapes up to the length; pad_length then compares
    their attributes and constants)."""
    pairs = _correspond(bucket, probe)
    axes = {vb: _axes_of(vb, vx, length, probe_length) for vb, vx in pairs.items()}
    if not any(axes[v] for v in bucket.inputs):
        raise PaddingRefused("no input carries the length")
    return axes


def _correspond(bucket: Graph, probe: Graph) -> dict:
    """bucket value -> probe value, node by node."""
    if [v.name for v in bucket.inputs] != [v.name for v in probe.inputs]:
        raise PaddingRefused("the graphs at two lengths have different inputs")
    if len(bucket.nodes) != len(probe.nodes) or len(bucket.outputs) != len(probe.outputs):
        raise PaddingRefused(f"the passes made a different graph at another length "
                             f"({len(bucket.nodes)} vs {len(probe.nodes)} nodes)")
    pairs = dict(zip(bucket.inputs, probe.inputs))
    for nb, nx in zip(bucket.nodes, probe.nodes):
        if (nb.op != nx.op or len(nb.inputs) != len(nx.inputs)
                or len(nb.outputs) != len(nx.outputs)
                or any(pairs.get(a) is not b for a, b in zip(nb.inputs, nx.inputs))):
            raise PaddingRefused(f"the passes made a different graph at another length "
                                 f"(at {nb.describe()})")
        pairs.update(zip(nb.outputs, nx.outputs))
    if any(pairs.get(a) is not b for a, b in zip(bucket.outputs, probe.outputs)):
        raise PaddingRefused("the graphs at two lengths have different outputs")
    return pairs


def _axes_of(vb: Value, vx: Value, length: int, probe_length: int) -> Axes:
    if vb.type.rank != vx.type.rank or not vb.type.static or not vx.type.static:
        raise PaddingRefused(f"%{vb.name} has a rank or shape that depends on data or length")
    found = set()
    for k, (a, b) in enumerate(zip(vb.shape, vx.shape)):
        if a == b:
            continue
        if (a, b) != (length, probe_length):
            raise PaddingRefused(f"dim {k} of %{vb.name} is {a} at length {length} and {b} "
                                 f"at {probe_length}: not the length itself (merged with "
                                 "another axis, shifted or repeated)")
        found.add(k)
    return Axes(found)


def _same_attrs(nb: Node, nx: Node, length: int, probe_length: int, axes: dict) -> None:
    if nb.op == "const":
        _same_constant(nb, nx, axes[nb.output])
        return
    for key, a in nb.attrs.items():
        b = nx.attrs.get(key)
        if _equal(a, b) or _differs_by_length(a, b, length, probe_length):
            continue
        raise PaddingRefused(f"attribute {key} of {nb.describe()} depends on the length "
                             f"({_short(a)} at {length}, {_short(b)} at {probe_length})")


def _short(value, limit: int = 60) -> str:
    """An attribute for a message (a host node's payload is a whole serialized node)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _equal(a, b) -> bool:
    try:
        return bool(a == b) if not isinstance(a, np.ndarray) else np.array_equal(a, b)
    except (TypeError, ValueError):
        return False


def _differs_by_length(a, b, length: int, probe_length: int) -> bool:
    """A list of sizes whose only differences are the length (a reshape's shape)."""
    if not isinstance(a, (list, tuple)) or not isinstance(b, (list, tuple)) or len(a) != len(b):
        return False
    return all(x == y or (x, y) == (length, probe_length) for x, y in zip(a, b))


def _same_constant(nb: Node, nx: Node, lengths: Axes) -> None:
    a, b = nb.attrs["value"], nx.attrs["value"]
    common = tuple(slice(0, min(p, q)) for p, q in zip(a.shape, b.shape))
    if not np.array_equal(a[common], b[common], equal_nan=a.dtype.kind in "fc"):
        what = "at its common positions " if lengths else ""
        raise PaddingRefused(f"constant %{nb.output.name} {what}changes with the length")


# -- what each op needs ------------------------------------------------------------

Edit = Callable[["_Masks"], None]


def _rule(node: Node, axes: dict, graph: Graph) -> Edit | None:
    """The edit that makes `node` right on padded operands (None: none needed);
    PaddingRefused when none would."""
    ins = [axes.get(v, Axes()) for v in node.inputs]
    if not any(ins) and node.op != "host":
        return None
    rule = RULES.get(node.op) or _FAMILY_RULES.get(node.opdef.family.name)
    if rule is None:
        raise PaddingRefused(f"{node.describe()} reads the length axes {_shown(ins)} and no "
                             "rule says what padding does to it")
    return rule(node, ins, axes, graph)


def _shown(ins) -> str:
    return ", ".join(str(sorted(a)) for a in ins)


def _positionwise(node, ins, axes, graph) -> None:
    return None


def _reshape(node, ins, axes, graph) -> None:
    src, out = node.inputs[0].shape, node.output.shape
    found = set()
    for p in ins[0]:
        q = _same_place(src, out, p)
        if q is None or q not in axes[node.output]:
            raise PaddingRefused(f"{node.describe()} moves length axis {p} of {src} "
                                 f"into {out}: positions would mix")
        found.add(q)
    if found != axes[node.output]:
        raise PaddingRefused(f"{node.describe()} makes a length axis from no length axis")


def _same_place(src: tuple, out: tuple, p: int) -> int | None:
    """The axis of `out` holding axis `p` of `src` whole, else None."""
    before = int(np.prod(src[:p], dtype=np.int64))
    for q in range(len(out)):
        if out[q] == src[p] and int(np.prod(out[:q], dtype=np.int64)) == before:
            return q
    return None


def _slice(node, ins, axes, graph) -> None:
    a = node.attrs
    for k in ins[0]:
        whole = (a["starts"][k], a["steps"][k], a["sizes"][k]) == (0, 1, node.inputs[0].shape[k])
        if not whole and (a["starts"][k], a["sizes"][k]) != (0, 1):
            raise PaddingRefused(f"{node.describe()} slices length axis {k}")


def _pad(node, ins, axes, graph) -> None:
    r = node.inputs[0].type.rank
    if any(node.attrs["pads"][k] or node.attrs["pads"][k + r] for k in ins[0]):
        raise PaddingRefused(f"{node.describe()} pads length axis {sorted(ins[0])}")


def _concat(node, ins, axes, graph) -> None:
    if node.attrs["axis"] in axes[node.output]:
        raise PaddingRefused(f"{node.describe()} concatenates along the length")


def _gather(node, ins, axes, graph) -> None:
    data, idx = node.inputs
    if node.attrs["axis"] in ins[0] and not _reads_valid(idx, ins[1]):
        raise PaddingRefused(f"{node.describe()} gathers along the length at positions "
                             "that may be padded")
    computed = idx.producer is not None and idx.producer.op != "const"
    if ins[1] and (computed or data.shape[node.attrs["axis"]] == 0):
        raise PaddingRefused(f"{node.describe()} takes indices computed at padded positions "
                             "(they could be out of range)")


def _reads_valid(idx: Value, lengths: Axes) -> bool:
    """Constant indices that never pass the valid part: each is at most its own position
    along one of the indices' length axes (an arange: position i reads i), or 0 (valid
    at every length, n >= 1)."""
    if idx.producer is None or idx.producer.op != "const":
        return False
    v = idx.producer.attrs["value"]
    bound = np.zeros(v.shape, np.int64)
    for a in lengths:
        shape = [1] * v.ndim
        shape[a] = v.shape[a]
        bound = np.maximum(bound, np.arange(v.shape[a]).reshape(shape))
    return bool(np.all((v >= 0) & (v <= bound)))


def _reduce(node, ins, axes, graph) -> Edit | None:
    over = set(node.attrs["axes"]) & ins[0]
    if not over:
        return None
    x = node.inputs[0]
    fill = _identity(node.op, x.dtype)
    return lambda masks: masks.fill(node, 0, over, fill)


def _arg(node, ins, axes, graph) -> Edit | None:
    if node.attrs["axis"] not in ins[0]:
        return None
    if node.attrs["select_last"]:
        raise PaddingRefused(f"{node.describe()} picks the last of ties, which may be padded")
    x = node.inputs[0]
    fill = _identity("reduce_max" if node.op == "argmax" else "reduce_min", x.dtype)
    return lambda masks: masks.fill(node, 0, {node.attrs["axis"]}, fill)


def _identity(op: str, dtype: str):
    """The value a padded element must have so that the reduction ignores it."""
    np_dtype = _np(dtype)
    if op == "reduce_sum":
        return np_dtype.type(0)
    if op == "reduce_prod":
        return np_dtype.type(1)
    big = np.inf if np_dtype.kind == "f" else np.iinfo(np_dtype).max
    low = -np.inf if np_dtype.kind == "f" else np.iinfo(np_dtype).min
    return np_dtype.type(low if op == "reduce_max" else big)


def _np(dtype: str) -> np.dtype:
    """The numpy dtype of a fill constant (bf16 has none: refused)."""
    try:
        return dtypes.to_numpy(dtype)
    except ValueError:
        raise PaddingRefused(f"no fill constant of dtype {dtype}") from None


def _matmul(node, ins, axes, graph) -> Edit | None:
    a, b = node.inputs
    ka, kb = a.type.rank - 1, b.type.rank - 2
    if ka not in ins[0]:
        return None
    if kb not in ins[1]:
        raise PaddingRefused(f"{node.describe()}: k carries the length in one operand only")

    def edit(masks):
        masks.fill(node, 0, {ka}, _zero(a.dtype))
        masks.fill(node, 1, {kb}, _zero(b.dtype))
    return edit


def _zero(dtype: str):
    return _np(dtype).type(0)


def _attention(node, ins, axes, graph) -> Edit | None:
    q, k, v = node.inputs[:3]
    if any(t.type.rank - 1 in a for t, a in zip((q, k, v), ins)):
        raise PaddingRefused(f"{node.describe()}: the head dim carries the length")
    s = k.type.rank - 2
    if s not in ins[1]:
        return None
    if s not in ins[2]:
        raise PaddingRefused(f"{node.describe()}: keys and values disagree on the length")

    def edit(masks):
        masks.fill(node, 1, {s}, _zero(k.dtype))
        masks.fill(node, 2, {s}, _zero(v.dtype))
        masks.mask_keys(node)
    return edit


def _batch_only(node, ins, axes, graph) -> None:
    if any(a - {0} for a in ins[:1]) or any(ins[1:]):
        raise PaddingRefused(f"{node.describe()} mixes positions along the length "
                             f"(length axes {_shown(ins)})")


def _host(node, ins, axes, graph) -> None:
    if any(ins) or any(axes.get(o) for o in node.outputs):
        raise PaddingRefused(f"{node.describe()} runs on the host with length axes, whose "
                             "meaning braze does not know")


RULES: dict[str, Callable] = {
    "const": _positionwise, "transpose": _positionwise, "broadcast": _positionwise,
    "reshape": _reshape, "slice": _slice, "pad": _pad, "concat": _concat,
    "gather": _gather, "argmax": _arg, "argmin": _arg, "matmul": _matmul,
    "attention": _attention, "conv": _batch_only, "host": _host,
    **{op: _reduce for op in ("reduce_sum", "reduce_prod", "reduce_max", "reduce_min")},
}
_FAMILY_RULES: dict[str, Callable] = {"ELEMENTWISE": _positionwise, "POOL": _batch_only}


# -- the edits ---------------------------------------------------------------------

class _Masks:
    """Builds the masks the edits need from the `valid` input, each shape once."""

    def __init__(self, graph: Graph, length: int):
        self.graph = graph
        self.length = length
        self.valid = graph.add_input(graph.fresh_name(VALID), TensorType("bool", (length,)))
        self._shaped: dict = {}
        self._consts: dict = {}
        self._masked: dict = {}  # attention mask -> it with -inf at padded keys

    def const(self, value, dtype) -> Value:
        """A scalar constant, one per value and dtype."""
        key = (np.asarray(value, dtype).tobytes(), np.dtype(dtype).str)
        if key not in self._consts:
            self._consts[key] = self.graph.const(np.asarray(value, dtype), name="braze.fill")
        return self._consts[key]

    def at(self, rank: int, axis: int) -> Value:
        """`valid` shaped [1, ..., L (at axis), ..., 1] of `rank` dims."""
        key = (rank, axis)
        if key == (1, 0):
            return self.valid
        if key not in self._shaped:
            shape = [1] * rank
            shape[axis] = self.length
            self._shaped[key] = self.graph.op("reshape", self.valid, shape=shape,
                                              name="braze.valid")
        return self._shaped[key]

    def fill(self, node: Node, i: int, over: set, value) -> None:
        """Input i of `node` with `value` at positions padded along the axes `over`."""
        x = node.inputs[i]
        out = x
        for axis in sorted(over):
            out = self.graph.op("select", self.at(x.type.rank, axis), out,
                                self.const(value, value.dtype), name="braze.pad_fill")
        self.graph.set_input(node, i, out)

    def mask_keys(self, node: Node) -> None:
        """The attention's additive mask, -inf at padded keys."""
        q = node.inputs[0]
        dtype = _np(q.dtype)
        base = node.inputs[3] if len(node.inputs) == 4 else self.const(0, dtype)
        if base not in self._masked:
            self._masked[base] = self.graph.op("select", self.valid, base,
                                               self.const(-np.inf, dtype),
                                               name="braze.key_mask")
        mask = self._masked[base]
        self.graph.set_inputs(node, list(node.inputs[:3]) + [mask])
