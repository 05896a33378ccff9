"""ONNX Einsum as transposes, sums and batched matmuls (no op of its own in the IR).

An equation names each operand's dims with letters ("bhid,bhjd->bhij"). Operands are
contracted left to right, two at a time. For a pair, each letter is one of:
  batch      in both operands and still needed (in the output or a later operand);
  contracted in both, needed by nothing after: summed by the matmul (K);
  free       in one operand only and needed after (M on the left, N on the right);
  summed     in one operand only and needed by nothing after: reduce_sum first.
Then A is transposed to [batch, free_a, contracted] and reshaped to [B..., M, K], B to
[batch, contracted, free_b] -> [B..., K, N], one matmul, and the product is reshaped to
its letters and transposed into the output's order. With no contracted letter K is 1
(an outer product). One operand: sums, then a transpose. The matmul reaches the passes
as any other (the packed GEMM for a constant 2-d right operand, the batched GEMM for run-
time operands, attention when the pattern around it is one).

A letter repeated within one operand ("ii->i", "...ii->...i", "ii->" a trace) first takes
that operand's diagonal: the two dims moved last and flattened (n * n), then one slice
of step n + 1 reads x[..., i, i]; the diagonal keeps the letter once, at the end, and
the operand goes on as any other (a trace is then a sum like any unused letter).

Refused (the node runs on the host): an ellipsis whose dims differ between operands
(broadcasting), and letters of equal name with different sizes.
"""

from __future__ import annotations

import math
import string

from compiler.errors import InvalidModelError
from importers.onnx_ops import Fallback, converter
from importers.onnx_ops.context import NodeContext

def parse(equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """Each operand's letters and the output's, the ellipsis spelled out in letters the
    equation does not use (right-aligned across operands, as numpy aligns broadcast
    dims)."""
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise InvalidModelError(f"einsum equation {equation!r} names {len(terms)} operands, "
                                f"the node has {len(ranks)}")
    widest = max((r - len(t.replace("...", "")) for t, r in zip(terms, ranks) if "..." in t),
                 default=0)
    dots = "".join(c for c in string.ascii_letters if c not in eq)[:widest]
    if len(dots) != widest:
        raise Fallback("an ellipsis wider than the letters left unused")
    spelled = []
    for t, r in zip(terms, ranks):
        if "..." in t:
            n = r - len(t.replace("...", ""))
            if n < 0:
                raise InvalidModelError(f"einsum term {t!r} has more letters than rank {r}")
            t = t.replace("...", dots[widest - n:])
        if len(t) != r or (t and not t.isalpha()):
            raise InvalidModelError(f"einsum term {t!r} does not name the {r} dims of its "
                                    "operand")
        spelled.append(t)
    if arrow:
        out = out.replace("...", dots)
    else:  # implicit output: the ellipsis, then the letters used once, alphabetically
        counts = "".join(spelled)
        out = dots + "".join(sorted(c for c in set(counts) if c not in dots
                                    and counts.count(c) == 1))
    if not out.isalpha() and out:
        raise InvalidModelError(f"einsum output {out!r} is not a list of letters")
    return spelled, out


def diagonal(cx: NodeContext, v, term: str) -> tuple:
    """v with every letter repeated in `term` reduced to its diagonal; (value, letters,
    each once). InvalidModelError when a repeated letter names dims of different sizes."""
    while len(set(term)) != len(term):
        c = next(c for c in term if term.count(c) > 1)
        p, q = term.index(c), term.index(c, term.index(c) + 1)
        n = v.shape[p]
        if v.shape[q] != n:
            raise InvalidModelError(f"{cx.describe}: letter {c!r} repeated in {term!r} names "
                                    f"dims of sizes {n} and {v.shape[q]}")
        rest = [i for i in range(len(term)) if i not in (p, q)]
        v = cx.reshape(cx.transpose(v, rest + [p, q]), [v.shape[i] for i in rest] + [n * n])
        v = cx.op("slice", v, starts=(0,) * v.type.rank, steps=(1,) * len(rest) + (n + 1,),
                  sizes=v.shape[:-1] + (n,))
        term = "".join(term[i] for i in rest) + c
    return v, term


def sizes_of(terms: list[str], shapes: list[tuple]) -> dict[str, int]:
    """Each letter's size (terms with no repeated letter); Fallback when two operands give
    a letter different sizes (broadcasting)."""
    sizes: dict[str, int] = {}
    for t, shape in zip(terms, shapes):
        for c, d in zip(t, shape):
            if sizes.setdefault(c, d) != d:
                raise Fallback(f"letter {c!r} has sizes {sizes[c]} and {d} (broadcasting)")
    return sizes


def sum_out(cx: NodeContext, v, term: str, keep: set) -> tuple:
    """v with the letters not in `keep` summed away; (value, its remaining letters)."""
    axes = [i for i, c in enumerate(term) if c not in keep]
    if not axes:
        return v, term
    return cx.reduce("sum", v, axes, keepdims=False), "".join(c for c in term if c in keep)


def contract(cx: NodeContext, a, ta: str, b, tb: str, keep: set, sizes: dict) -> tuple:
    """The product of two operands with every letter not in `keep` summed: (value,
    letters: batch, free of a, free of b)."""
    a, ta = sum_out(cx, a, ta, keep | set(tb))
    b, tb = sum_out(cx, b, tb, keep | set(ta))
    batch = [c for c in ta if c in tb and c in keep]
    con = [c for c in ta if c in tb and c not in keep]
    fa = [c for c in ta if c not in tb]
    fb = [c for c in tb if c not in ta]

    def prod(letters):
        return math.prod(sizes[c] for c in letters)

    bsz = [sizes[c] for c in batch]
    a2 = cx.transpose(a, [ta.index(c) for c in batch + fa + con])
    a2 = cx.reshape(a2, bsz + [prod(fa), prod(con)])
    b2 = cx.transpose(b, [tb.index(c) for c in batch + con + fb])
    b2 = cx.reshape(b2, bsz + [prod(con), prod(fb)])
    y = cx.op("matmul", a2, b2)
    letters = "".join(batch + fa + fb)
    return cx.reshape(y, [sizes[c] for c in letters]), letters


@converter("Einsum", 12)
def convert_einsum(cx: NodeContext):
    terms, out = parse(cx.attr("equation", ""), [v.type.rank for v in cx.inputs])
    if any(v.dtype not in ("f32", "f64") for v in cx.inputs):
        raise Fallback("einsum of a non-float type (braze's matmul is float)")
    operands = []
    for i, (v, t) in enumerate(zip(cx.inputs, terms)):
        v, terms[i] = diagonal(cx, v, t)
        operands.append(v)
    sizes = sizes_of(terms, [v.shape for v in operands])
    if any(c not in sizes for c in out) or len(set(out)) != len(out):
        raise InvalidModelError(f"{cx.describe}: output {out!r} names a letter no operand "
                                "has, or one twice")
    v, term = sum_out(cx, operands[0], terms[0], set(out) | set("".join(terms[1:])))
    for i in range(1, len(terms)):
        keep = set(out) | set("".join(terms[i + 1:]))
        v, term = contract(cx, v, term, operands[i], terms[i], keep, sizes)
    v, term = sum_out(cx, v, term, set(out))
    return [cx.transpose(v, [term.index(c) for c in out])]
