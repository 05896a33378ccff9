"""The ONNX export of `recurrence` (compiler/ops/recurrence.py): ONNX's own LSTM/GRU/RNN.

Where the importers made it (the projection xw = X W^T + bias as one matmul, then the
recurrence) and W and the bias are constants, the export is the original op on X, with
W and B rebuilt from them: the matmul and its bias add are absorbed (`projections`), so
`braze optimize` writes a recurrent layer back as one op and a host step computes no
extra product. Otherwise the op runs on xw itself, with W the 0/1 matrix that selects
each direction's columns (exact: one product by 1 per element).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler import dtypes
from compiler.ir import Graph, Node, Value
from compiler.ops.recurrence import dims

_OPS = {"lstm": "LSTM", "gru": "GRU", "rnn": "RNN"}


@dataclass(frozen=True)
class Projection:
    """xw = x @ wt (+ bias): the nodes between x and the recurrence, absorbed."""

    x: Value
    wt: np.ndarray  # [I, D*G*H]
    bias: np.ndarray | None  # [D*G*H]
    nodes: tuple[Node, ...]


def projections(graph: Graph) -> dict[Node, Projection]:
    """recurrence node -> its projection, where every node from the matmul to the
    recurrence (matmul, bias add, reshapes) has that chain as its only reader."""
    users = graph.users()
    found = {}
    for n in graph.nodes:
        if n.op == "recurrence" and (p := _projection(n, users, graph)) is not None:
            found[n] = p
    return found


def _only_reader(v: Value, users: dict, graph: Graph) -> bool:
    return len(users.get(v, [])) == 1 and v not in graph.outputs


def _projection(n: Node, users: dict, graph: Graph) -> Projection | None:
    v, chain = n.inputs[0], []
    while v.producer is not None and v.producer.op == "reshape" and \
            _only_reader(v, users, graph):
        chain.append(v.producer)
        v = v.producer.inputs[0]
    bias = None
    p = v.producer
    if p is not None and p.op == "add" and _only_reader(v, users, graph):
        consts = [u for u in p.inputs if u.is_const]
        others = [u for u in p.inputs if not u.is_const]
        width = v.shape[-1]
        if len(consts) != 1 or len(others) != 1 or consts[0].type.size != width \
                or consts[0].shape[-1:] != (width,):
            return None
        chain.append(p)
        bias = np.asarray(consts[0].const_value).reshape(-1)
        v = others[0]
    p = v.producer
    if p is None or p.op != "matmul" or not _only_reader(v, users, graph) \
            or not p.inputs[1].is_const or len(p.inputs[1].shape) != 2:
        return None
    chain.append(p)
    return Projection(p.inputs[0], np.asarray(p.inputs[1].const_value), bias, tuple(chain))


def export(em, n: Node, ins: list[str], outs: list[str], proj: Projection | None) -> None:
    """Emit the recurrence `n` as ONNX's op (on X with `proj`, else on xw), its outputs
    Y, Y_h (and Y_c) stacked into the node's result."""
    t, batch, d, g, h = dims(n)
    gh = g * h
    dt = dtypes.to_numpy(n.inputs[0].dtype)
    cell = n.attrs["cell"]
    if proj is not None:
        width = proj.wt.shape[0]
        x = em.add("Reshape", [proj.x.name, em.ints([t, batch, width])])
        w = np.ascontiguousarray(proj.wt.T.reshape(d, gh, width)).astype(dt)
        wb = np.zeros((d, gh), dt) if proj.bias is None else proj.bias.reshape(d, gh)
    else:
        x = em.add("Reshape", [ins[0], em.ints([t, batch, d * gh])])
        w = np.zeros((d, gh, d * gh), dt)
        for k in range(d):
            w[k, :, k * gh:(k + 1) * gh] = np.eye(gh, dtype=dt)
        wb = np.zeros((d, gh), dt)
    bias = em.const(np.concatenate([wb, np.zeros((d, gh), dt)], axis=1).astype(dt), "bias")
    if cell == "gru" and n.attrs["linear_before_reset"]:  # Rb_h: the last H of B
        head = em.const(np.concatenate([wb, np.zeros((d, gh - h), dt)], axis=1), "bias")
        bias = em.add("Concat", [head, ins[4]], axis=1)
    args = [x, em.const(w, "w"), ins[1], bias, ins[3], ins[2]]
    if cell == "lstm":
        args += [ins[4], ins[5]]
    attrs = {"hidden_size": h, "direction": n.attrs["direction"]}
    if n.attrs["clip"] > 0:
        attrs["clip"] = n.attrs["clip"]
    if cell == "gru":
        attrs["linear_before_reset"] = int(n.attrs["linear_before_reset"])
    names = [em.fresh("y") for _ in range(2 + (cell == "lstm"))]
    em.add(_OPS[cell], args, names, **attrs)
    states = [em.add("Unsqueeze", [s, em.ints([0])]) for s in names[1:]]
    em.add("Concat", [names[0]] + states, outs, axis=0)
