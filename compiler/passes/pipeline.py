"""braze's graph pass pipeline: one flat list, in order, each entry with its reason.

Contract of a pass: `fn(graph) -> bool` (whether it changed anything), in place.

Fixed point: `run_passes` runs the whole list in rounds until a round changes
nothing. Every pass only removes nodes or replaces them by cheaper or folded
ones, so this ends in a few rounds; MAX_ROUNDS bounds it anyway (a pair of
rules undoing each other would be a bug, logged as a warning, not a hang).

Checks: the verifier runs on entry and on exit; with `verify_each` (tests turn
it on) it also runs after every pass. A failure raises PassError naming the
pass and the passes that ran before it in that round.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from compiler.ir import Graph, IRError, verify
from compiler.passes.attention import fuse_attention
from compiler.passes.fold import fold_affine_into_contractions
from compiler.passes.identities import simplify_identities
from compiler.passes.sink import sink_reshapes
from compiler.passes.simplify import eliminate_common_subexpressions, fold_constants, remove_dead
from compiler.passes.widen import widen_half

log = logging.getLogger("braze.passes")

Pass = Callable[[Graph], bool]

# Rounds before giving up on a fixed point: real graphs settle in two or three
# (folding a BN exposes one more constant chain at most).
MAX_ROUNDS = 10


class PassError(IRError):
    """A pass failed or left the graph invalid; the message names the pass."""


@dataclass(frozen=True)
class Entry:
    """One pipeline step and the reason it is there."""

    run: Pass
    why: str

    @property
    def name(self) -> str:
        return self.run.__name__


DEFAULT: list[Entry] = [
    Entry(widen_half,
          "float16 computed as float32 (f16 kept at the graph's edges, explicit casts and "
          "host nodes), before any rule matches, so f16 graphs fold and fuse as f32 ones"),
    Entry(fold_constants,
          "shape chains and weight transforms become constants that later rules can read"),
    Entry(simplify_identities,
          "x*1, x+0, no-op movement and cast chains vanish before anything matches on them"),
    Entry(sink_reshapes,
          "reshapes between a matmul and its rows or its epilogue move aside, so the GEMM "
          "reads the activation in place and the epilogue fuses (torch's Linear on 4-d "
          "activations)"),
    Entry(eliminate_common_subexpressions,
          "duplicates computed once, so single-reader checks see the true readers"),
    Entry(fuse_attention,
          "softmax(scaled, masked Q x K^T) x V becomes one attention node: one kernel, the "
          "T x T scores never written"),
    Entry(fold_affine_into_contractions,
          "batch norm and scale/bias constants folded into conv/matmul weights"),
    Entry(remove_dead,
          "what folding and merging left unread goes (unfolded weights included)"),
]


def _run_one(graph: Graph, entry: Entry, before: list[Entry], round_: int,
             verify_each: bool) -> bool:
    try:
        changed = bool(entry.run(graph))
        if verify_each:
            verify(graph, after=entry.name)
        return changed
    except Exception as e:
        prior = ", ".join(p.name for p in before) or "nothing"
        raise PassError(f"pass {entry.name} failed in round {round_} "
                        f"(run before it this round: {prior}): {e}") from e


def run_passes(graph: Graph, passes: list[Entry] | None = None,
               verify_each: bool = False) -> bool:
    """Run `passes` (default: DEFAULT) to a fixed point, in place; return whether anything
    changed."""
    passes = DEFAULT if passes is None else passes
    try:
        verify(graph)
    except IRError as e:
        raise PassError(f"the graph given to the pass pipeline is invalid: {e}") from e
    changed_any = False
    for round_ in range(1, MAX_ROUNDS + 1):
        changed = [p.name for i, p in enumerate(passes)
                   if _run_one(graph, p, passes[:i], round_, verify_each)]
        if not changed:
            break
        changed_any = True
    else:
        log.warning("pass pipeline did not settle in %d rounds; still changing: %s",
                    MAX_ROUNDS, ", ".join(changed))
    if passes:
        try:
            verify(graph, after=passes[-1].name)
        except IRError as e:
            raise PassError(f"the pass pipeline left an invalid graph: {e}") from e
    return changed_any
