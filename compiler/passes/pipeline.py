"""braze's graph pass pipeline: one flat list, in order, each with its reason.

`run_passes` runs the list to a fixed point (at most MAX_ROUNDS rounds: each
pass only shrinks or simplifies the graph, so this converges fast; the bound
guards against a pair of rules undoing each other). With `verify_each` the IR
verifier runs after every pass (tests turn it on), and an error names the pass.
"""

from __future__ import annotations

from typing import Callable

from compiler.ir import Graph, IRError, verify
from compiler.passes.fold import fold_affine_into_contractions
from compiler.passes.simplify import (
    eliminate_common_subexpressions,
    fold_constants,
    remove_dead,
    simplify_identities,
)

Pass = Callable[[Graph], bool]

MAX_ROUNDS = 8

DEFAULT: list[tuple[Pass, str]] = [
    (fold_constants, "shape chains and weight transforms become constants"),
    (simplify_identities, "x*1, x+0, no-op reshapes/transposes/casts vanish before matching"),
    (eliminate_common_subexpressions, "duplicate constants and ops computed once"),
    (fold_affine_into_contractions, "batch norm and scale/bias folded into conv/matmul weights"),
    (remove_dead, "what folding and merging left unread goes"),
]


def run_passes(graph: Graph, passes: list[tuple[Pass, str]] | None = None,
               verify_each: bool = False) -> bool:
    """Run `passes` (default: DEFAULT) to a fixed point, in place; return whether anything
    changed."""
    passes = DEFAULT if passes is None else passes
    changed_any = False
    for _ in range(MAX_ROUNDS):
        changed = False
        for i, (fn, _why) in enumerate(passes):
            try:
                changed |= bool(fn(graph))
                if verify_each:
                    verify(graph, after=fn.__name__)
            except IRError as e:
                before = ", ".join(p.__name__ for p, _ in passes[:i]) or "none"
                raise IRError(f"pass {fn.__name__} (after: {before}): {e}") from None
        changed_any |= changed
        if not changed:
            break
    return changed_any
