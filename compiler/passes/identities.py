"""Algebraic identities: rules that remove work without changing any result.

x is the variable operand, c a constant, T a dtype. A rule that returns x
applies only when the result has x's exact type (so no broadcast or cast is
lost) and never re-points a graph output at a graph input.

Neutral operands (every element of c equal to the neutral value):
  x + 0, 0 + x, x - 0, x * 1, 1 * x, x / 1, x ** 1          -> x
  x | 0, x ^ 0 (bit ops), x << 0, x >> 0, x and true, x or false -> x
  max(x, lowest(T)), min(x, highest(T))   (-inf / +inf for floats) -> x
  x + 0 turns -0.0 into +0.0 in IEEE arithmetic; the two compare equal and
  every framework's simplifier (XLA's included) makes this trade.
  NaN stays NaN: NaN*1, NaN+0 and max(NaN, -inf) are NaN, as x is.
Division by a float constant 2^k: x / c -> x * (1/c) (1/c is exact, so both round the
same real number; a multiply is several times cheaper than a divide in a kernel).
Involutions: neg(neg(x)) -> x, not(not(x)) -> x.
select(c, a, b) with c all true -> a, all false -> b; select(p, a, a) -> a.
Casts:
  cast(x, T) with T = dtype(x)                           -> x
  cast(cast(x, U), T) with dtype(x) -> U lossless         -> cast(x, T)
    (U holds every value of dtype(x) exactly, so the outer cast sees the same
    number and rounds or truncates it once, as cast(x, T) does)
Movement:
  reshape/broadcast to x's own shape, identity transpose, whole slice,
  zero padding, single-input concat, reduction over no axes -> x
  reshape(reshape(x, s1), s2)                            -> reshape(x, s2)
  transpose(transpose(x, p), q)                          -> transpose(x, r), r[i] = p[q[i]]
    (out[..i..] = mid[..q[i]..] and mid[..j..] = x[..p[j]..])
  transpose that keeps every non-1 dimension in order    -> reshape (no data moves)
  broadcast(broadcast(x, s1), s2)                        -> broadcast(x, s2)
  slice(slice(x, a, s, n), b, t, m)                      -> slice(x, a + b*s, s*t, m)
    (element i reads mid[b + i*t] = x[a + (b + i*t)*s])
  reduce over axes that all have size 1                   -> reshape (or x with keepdims)

Constant gathers: gather(x, c) over 1-d x and a constant 1-d index c whose entries run in
consecutive stretches (at least MIN_GATHER_RUN long on average) -> the concat of those
stretches as slices, of x or, through x's own concats and slices, of the values x is
made of. A scatter with positions known at import (importers/scans.scatter_nd_ir:
torch's out[:, t] = h, ONNX ScatterND) is a gather from concat(x, updates); a loop of
them (RWKV's 128 time steps, each writing its row of the output) chained 128 gathers,
and every element of the last one walked back through all of them. Each gather becomes
a concat of the rows written so far and the rest of x: the chain collapses to one
concat of the rows. An index whose runs are too many but repeat one pattern row after
row, each stretch of a row moving by its own step per row (the scatter of a strided
view: torch's x.view(r, w)[:, :k] *= m, Funnel's relative shift), is one concat along
the rows of 2-d strided views of the pieces (reshape to rows of the step, slice).

Strength reduction of float pow by a constant small integer (the one family here that
may move a result by a rounding): x ** 2 -> x * x, x ** 3 -> (x * x) * x,
x ** 4 -> (x * x) * (x * x), x ** -1 -> 1 / x. x * x and 1 / x are the correctly
rounded x^2 and 1/x; a cube or fourth power rounds twice (within 1 ulp of the true
power), as torch's and onnxruntime's own pow kernels compute these exponents. The
win is large: pow lowers to a scalar libm call that blocks vectorization and keeps
the op out of a GEMM's register epilogue (GPT-2's tanh GELU has x ** 3).
Likewise erf(x / c) -> erf(x * (1/c)) for a float constant c read only by that erf: the
argument may move by 1 ulp, which moves erf by at most about 1 ulp (|x erf'(x) / erf(x)|
<= 1), under the 4 ulp that braze's float32 erf itself allows (codegen/mathlib.py); a
vector division costs ~10 cycles of throughput in a GEMM epilogue, a multiply 0.5
(the erf GELU, x * (1 + erf(x / sqrt 2)) / 2, after every MLP's first matmul).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler import dtypes
from compiler.ir import Graph, Node, Value
from compiler.ops.elementwise import BINARY
from compiler.ops.reduction import REDUCE
from compiler.passes.rules import Context, Rule, apply_rules, const_value, forwardable, new_const


def _all(arr: np.ndarray | None, value) -> bool:
    return arr is not None and arr.dtype != object and arr.size > 0 and bool(np.all(arr == value))


def _lowest(dtype: str):
    return -np.inf if dtype in dtypes.FLOATS else np.iinfo(dtypes.to_numpy(dtype)).min


def _highest(dtype: str):
    return np.inf if dtype in dtypes.FLOATS else np.iinfo(dtypes.to_numpy(dtype)).max


# op -> (neutral value for a dtype, may the constant come first?)
_NEUTRAL = {
    "add": (lambda t: 0, True), "sub": (lambda t: 0, False), "mul": (lambda t: 1, True),
    "div": (lambda t: 1, False), "pow": (lambda t: 1, False),
    "bitor": (lambda t: 0, True), "bitxor": (lambda t: 0, True),
    "shl": (lambda t: 0, False), "shr": (lambda t: 0, False),
    "and": (lambda t: True, True), "or": (lambda t: False, True),
    "max": (_lowest, True), "min": (_highest, True),
}


# -- neutral operands -----------------------------------------------------------

def check_neutral(node: Node, ctx: Context):
    neutral, commutes = _NEUTRAL[node.op]
    a, b = node.inputs
    value = neutral(a.dtype)
    if _all(const_value(b), value):
        return forwardable(ctx, node, a) or a
    if commutes and _all(const_value(a), value):
        return forwardable(ctx, node, b) or b
    return f"no operand is a constant {value}"


def _forward(graph: Graph, node: Node, x: Value) -> Value:
    return x


# -- involutions and select -------------------------------------------------------

def check_involution(node: Node, ctx: Context):
    p = node.inputs[0].producer
    if p is None or p.op != node.op:
        return f"the operand is not itself a {node.op}"
    return forwardable(ctx, node, p.inputs[0]) or p.inputs[0]


def check_select(node: Node, ctx: Context):
    cond, a, b = node.inputs
    c = const_value(cond)
    if a is b:
        pick = a
    elif _all(c, True):
        pick = a
    elif _all(c, False):
        pick = b
    else:
        return "the condition is not a uniform constant and the branches differ"
    return forwardable(ctx, node, pick) or pick


# -- casts --------------------------------------------------------------------------

# significand bits of each float type: integers below 2**bits convert exactly
_MANTISSA = {"f16": 11, "bf16": 8, "f32": 24, "f64": 53}
# float widenings that keep every value (range and precision both grow)
_FLOAT_WIDENINGS = {("f16", "f32"), ("f16", "f64"), ("bf16", "f32"), ("bf16", "f64"),
                    ("f32", "f64")}


def _value_bits(dtype: str) -> int:
    bits = 8 * dtypes.itemsize(dtype)
    return bits - 1 if dtype in dtypes.SIGNED else bits


def lossless(src: str, dst: str) -> bool:
    """Does every value of dtype `src` convert to `dst` exactly? (bool -> anything does)"""
    if src == dst or src == "bool":
        return dst in dtypes.SCALARS
    if src in dtypes.FLOATS:
        return (src, dst) in _FLOAT_WIDENINGS
    if src not in dtypes.INTEGERS:
        return False
    if dst in dtypes.FLOATS:
        return _value_bits(src) <= _MANTISSA[dst]
    if dst not in dtypes.INTEGERS or (src in dtypes.SIGNED and dst in dtypes.UNSIGNED):
        return False
    return _value_bits(src) <= _value_bits(dst)


def check_cast_noop(node: Node, ctx: Context):
    x = node.inputs[0]
    if x.dtype != node.attrs["to"]:
        return f"cast from {x.dtype} to {node.attrs['to']} changes values"
    return forwardable(ctx, node, x) or x


def check_cast_chain(node: Node, ctx: Context):
    p = node.inputs[0].producer
    if p is None or p.op != "cast":
        return "the operand is not itself a cast"
    if not lossless(p.inputs[0].dtype, p.outputs[0].dtype):
        return f"the inner cast {p.inputs[0].dtype} -> {p.outputs[0].dtype} may lose information"
    return p.inputs[0]


def _rebase(graph: Graph, node: Node, x: Value) -> None:
    graph.set_input(node, 0, x)


# -- movement -------------------------------------------------------------------------

def _noop_movement(node: Node) -> bool:
    a = node.attrs
    if node.op in ("reshape", "broadcast"):
        return True  # with equal types, the shape is x's own
    if node.op == "transpose":
        return list(a["perm"]) == list(range(len(a["perm"])))
    if node.op == "slice":
        return all(s == 0 for s in a["starts"]) and all(st == 1 for st in a["steps"])
    if node.op == "pad":
        return not any(a["pads"])
    if node.op == "concat":
        return len(node.inputs) == 1
    return not a["axes"]  # reductions


def check_noop(node: Node, ctx: Context):
    x = node.inputs[0]
    if node.outputs[0].type != x.type or not _noop_movement(node):
        return f"this {node.op} moves or changes data"
    return forwardable(ctx, node, x) or x


def check_compose(node: Node, ctx: Context):
    p = node.inputs[0].producer
    if p is None or p.op != node.op:
        return f"the operand is not itself a {node.op}"
    return p


def rewrite_compose(graph: Graph, node: Node, inner: Node) -> None:
    a, b = inner.attrs, node.attrs
    if node.op == "transpose":
        node.attrs = {"perm": tuple(a["perm"][q] for q in b["perm"])}
    elif node.op == "slice":
        node.attrs = {"starts": tuple(s + o * st for s, o, st in
                                      zip(a["starts"], b["starts"], a["steps"])),
                      "steps": tuple(s * t for s, t in zip(a["steps"], b["steps"])),
                      "sizes": b["sizes"]}
    graph.set_input(node, 0, inner.inputs[0])  # reshape and broadcast keep their outer shape


def check_transpose_as_reshape(node: Node, ctx: Context):
    shape, perm = node.inputs[0].shape, node.attrs["perm"]
    moved = [p for p in perm if shape[p] != 1]
    if moved != sorted(moved):
        return "the transpose reorders dimensions larger than 1"
    return node.outputs[0].shape


def check_unit_reduce(node: Node, ctx: Context):
    x = node.inputs[0]
    if not node.attrs["axes"] or any(x.shape[a] != 1 for a in node.attrs["axes"]):
        return "it reduces over a dimension larger than 1 (or over none)"
    return node.outputs[0].shape


def _as_reshape(graph: Graph, node: Node, shape: tuple) -> None:
    node.op = "reshape"
    node.attrs = {"shape": tuple(shape)}


def check_div_by_constant(node: Node, ctx: Context):
    c = const_value(node.inputs[1])
    if node.outputs[0].dtype not in ("f32", "f64") or c is None or c.size != 1:
        return "not a float divided by one constant"
    value = float(c.reshape(-1)[0])
    if value == 0 or not np.isfinite(value):
        return "the divisor is 0 or not finite"
    if not _power_of_two(value):
        return "1/c is not exact (x * (1/c) could differ from x / c in the last bit)"
    return np.asarray(1.0 / value, dtype=c.dtype)


def _power_of_two(v: float) -> bool:
    """Whether |v| = 2^k: then 1/v is exact and x * (1/v) rounds the same value as x / v."""
    m, _ = np.frexp(abs(v))
    return m == 0.5


def rewrite_div_by_constant(graph: Graph, node: Node, inv) -> None:
    node.op = "mul"
    graph.set_input(node, 1, new_const(graph, node, inv, "inverse"))


# pow exponents rewritten into multiplies (see the module docstring): beyond 4 the
# product rounds more times than a libm pow's one ulp would allow for.
POW_AS_MULTIPLIES = (2.0, 3.0, 4.0)


def check_pow_by_small_integer(node: Node, ctx: Context):
    c = const_value(node.inputs[1])
    x = node.inputs[0]
    if x.dtype not in dtypes.FLOATS or c is None or c.size != 1:
        return "not a float raised to one constant"
    if node.outputs[0].type != x.type:
        return "the exponent broadcasts the result to another shape"
    value = float(c.reshape(-1)[0])
    if value not in POW_AS_MULTIPLIES and value != -1.0:
        return f"exponent {value} is not one of {POW_AS_MULTIPLIES} or -1"
    return value


def rewrite_pow_by_small_integer(graph: Graph, node: Node, exponent: float) -> Value:
    x = node.inputs[0]
    at = graph.nodes.index(node)

    def mul(a: Value, b: Value, hint: str) -> Value:
        nonlocal at
        out = graph.add_node("mul", [a, b], out_names=[hint], index=at).output
        at += 1
        return out

    if exponent == -1.0:
        one = new_const(graph, node, np.ones((), dtype=dtypes.to_numpy(x.dtype)), "one")
        return graph.add_node("div", [one, x], out_names=["reciprocal"],
                              index=graph.nodes.index(node)).output
    square = mul(x, x, "square")
    if exponent == 2.0:
        return square
    return mul(square, x if exponent == 3.0 else square, "power")


def check_erf_of_quotient(node: Node, ctx: Context):
    p = node.inputs[0].producer
    if node.outputs[0].dtype not in ("f32", "f64") or p is None or p.op != "div":
        return "erf of something other than a float quotient"
    c = const_value(p.inputs[1])
    if c is None or c.size != 1 or p.outputs[0].type != p.inputs[0].type:
        return "the divisor is not one constant (or it broadcasts the quotient)"
    value = float(c.reshape(-1)[0])
    if value == 0 or not np.isfinite(value):
        return "the divisor is 0 or not finite"
    why = ctx.sole_reader(p.outputs[0])
    if why is not None:
        return why
    return p, np.asarray(1.0 / value, dtype=c.dtype)


def rewrite_erf_of_quotient(graph: Graph, node: Node, match) -> None:
    div, inv = match
    div.op = "mul"
    graph.set_input(div, 1, new_const(graph, div, inv, "inverse"))


def check_unit_batch_weight(node: Node, ctx: Context):
    """A matmul whose constant right operand has batch dims of 1 only, no more of them
    than its left operand has: the same product with that operand 2-d (the packed GEMM's
    form). aten's einsum writes XLNet's projections this way: (1, 1024, 1024) weights,
    which ran as run-time-packed batched products."""
    a, w = node.inputs
    c = const_value(w)
    if c is None or c.ndim <= 2 or any(d != 1 for d in c.shape[:-2]):
        return "right operand is no constant with unit batch dims"
    if c.ndim > len(a.shape):
        return "the weight's unit dims add dims to the product"
    return c.reshape(c.shape[-2:])


def rewrite_unit_batch_weight(graph: Graph, node: Node, w2) -> None:
    graph.set_input(node, 1, new_const(graph, node, w2, "weight_2d"))


# -- constant gathers ----------------------------------------------------------------

# A constant gather becomes a concat of slices where its index's consecutive runs are at
# least this long on average, and there are at most MAX_GATHER_RUNS of them.
MIN_GATHER_RUN = 8
MAX_GATHER_RUNS = 1024
# How deep _pieces looks through nested concats and slices.
MAX_PIECE_DEPTH = 8


def _pieces(v: Value, depth: int = 0) -> list[tuple[Value, int, int]]:
    """1-d v as consecutive pieces (value, start, length): through concats along axis 0
    and unit-step slices, down to the values they are made of."""
    p = v.producer
    if p is not None and depth < MAX_PIECE_DEPTH and len(v.shape) == 1:
        if p.op == "concat":
            return [piece for u in p.inputs for piece in _pieces(u, depth + 1)]
        if p.op == "slice" and p.attrs["steps"][0] == 1:
            lo, n = p.attrs["starts"][0], p.attrs["sizes"][0]
            out, at = [], 0
            for u, start, size in _pieces(p.inputs[0], depth + 1):
                a, b = max(lo, at), min(lo + n, at + size)
                if a < b:
                    out.append((u, start + a - at, b - a))
                at += size
            return out
    return [(v, 0, v.shape[0])]


def check_constant_gather(node: Node, ctx: Context):
    data, index = node.inputs
    c = const_value(index)
    if node.attrs["axis"] != 0 or len(data.shape) != 1 or c is None or c.ndim != 1 \
            or c.dtype.kind not in "iu" or c.size == 0:
        return "not a gather of 1-d data by a constant 1-d index"
    n = data.shape[0]
    idx = np.where(c < 0, c + n, c).astype(np.int64)
    if idx.min() < 0 or idx.max() >= n:
        return "an index is out of range (the gather reports it at run time)"
    pieces = _pieces(data)
    ends = np.cumsum([size for _, _, size in pieces])
    which = np.searchsorted(ends, idx, side="right")
    breaks = np.flatnonzero((np.diff(idx) != 1) | (np.diff(which) != 0)) + 1
    runs = len(breaks) + 1
    if runs > MAX_GATHER_RUNS or runs * MIN_GATHER_RUN > idx.size:
        rows = _periodic_runs(idx, which, breaks, pieces, ends)
        if rows is not None:
            return rows
        return f"{runs} runs of consecutive indices over {idx.size}: too short to slice"
    out = []
    for a, b in zip(np.concatenate([[0], breaks]), np.concatenate([breaks, [idx.size]])):
        k = int(which[a])
        u, start, _ = pieces[k]
        at = int(ends[k]) - pieces[k][2]
        out.append((u, start + int(idx[a]) - at, int(b - a)))
    if len(out) == 1 and out[0][1] == 0 and out[0][2] == out[0][0].shape[0]:
        return forwardable(ctx, node, out[0][0]) or out
    return out


# Row lengths tried for a periodic index (the first breaks between its runs), and the
# most column stretches a row may have.
PERIODIC_CANDIDATES = 16
PERIODIC_MAX_SEGMENTS = 64


@dataclass(frozen=True)
class _Stretch:
    """Columns [c0, c0 + width) of every row of a periodic gather: row r reads
    piece[start + r * step + j] for j < width."""

    piece: Value
    start: int
    step: int
    width: int


def _periodic_runs(idx: np.ndarray, which: np.ndarray, breaks: np.ndarray, pieces,
                   ends) -> tuple[int, list[_Stretch]] | None:
    """(rows, stretches) when idx, cut into rows of one length, repeats one pattern of
    stretches row after row, each stretch moving by its own step per row (torch's
    x[..., :k] *= m on a view: the scatter of a strided view writes a stretch of each row
    of x's storage and keeps the rest); else None. Then the gather is one concat of 2-d
    strided views of its pieces along the rows, whatever the number of rows."""
    n = idx.size
    if not len(breaks):
        return None
    early = breaks[:PERIODIC_CANDIDATES]
    # a row ends at a break, or (where a run goes on across rows) is the distance from
    # the first break to a later one
    for length in dict.fromkeys(int(b) for b in np.concatenate([early, early[1:] - early[0]])):
        if n % length or n // length < 2:
            continue
        rows = n // length
        grid, owner = idx.reshape(rows, length), which.reshape(rows, length)
        step = grid[1] - grid[0]
        if not (owner == owner[0]).all() or not (np.diff(grid, axis=0) == step).all():
            continue
        first = grid[0]
        cut = np.flatnonzero((np.diff(first) != 1) | (np.diff(owner[0]) != 0)
                             | (np.diff(step) != 0)) + 1
        if (len(cut) + 1) > PERIODIC_MAX_SEGMENTS or (len(cut) + 1) * MIN_GATHER_RUN > length:
            continue
        stretches = []
        for a, b in zip(np.concatenate([[0], cut]), np.concatenate([cut, [length]])):
            k = int(owner[0][a])
            u, start, size = pieces[k]
            at = int(ends[k]) - size
            d, w = int(step[a]), int(b - a)
            if d < w:  # rows that overlap or run backwards: no 2-d view
                break
            stretches.append(_Stretch(u, start + int(first[a]) - at, d, w))
        else:
            return rows, stretches
    return None


def _strided_rows(graph: Graph, at: int, s: _Stretch, rows: int) -> tuple[Value, int]:
    """s as a (rows, width) value: its piece reshaped to rows of `step` (padded or cut to
    whole rows), then sliced. Returns it and the next free node index."""
    q, c = divmod(s.start, s.step)
    u = s.piece
    need, have = (q + rows) * s.step, u.shape[0]

    def add(op, x, **attrs):
        nonlocal at
        at += 1
        return graph.add_node(op, [x], attrs, index=at - 1).output

    if c + s.width > s.step:  # the stretch wraps into the next row: start rows at it
        q, c = 0, 0
        u = add("slice", u, starts=(s.start,), steps=(1,), sizes=(have - s.start,))
        need, have = rows * s.step, have - s.start
    if need > have:
        u = add("pad", u, pads=(0, need - have), mode="constant", value=0.0)
    elif need < have:
        u = add("slice", u, starts=(0,), steps=(1,), sizes=(need,))
    x = add("reshape", u, shape=(q + rows, s.step))
    if (q, c, rows, s.width) != (0, 0, q + rows, s.step):
        x = add("slice", x, starts=(q, c), steps=(1, 1), sizes=(rows, s.width))
    return x, at


def rewrite_constant_gather(graph: Graph, node: Node, runs) -> Value:
    at = graph.nodes.index(node)  # new nodes go just before the gather, in order
    if isinstance(runs, tuple):  # periodic: rows of strided stretches
        rows, stretches = runs
        parts = []
        for s in stretches:
            x, at = _strided_rows(graph, at, s, rows)
            parts.append(x)
        grid = parts[0] if len(parts) == 1 else \
            graph.add_node("concat", parts, {"axis": 1}, index=at).output
        at += len(parts) > 1
        return graph.add_node("reshape", [grid], {"shape": tuple(node.outputs[0].shape)},
                              index=at).output
    parts = []
    for u, start, size in runs:
        if start == 0 and size == u.shape[0]:
            parts.append(u)
            continue
        parts.append(graph.add_node("slice", [u], {"starts": (start,), "steps": (1,),
                                                   "sizes": (size,)}, index=at).output)
        at += 1
    if len(parts) == 1:
        return parts[0]
    return graph.add_node("concat", parts, {"axis": 0}, index=at).output


RULES = [
    Rule("constant_gather", frozenset({"gather"}), check_constant_gather,
         rewrite_constant_gather),
    Rule("unit_batch_weight", frozenset({"matmul"}), check_unit_batch_weight,
         rewrite_unit_batch_weight),
    Rule("erf_of_quotient", frozenset({"erf"}), check_erf_of_quotient,
         rewrite_erf_of_quotient),
    Rule("pow_by_small_integer", frozenset({"pow"}), check_pow_by_small_integer,
         rewrite_pow_by_small_integer),
    Rule("div_by_constant", frozenset({"div"}), check_div_by_constant, rewrite_div_by_constant),
    Rule("neutral_operand", frozenset(_NEUTRAL), check_neutral, _forward),
    Rule("involution", frozenset({"neg", "not"}), check_involution, _forward),
    Rule("select_constant", frozenset({"select"}), check_select, _forward),
    Rule("cast_noop", frozenset({"cast"}), check_cast_noop, _forward),
    Rule("cast_chain", frozenset({"cast"}), check_cast_chain, _rebase),
    Rule("noop_movement", frozenset({"reshape", "broadcast", "transpose", "slice", "pad",
                                     "concat", *REDUCE}), check_noop, _forward),
    Rule("compose_movement", frozenset({"reshape", "transpose", "broadcast", "slice"}),
         check_compose, rewrite_compose),
    Rule("transpose_as_reshape", frozenset({"transpose"}), check_transpose_as_reshape,
         _as_reshape),
    Rule("unit_reduce_as_reshape", frozenset(REDUCE), check_unit_reduce, _as_reshape),
]
assert set(_NEUTRAL) <= set(BINARY)


def simplify_identities(graph: Graph) -> bool:
    """Apply the identity rules of the module docstring (one sweep)."""
    return apply_rules(graph, RULES)
