"""Reference interpreter: run an IR graph with numpy, op by op.

The oracle for pass tests (a pass must not change what `evaluate` computes) and
the engine of constant folding. Host nodes need a `host_eval` callback from the
caller (compiler/ knows no framework).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from compiler import dtypes
from compiler.ir import Graph, IRError, Node

HostEval = Callable[[Node, list], list]


def evaluate(graph: Graph, inputs: Sequence[np.ndarray] | dict,
             host_eval: HostEval | None = None) -> list[np.ndarray]:
    """Run `graph` on `inputs` (positional, or by input name); return its outputs."""
    if isinstance(inputs, dict):
        inputs = [inputs[v.name] for v in graph.inputs]
    if len(inputs) != len(graph.inputs):
        raise IRError(f"graph takes {len(graph.inputs)} inputs, got {len(inputs)}")
    env = {}
    for v, a in zip(graph.inputs, inputs):
        if v.type.dtype == "opaque":  # sequences, maps, optionals: passed as given
            env[v] = a
            continue
        a = np.asarray(a)
        if v.type.dtype in dtypes.SCALARS:
            a = a.astype(dtypes.to_numpy(v.dtype), copy=False)
        env[v] = a
    for n in graph.nodes:
        args = [env[v] for v in n.inputs]
        if n.op == "host":
            if host_eval is None:
                raise IRError(f"{n.describe()} is a host op and no host_eval was given")
            outs = host_eval(n, args)
        else:
            outs = n.opdef.evaluate(n, args)
        for v, a in zip(n.outputs, outs):
            env[v] = a
    return [env[v] for v in graph.outputs]
