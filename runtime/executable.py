"""An Executable: ordered steps over numbered value slots, run in a tight loop.

Built once from a partitioned graph and one step per cluster (`build_executable`);
`run` fills the input slots, calls each step with its argument slots, and drops
every intermediate the moment its last reader has run (liveness computed at build
time), so peak memory follows the graph, not its length. Each call has its own
slot list, so several threads may run one Executable at once (the steps
themselves are thread-safe: onnxruntime sessions and braze's compiled graphs both
are).
Outputs never alias inputs, constants or each other: those are copied.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from compiler.ir import Graph, Value

StepFn = Callable[[list], list]


@dataclass(frozen=True)
class Step:
    """One call: `fn(args) -> results`, reading and writing slots."""

    fn: StepFn
    args: tuple[int, ...]
    results: tuple[int, ...]
    frees: tuple[int, ...]  # slots whose last reader is this step
    label: str = ""


class Executable:
    """Inputs, constants and steps over slots; see the module docstring."""

    def __init__(self, n_slots: int, input_slots: Sequence[int], output_slots: Sequence[int],
                 constants: dict[int, np.ndarray], steps: Sequence[Step]):
        self.n_slots = n_slots
        self.input_slots = tuple(input_slots)
        self.output_slots = tuple(output_slots)
        self.constants = dict(constants)
        self.steps = tuple(steps)
        # outputs that must be copied: inputs, constants, or the same slot twice
        shared = set(self.input_slots) | set(self.constants)
        seen: set[int] = set()
        self._copy = []
        for s in self.output_slots:
            self._copy.append(s in shared or s in seen)
            seen.add(s)
        # one step reading the inputs and writing the outputs, in order (a model compiled
        # whole): run it directly, with no slots
        only = self.steps[0] if len(self.steps) == 1 else None
        self._direct = only.fn if (
            only is not None and only.args == self.input_slots and not self.constants
            and only.results == self.output_slots and not any(self._copy)) else None

    @property
    def direct(self) -> StepFn | None:
        """The one step that reads the inputs and writes the outputs as they are (a model
        compiled whole), which `run` calls directly; None where there are several."""
        return self._direct

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        if self._direct is not None:
            return list(self._direct(arrays))
        env: list = [None] * self.n_slots
        for s, a in zip(self.input_slots, arrays):
            env[s] = a
        for s, a in self.constants.items():
            env[s] = a
        for step in self.steps:
            outs = step.fn([env[i] for i in step.args])
            for s, a in zip(step.results, outs):
                env[s] = a
            for s in step.frees:
                env[s] = None
        return [_fresh(env[s]) if copy else env[s]
                for s, copy in zip(self.output_slots, self._copy)]


def _fresh(x):
    """A copy of an array, or of a sequence of arrays (ONNX sequence values)."""
    if isinstance(x, np.ndarray):
        return x.copy()
    if isinstance(x, list):
        return [_fresh(e) for e in x]
    return x


def build_executable(graph: Graph, clusters: list, steps: Sequence[StepFn]) -> Executable:
    """The Executable running `steps[i]` for `clusters[i]` (in order) of `graph`.

    Constants read across clusters are outlined into each cluster's sub-graph, so
    only constants that are graph outputs need slots here.
    """
    if len(steps) != len(clusters):
        raise ValueError(f"{len(steps)} steps for {len(clusters)} clusters")
    slots: dict[Value, int] = {}

    def slot(v: Value) -> int:
        return slots.setdefault(v, len(slots))

    inputs = [slot(v) for v in graph.inputs]
    plan = []
    for c, fn in zip(clusters, steps):
        plan.append((fn, [slot(v) for v in c.inputs], [slot(v) for v in c.outputs],
                     f"{c.kind} cluster {c.id}"))
    constants = {}
    for v in graph.outputs:
        if v not in slots and v.is_const:
            constants[slot(v)] = v.producer.attrs["value"]
    outputs = [slot(v) for v in graph.outputs]
    last_use: dict[int, int] = {}
    for i, (_, args, _, _) in enumerate(plan):
        for s in args:
            last_use[s] = i
    keep = set(outputs)
    steps = []
    for i, (fn, args, results, label) in enumerate(plan):
        frees = tuple(s for s in set(args) | set(results)
                      if last_use.get(s, -1) <= i and s not in keep)
        steps.append(Step(fn, tuple(args), tuple(results), frees, label))
    return Executable(len(slots), inputs, outputs, constants, steps)
