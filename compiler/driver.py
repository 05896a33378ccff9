"""The compile driver: an imported graph in, a plan out (framework-free).

    graph -> generic pass pipeline (compiler/passes/pipeline.py)
          -> the target's passes (TARGET_PASSES: what depends on what the target compiles)
          -> partition into compiled and host clusters (compiler/passes/cluster.py)
          -> without fallback, the first node braze would leave to the host

Every front end goes through `plan`: compile_onnx, the torch.compile backend,
`braze explain`, `braze compile` (artifacts and PTX). What happens to the plan
afterwards (a runtime step per cluster) is the front end's: bridge/steps.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from compiler.errors import CompileError
from compiler.ir import Graph, Node
from compiler.passes.cluster import Cluster, describe_partition, partition
from compiler.passes.pipeline import run_passes
from compiler.passes.split_rows import split_long_rows
from compiler.passes.windows import lower_windows

# What the CompileError of a refused node says after the node and its reason: the
# option that made the refusal an error.
NO_FALLBACK = "allow_fallback=False"


@dataclass(frozen=True)
class TargetPass:
    """A pass whose decisions depend on the target: `run(graph, target) -> changed`."""

    run: Callable[[Graph, str], bool]
    why: str

    @property
    def name(self) -> str:
        return self.run.__name__


def channels_last(graph: Graph, target: str) -> bool:
    """The layout pass, converting the convs and pools the target compiles channels-last
    (compiler/codegen: channels_last_refusal decides which)."""
    from compiler.codegen import channels_last_refusal
    from compiler.passes import layout

    return layout.channels_last(graph, lambda node: channels_last_refusal(node, target))


# Run once each, in order, after the generic pipeline and before clustering.
TARGET_PASSES: list[TargetPass] = [
    TargetPass(lower_windows,
               "1-d and 3-d convs and 3-d max pools become 2-d ones plus movement, which "
               "the CPU's window kernels run; before the layout pass, which converts them"),
    TargetPass(channels_last,
               "conv/pool chains run NHWC where the target has NHWC kernels, transposes "
               "sunk to the chain's ends; before clustering, since supports() refuses "
               "NCHW convs"),
    TargetPass(split_long_rows,
               "a reduction of one long row (a 1-group norm at batch 1) runs in two "
               "stages, the first threaded; after the layout pass, which makes those rows"),
]


@dataclass
class Plan:
    """A graph after braze's passes, cut into clusters for `target`.

    `refusal` is set only when fallback is off: the first node braze would leave to
    the host, as 'cannot compile <op> node <name>: <reason>'."""

    graph: Graph
    target: str
    clusters: list[Cluster]
    refusal: str | None = None

    def check(self) -> None:
        """CompileError when fallback is off and a node would run on the host."""
        if self.refusal is not None:
            raise refused(self.refusal)

    def describe(self) -> str:
        """Clusters and, for every node not compiled, why (what `braze explain` prints)."""
        return describe_partition(self.clusters)


def plan(graph: Graph, target: str = "cpu", allow_fallback: bool = True) -> Plan:
    """Run the passes on `graph` (in place) and partition it for `target`.

    With fallback on, a compiled cluster too cheap to pay for its boundaries goes to
    the host (`demote_cheap`); without it nothing is demoted, so that every refusal
    is a real one."""
    optimize(graph, target)
    return cut(graph, target, allow_fallback)


def optimize(graph: Graph, target: str = "cpu") -> None:
    """`plan`'s first half: the passes and the target's passes, in place (a front end
    that rewrites the optimized graph, as bridge/dynamic.py does for padding, runs the
    halves apart)."""
    run_passes(graph)
    run_target_passes(graph, target)


def cut(graph: Graph, target: str = "cpu", allow_fallback: bool = True) -> Plan:
    """`plan`'s second half: partition an optimized graph for `target`."""
    clusters = partition(graph, supports_for(target), demote_cheap=allow_fallback)
    return Plan(graph, target, clusters, None if allow_fallback else first_refusal(clusters))


def run_target_passes(graph: Graph, target: str) -> bool:
    """TARGET_PASSES on `graph`, in place; whether any changed it."""
    changed = False
    for p in TARGET_PASSES:
        changed |= bool(p.run(graph, target))
    return changed


def supports_for(target: str) -> Callable[[Node], str | None]:
    """The target's `supports(node) -> None | reason` (compiler/codegen)."""
    from compiler.codegen import supports

    return lambda node: supports(node, target)


def node_label(n: Node) -> str:
    """What a node is called in messages: its source op for a host node, else its IR op."""
    return n.attrs["op_type"] if n.op == "host" else n.op


def first_refusal(clusters: list[Cluster]) -> str | None:
    """'cannot compile <op> node <name>: <reason>' for the first node of the first host
    cluster (None when every cluster is compiled)."""
    for c in clusters:
        if not c.compiled:
            n = c.nodes[0]
            name = n.name or n.outputs[0].name
            return f"cannot compile {node_label(n)} node {name!r}: {c.reasons[n]}"
    return None


def refused(why: str) -> CompileError:
    """The error for a refusal that fallback being off makes fatal."""
    return CompileError(f"{why} ({NO_FALLBACK})")
