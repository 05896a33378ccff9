"""Recognize decomposed attention and make it one `attention` node (kernels/attention.py).

Pattern, rooted at the second matmul (the importers' softmax is max, sub, exp, sum, div):

    s  = f(matmul(c_q * Q, c_k * KT))        f: scalar mul/div by constants, additive
                                             masks (add M), boolean masks (select(C, s,
                                             fill) or select(C, fill, s)), in any order
    P  = exp(s - max(s)) / sum(exp(s - max(s)))      (max and sum over the last axis)
    O  = matmul(P, V)

  ->  O = attention(Q, transpose(KT), V, mask) {scale = c, causal = false}

c_q * Q (and c_k * KT) may also reach the matmul through a reshape that keeps the last two
dims (aten's N-d matmul merges the batch dims of a scaled q): Q is then reshaped itself.
The softmax may be taken between two such reshapes, P reaching the matmul through one and
s reached from the scores through the other (aten's einsum: batches merged for the
products, the model's dims for the softmax): the same rows, so the same attention.
The second product may also come as O^T = X P^T (P^T a transpose of the last two dims,
read only there: a diffusion UNet's attention over pixels, V @ A^T): then V = X^T and the
node's output is transposed back.

Maths. Walking down from s, let g be the product of the scalar factors met so far (g = 1
at s). A factor c below multiplies g by c (1/c for div). An `add M` at factor g
contributes g * M to s, a boolean select contributes g * select(C, 0, fill) (fill from
the untaken branch: it replaces s where C says so; g * fill is still -inf for a -inf
fill, and a finite fill times g is what s held there). At the matmul, s = g * (Q KT) +
sum of the mask terms, and c_q, c_k fold into g: scale = g, mask = the sum. The softmax
is the numerically stable one, which the kernel computes exactly in real arithmetic.
A constant mask term that is exactly the causal mask (0 on and below the diagonal, -inf
above: what exporters write for is_causal) becomes the node's causal flag, so the kernel
reads no mask and skips the key tiles above the diagonal.

Every value between the matmuls must be read only inside the pattern (an attention
whose weights are also returned, as nn.MultiheadAttention's need_weights, stays
decomposed), batch dims of Q, KT and V must be equal (no broadcast, no GQA), the dtype
float32 with a fill that is a scalar constant, and the kernel must accept the shapes
(`attention.refusal_for`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from compiler.ir import Graph, Node, Value
from compiler.ops import Family
from compiler.passes.rules import Context, Rule, apply_rules, const_value, new_const


@dataclass
class Match:
    q: Value
    kt: Value
    v: Value
    scale: float
    masks: list = field(default_factory=list)  # (kind, values, factor) per mask term
    # per operand (q, kt): the shape it is reshaped to first (None: used as it is)
    shapes: list = field(default_factory=lambda: [None, None])
    # O^T = X P^T was matched (v is then X, transposed by the rewrite, and so is O)
    transposed: bool = False

    def shape(self, side: int) -> tuple:
        return self.shapes[side] or (self.q, self.kt)[side].shape


def _scalar(v: Value) -> float | None:
    a = const_value(v)
    return float(a.reshape(-1)[0]) if a is not None and a.size == 1 else None


def _softmax_input(p: Value, ctx: Context) -> Value | str:
    """s where p = exp(s - max(s)) / sum(exp(s - max(s))) over the last axis."""
    d = p.producer
    if d is None or d.op != "div":
        return "not a softmax (no div)"
    e, total = d.inputs
    rank = len(p.shape)
    last = (rank - 1,)
    if not _reduces(total, "reduce_sum", e, last) or e.producer is None or e.producer.op != "exp":
        return "not a softmax (div by a last-axis sum of its numerator)"
    z = e.producer.inputs[0]
    if z.producer is None or z.producer.op != "sub":
        return "not a softmax (exp of no sub)"
    s, mx = z.producer.inputs
    if not _reduces(mx, "reduce_max", s, last):
        return "not a softmax (sub of no last-axis max)"
    for v, n in ((p, 1), (total, 1), (e, 2), (z, 1), (mx, 1), (s, 2)):
        if ctx.is_output(v) or len(ctx.readers(v)) != n:
            return f"%{v.name} is read outside the softmax (e.g. attention weights returned)"
    return s


def _reduces(v: Value, op: str, x: Value, axes: tuple) -> bool:
    p = v.producer
    return (p is not None and p.op == op and p.inputs[0] is x and
            tuple(p.attrs["axes"]) == axes and v.shape == x.shape[:-1] + (1,))


def _scores(s: Value, ctx: Context) -> Match | str:
    """Walk from the scores down to the first matmul, collecting the factor and masks."""
    g, masks = 1.0, []
    v = s
    while True:
        p = v.producer
        if p is None:
            return f"%{v.name} is no product of Q and K"
        if v is not s and (ctx.is_output(v) or len(ctx.readers(v)) != 1):
            return f"%{v.name} is read outside the attention"
        if p.op == "matmul":
            return _at_matmul(p, g, masks, ctx)
        step = _step(p, v, g)
        if isinstance(step, str):
            return step
        v, g, term = step
        if term is not None:
            masks.append(term)


def _step(p: Node, v: Value, g: float):
    """(next value down, new factor, mask term or None) for one op of the score chain."""
    if p.op in ("mul", "div"):
        a, b = p.inputs
        c = _scalar(b)
        if c is None and p.op == "mul":
            a, c = b, _scalar(a)
        if c is None or c == 0:
            return f"{p.op} by a non-constant or zero"
        return a, g * c if p.op == "mul" else g / c, None
    if p.op == "add":
        a, b = p.inputs
        x, m = (a, b) if a.shape == v.shape and _leads_to_matmul(a) else (b, a)
        return x, g, ("add", [m], g)
    if p.op == "select":
        c, a, b = p.inputs
        for x, fill, keep_on in ((a, b, True), (b, a, False)):
            f = _scalar(fill)
            if f is not None and x.shape == v.shape and _leads_to_matmul(x):
                return x, g, ("select", [c], (g, f, keep_on))
        return "select whose untaken branch is no scalar constant"
    return f"{p.op} in the scores"


def _leads_to_matmul(v: Value) -> bool:
    """Whether the score chain continues through v (ops of the chain down to a matmul)."""
    for _ in range(16):
        p = v.producer
        if p is None or p.op not in ("matmul", "mul", "div", "add", "select"):
            return False
        if p.op == "matmul":
            return True
        v = next((u for u in p.inputs if u.shape == v.shape and u.producer is not None
                  and u.producer.op != "const"), None)
        if v is None:
            return False
    return False


def _at_matmul(mm: Node, g: float, masks: list, ctx: Context) -> Match | str:
    m = Match(*mm.inputs, None, g, masks)
    for side in (0, 1):
        found = _unscaled(mm.inputs[side], ctx)
        if found is not None:
            x, c, m.shapes[side] = found
            m.scale *= c
            m.q, m.kt = (x, m.kt) if side == 0 else (m.q, x)
    return m


def _unscaled(u: Value, ctx: Context):
    """(x, c, shape) where the operand u is c * x, or a reshape to `shape` of c * x that
    keeps the last two dims (aten's N-d matmul merges batch dims around a scaled q), c a
    scalar constant, each value read only here; else None."""
    shape = None
    p = u.producer
    if p is not None and p.op == "reshape" and _only_here(u, ctx):
        if p.inputs[0].shape[-2:] != u.shape[-2:]:
            return None
        shape, u = u.shape, p.inputs[0]
        p = u.producer
    if p is None or p.op != "mul" or not _only_here(u, ctx):
        return None
    for x, c in ((p.inputs[0], p.inputs[1]), (p.inputs[1], p.inputs[0])):
        f = _scalar(c)
        if f is not None and x.shape == u.shape:
            return x, f, shape
    return None


def _regroups_batch(u: Value) -> bool:
    """Whether u is a reshape that only regroups batch dims (its last two dims kept):
    aten's einsum and N-d matmul compute on 3-d batches around a softmax taken on the
    model's own dims (MaxViT: scores (32, 49, 49) viewed as (1, 4, 8, 49, 49) for the
    softmax, and back), the same softmax over the same rows."""
    p = u.producer
    return (p is not None and p.op == "reshape" and len(u.shape) >= 2
            and len(p.inputs[0].shape) >= 2 and p.inputs[0].shape[-2:] == u.shape[-2:])


def _only_here(u: Value, ctx: Context) -> bool:
    return len(ctx.readers(u)) == 1 and not ctx.is_output(u)


def check(node: Node, ctx: Context) -> Match | str:
    found = _check(node, ctx, False)
    if isinstance(found, str) and _swaps_last_two(node.inputs[1]) and \
            _only_here(node.inputs[1], ctx):
        # X P^T: the attention's output transposed (O^T = X P^T, V = X^T)
        swapped = _check(node, ctx, True)
        if not isinstance(swapped, str):
            return swapped
    return found


def _check(node: Node, ctx: Context, transposed: bool) -> Match | str:
    from compiler.kernels import attention

    p, v = node.inputs
    if transposed:
        p, v = v.producer.inputs[0], p
    if _regroups_batch(p) and _only_here(p, ctx):
        p = p.producer.inputs[0]
    s = _softmax_input(p, ctx)
    if isinstance(s, str):
        return s
    if _regroups_batch(s) and _only_here(s.producer.inputs[0], ctx):
        s = s.producer.inputs[0]
    m = _scores(s, ctx)
    if isinstance(m, str):
        return m
    m.v, m.transposed = v, transposed
    if transposed and (len(v.shape) < 2 or v.shape[-1] != p.shape[-1]):
        return "X P^T whose X is no V^T"
    qs, kts = m.shape(0), m.shape(1)
    if not m.kt.type.static or len(qs) < 2 or len({qs[:-2], kts[:-2], v.shape[:-2]}) != 1:
        return f"batch dims {qs[:-2]}, {kts[:-2]}, {v.shape[:-2]} differ"
    if m.q.dtype != "f32":
        return f"dtype {m.q.dtype}: fused attention is float32"
    vs = v.shape[:-2] + (v.shape[-1], v.shape[-2]) if transposed else v.shape
    if transposed and (len({qs[:-2], vs[:-2]}) != 1 or vs[-2] != kts[-1]):
        return f"X P^T with X {v.shape}: not the values of {kts[-1]} keys"
    reason = _mask_refusal(m, s) or attention.refusal_for(m.q, vs, m.kt.shape[-1])
    return reason if reason is not None else m


def _swaps_last_two(u: Value) -> bool:
    """Whether u is a transpose that swaps its last two dims only."""
    p = u.producer
    if p is None or p.op != "transpose" or len(u.shape) < 2:
        return False
    r = len(u.shape)
    return tuple(p.attrs["perm"]) == tuple(range(r - 2)) + (r - 1, r - 2)


def _mask_refusal(m: Match, s: Value) -> str | None:
    """Why the mask terms cannot be summed into one additive mask of the scores, if so."""
    for kind, values, extra in m.masks:
        u = values[0]
        try:
            fits = u.type.static and np.broadcast_shapes(u.shape, s.shape) == s.shape
        except ValueError:
            fits = False
        if not fits or len(u.shape) > len(s.shape):
            return f"mask %{u.name} {u.shape} does not broadcast to the scores {s.shape}"
        if kind == "add" and u.dtype != "f32":
            return f"additive mask of dtype {u.dtype}"
        if kind == "select" and (u.dtype != "bool" or extra[1] != -np.inf or extra[0] <= 0):
            return ("boolean mask that is not a -inf fill under a positive scale (only "
                    "then is it an additive mask)")
    return None


# Nodes evaluated at most to see whether a mask computed from constants only is the
# causal one (fold_constants leaves such chains unfolded when they outgrow their inputs:
# Trilu and Where over an expanded scalar, as exporters write is_causal).
MASK_EVAL_NODES = 64


def _constant_array(v: Value, memo: dict) -> np.ndarray | None:
    """v's value when it is computed from constants alone (within MASK_EVAL_NODES)."""
    if v in memo:
        return memo[v]
    p = v.producer
    if p is None or p.opdef.family is Family.HOST or p.opdef.eval_fn is None or len(memo) > MASK_EVAL_NODES:
        return None
    if p.op == "const":
        memo[v] = np.asarray(p.attrs["value"])
        return memo[v]
    args = [_constant_array(u, memo) for u in p.inputs]
    if any(a is None for a in args):
        return None
    memo[v] = p.opdef.evaluate(p, args)[p.outputs.index(v)]
    return memo[v]


def is_causal_mask(u: Value, t: int, keys: int) -> bool:
    """Whether `u`, computed from constants alone, is the causal mask of t queries and
    `keys` keys: 0 where key j <= query i, -inf above (leading dims of size 1)."""
    if u.shape[-2:] != (t, keys) or u.type.size != t * keys:
        return False
    a = _constant_array(u, {})
    if a is None:
        return False
    keep = np.tril(np.ones((t, keys), bool))
    a = a.reshape(t, keys)
    return bool(np.all(a[keep] == 0) and np.all(np.isneginf(a[~keep])))


def rewrite(graph: Graph, node: Node, m: Match) -> Value:
    t, keys = m.q.shape[-2], m.kt.shape[-1]
    causal = [term for term in m.masks if term[0] == "add" and term[2] > 0
              and is_causal_mask(term[1][0], t, keys)][:1]
    m.masks = [term for term in m.masks if term not in causal]
    q, kt = (_reshaped(graph, node, v, s) for v, s in zip((m.q, m.kt), m.shapes))
    at = graph.nodes.index(node)
    rank = len(q.shape)
    perm = list(range(rank - 2)) + [rank - 1, rank - 2]
    k = graph.add_node("transpose", [kt], {"perm": perm}, name="attn_k", index=at).output
    v = m.v
    if m.transposed:
        v = graph.add_node("transpose", [v], {"perm": perm}, name="attn_v", index=at).output
    inputs = [q, k, v]
    mask = _mask(graph, node, m)
    if mask is not None:
        inputs.append(mask)
    at = graph.nodes.index(node)
    out = graph.add_node("attention", inputs, {"scale": m.scale, "causal": bool(causal)},
                         name="attention", index=at).output
    if m.transposed:
        out = graph.add_node("transpose", [out], {"perm": perm}, name="attn_out",
                             index=graph.nodes.index(node)).output
    return out


def _reshaped(graph: Graph, node: Node, v: Value, shape) -> Value:
    if shape is None or tuple(shape) == v.shape:
        return v
    return graph.add_node("reshape", [v], {"shape": tuple(shape)}, name="attn_operand",
                          index=graph.nodes.index(node)).output


def _mask(graph: Graph, node: Node, m: Match) -> Value | None:
    """The sum of the mask terms (each times its factor), built before `node`."""
    total = None
    for kind, values, extra in m.masks:
        if kind == "add":
            term = values[0]
            if extra != 1.0:
                c = new_const(graph, node, np.array(extra, np.float32), "attn_f")
                term = _op(graph, node, "mul", term, c)
        else:
            g, fill, keep_on = extra
            zero = new_const(graph, node, np.array(0.0, np.float32), "attn_zero")
            filled = new_const(graph, node, np.array(g * fill, np.float32), "attn_fill")
            args = [values[0], zero, filled] if keep_on else [values[0], filled, zero]
            term = _op(graph, node, "select", *args)
        total = term if total is None else _op(graph, node, "add", total, term)
    return total


def _op(graph: Graph, before: Node, op: str, *inputs: Value) -> Value:
    return graph.add_node(op, list(inputs), {}, name="attn_mask",
                          index=graph.nodes.index(before)).output


RULES = [Rule("fuse_attention", frozenset({"matmul"}), check, rewrite)]


def fuse_attention(graph: Graph) -> bool:
    """matmul(softmax(scaled, masked Q x K^T), V) -> one attention node."""
    return apply_rules(graph, RULES)
