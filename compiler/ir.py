"""braze's IR: a graph of nodes in SSA form over statically shaped tensors.

A `Graph` owns an ordered list of `Node`s (always topologically sorted), its
input `Value`s and output `Value`s. Each `Value` has exactly one producer (a
node, or the graph itself for inputs), a dtype (see compiler.dtypes) and a
shape: a tuple of ints. A dimension may be None only on values produced by a
`host` node whose output shape depends on data; nothing but host nodes may
consume such values (the verifier checks it).

The op set is closed and lives in compiler.ops (one registry: shape and dtype
inference, attribute validation, numpy reference semantics). The text form
(`print_graph` / `parse_graph`, in compiler.text) round-trips exactly.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterable

from compiler import dtypes
from compiler.errors import BrazeError


class IRError(BrazeError):
    """An IR invariant does not hold (bad attribute, wrong types, dangling value...)."""


@dataclass(frozen=True)
class TensorType:
    """dtype and shape of a value; shape dims are ints (None: data-dependent)."""

    dtype: str
    shape: tuple

    def __post_init__(self):
        dtypes.check(self.dtype)
        object.__setattr__(self, "shape", tuple(self.shape))
        for d in self.shape:
            if d is not None and (not isinstance(d, int) or isinstance(d, bool) or d < 0):
                raise IRError(f"bad dimension {d!r} in shape {self.shape}")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def static(self) -> bool:
        return all(d is not None for d in self.shape)

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def __str__(self) -> str:
        dims = ",".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.dtype}[{dims}]"


class Value:
    """One SSA value: produced once, by `producer` (None for a graph input)."""

    __slots__ = ("name", "type", "producer")

    def __init__(self, name: str, type: TensorType, producer: "Node | None" = None):
        self.name = name
        self.type = type
        self.producer = producer

    @property
    def shape(self) -> tuple:
        return self.type.shape

    @property
    def dtype(self) -> str:
        return self.type.dtype

    @property
    def is_const(self) -> bool:
        """Whether a `const` node produces this value."""
        return self.producer is not None and self.producer.op == "const"

    @property
    def const_value(self):
        """The array of a `const`-produced value, else None."""
        return self.producer.attrs["value"] if self.is_const else None

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"


class Node:
    """An op applied to input values, producing output values.

    `attrs` holds plain data only (int, float, str, bool, bytes, tuples of those,
    numpy arrays for `const`), so nodes print, hash and copy without surprises.
    `name` is the framework's name for the node (for error messages), or "".
    """

    __slots__ = ("op", "inputs", "outputs", "attrs", "name")

    def __init__(self, op: str, inputs: list, attrs: dict, name: str = ""):
        self.op = op
        self.inputs = list(inputs)
        self.outputs: list[Value] = []
        self.attrs = dict(attrs)
        self.name = name

    @property
    def output(self) -> Value:
        if len(self.outputs) != 1:
            raise IRError(f"{self.describe()} has {len(self.outputs)} outputs, not 1")
        return self.outputs[0]

    @property
    def opdef(self):
        from compiler.ops import get_op

        return get_op(self.op)

    @property
    def label(self) -> str:
        """What the node is called in reports: its op, or a host node's framework op."""
        return self.attrs["op_type"] if self.op == "host" else self.op

    def describe(self) -> str:
        """'op node "name"' for error messages (a host node's framework op, e.g. CumSum)."""
        op = self.attrs.get("op_type", self.op) if self.op == "host" else self.op
        return f'{op} node "{self.name}"' if self.name else f"{op} node"

    def __repr__(self) -> str:
        outs = ", ".join(f"%{v.name}" for v in self.outputs)
        ins = ", ".join(f"%{v.name}" for v in self.inputs)
        return f"<{outs} = {self.op}({ins})>"


class Graph:
    """Nodes in topological order, with graph inputs and outputs."""

    def __init__(self, name: str = "main"):
        self.name = name
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self._nodes: list[Node] = []
        # value -> the nodes reading it (`users`): built on first use, then kept current by
        # this class's edits (add_node, set_inputs, replace_all_uses, remove_node);
        # assigning `nodes` drops it. verify() checks it against a fresh count.
        self._users: dict[Value, list[Node]] | None = None
        self._names: set[str] = set()
        self._counter = itertools.count()

    @property
    def nodes(self) -> list[Node]:
        """The nodes in topological order (edit through the methods below, or assign a
        new list; editing a node's `inputs` in place needs `set_inputs`)."""
        return self._nodes

    @nodes.setter
    def nodes(self, nodes: list[Node]) -> None:
        self._nodes = list(nodes)
        self._users = None

    # -- building ---------------------------------------------------------

    def fresh_name(self, hint: str = "v") -> str:
        """A value name unused in this graph, derived from `hint`."""
        if hint and hint not in self._names:
            return hint
        while True:
            name = f"{hint or 'v'}.{next(self._counter)}"
            if name not in self._names:
                return name

    def add_input(self, name: str, type: TensorType) -> Value:
        if name in self._names:
            raise IRError(f"duplicate value name %{name}")
        v = Value(name, type, None)
        self._names.add(name)
        self.inputs.append(v)
        return v

    def add_node(
        self,
        op: str,
        inputs: Iterable[Value],
        attrs: dict | None = None,
        *,
        name: str = "",
        out_names: list[str] | None = None,
        out_types: list[TensorType] | None = None,
        index: int | None = None,
    ) -> Node:
        """Create a node, infer its output types (unless given) and insert it.

        Inserted at the end, or before position `index`. Inputs must already be
        defined; callers building out of order should use `index` or re-sort.
        """
        from compiler.ops import get_op

        opdef = get_op(op)
        node = Node(op, list(inputs), opdef.normalize_attrs(dict(attrs or {}), name))
        node.name = name
        if out_types is None:
            out_types = opdef.infer(node)
        for i, t in enumerate(out_types):
            hint = out_names[i] if out_names and i < len(out_names) else (name or op)
            vname = self.fresh_name(hint)
            self._names.add(vname)
            node.outputs.append(Value(vname, t, node))
        if index is None:
            self._nodes.append(node)
        else:
            self._nodes.insert(index, node)
        self._link(node)
        return node

    def op(self, op: str, *inputs: Value, name: str = "", **attrs) -> Value:
        """Shorthand: append a single-output node and return its value."""
        return self.add_node(op, inputs, attrs, name=name).output

    def const(self, array, name: str = "const") -> Value:
        """Append a `const` node holding `array` (copied, made read-only)."""
        import numpy as np

        arr = np.array(array, copy=True)
        arr.setflags(write=False)
        return self.add_node("const", [], {"value": arr}, out_names=[name]).output

    def rename(self, value: Value, new_name: str) -> None:
        """Give `value` a new name (must be unused)."""
        if new_name == value.name:
            return
        if new_name in self._names:
            raise IRError(f"duplicate value name %{new_name}")
        self._names.discard(value.name)
        value.name = new_name
        self._names.add(new_name)

    def reserve_name(self, name: str) -> None:
        """Record a value name created outside add_node/add_input (parser, cloning)."""
        if name in self._names:
            raise IRError(f"duplicate value name %{name}")
        self._names.add(name)

    # -- queries and edits ------------------------------------------------

    def users(self) -> dict[Value, list[Node]]:
        """Map each value to the nodes that read it (a node once per input that reads it).
        Kept current by the graph's edits, not rebuilt per call; callers must not edit it."""
        if self._users is None:
            self._users = _count_users(self._nodes)
        return self._users

    def values(self) -> list[Value]:
        """Every value: inputs, then node outputs in order."""
        vals = list(self.inputs)
        for n in self.nodes:
            vals.extend(n.outputs)
        return vals

    def set_inputs(self, node: Node, inputs: Iterable[Value]) -> None:
        """Point `node` (in this graph) at `inputs`, keeping `users` current."""
        self._unlink(node)
        node.inputs = list(inputs)
        self._link(node)

    def set_input(self, node: Node, i: int, value: Value) -> None:
        """Point input `i` of `node` at `value`."""
        inputs = list(node.inputs)
        inputs[i] = value
        self.set_inputs(node, inputs)

    def remove_node(self, node: Node) -> None:
        """Take `node` out of the graph (its outputs must have no readers left)."""
        self._nodes.remove(node)
        self._unlink(node)

    def replace_all_uses(self, old: Value, new: Value) -> None:
        """Point every reader of `old` (nodes and graph outputs) at `new`."""
        for n in dict.fromkeys(self.users().get(old, ())):
            self.set_inputs(n, [new if v is old else v for v in n.inputs])
        self.outputs = [new if v is old else v for v in self.outputs]

    def remove_dead(self) -> int:
        """Drop nodes whose outputs nobody reads; return how many went (one backward pass:
        linear in the graph's size)."""
        live = set(self.outputs)
        kept = []
        for n in reversed(self._nodes):
            if any(o in live for o in n.outputs):
                kept.append(n)
                live.update(n.inputs)
        removed = len(self._nodes) - len(kept)
        if removed:
            keep = set(kept)
            for n in self._nodes:
                if n not in keep:
                    for o in n.outputs:
                        self._names.discard(o.name)
            self.nodes = kept[::-1]
        return removed

    def _link(self, node: Node) -> None:
        if self._users is not None:
            for v in node.inputs:
                self._users.setdefault(v, []).append(node)

    def _unlink(self, node: Node) -> None:
        if self._users is not None:
            for v in node.inputs:
                readers = self._users.get(v)
                if readers is not None and node in readers:
                    readers.remove(node)
                    if not readers:
                        del self._users[v]

    def toposort(self) -> None:
        """Re-order nodes topologically (stable); IRError on a cycle."""
        produced = {v for v in self.inputs}
        pending = list(self.nodes)
        ordered: list[Node] = []
        while pending:
            progress = []
            rest = []
            for n in pending:
                if all(v in produced for v in n.inputs):
                    progress.append(n)
                    produced.update(n.outputs)
                else:
                    rest.append(n)
            if not progress:
                raise IRError(f"cycle or undefined input at {rest[0].describe()}")
            ordered.extend(progress)
            pending = rest
        self._nodes = ordered  # the same edges: `users` stays current

    def __str__(self) -> str:
        from compiler.text import print_graph

        return print_graph(self)

    def __eq__(self, other) -> bool:
        if not isinstance(other, Graph):
            return NotImplemented
        from compiler.text import graphs_equal

        return graphs_equal(self, other)

    __hash__ = None  # mutable


def _count_users(nodes: list[Node]) -> dict[Value, list[Node]]:
    out: dict[Value, list[Node]] = {}
    for n in nodes:
        for v in n.inputs:
            out.setdefault(v, []).append(n)
    return out


def _check_users(graph: Graph, where: str) -> None:
    """The kept `users` map equals a fresh count (an edit of `inputs` that bypassed
    Graph.set_inputs would leave it stale)."""
    if graph._users is None:
        return
    fresh = _count_users(graph.nodes)
    kept = {v: sorted(map(id, r)) for v, r in graph._users.items() if r}
    if kept != {v: sorted(map(id, r)) for v, r in fresh.items()}:
        raise IRError(f"the graph's readers map is stale{where}: a node's inputs were "
                      "edited without Graph.set_inputs")


def verify(graph: Graph, *, after: str = "") -> None:
    """Check the graph's invariants; raise IRError naming the first violation.

    SSA (each value defined once, before use), no dangling inputs, acyclic
    (implied by definition-before-use in node order), attributes valid, output
    types equal to what the op infers, dynamic dims consumed only by host nodes.
    """
    where = f" (after pass {after})" if after else ""
    defined: set[int] = set()
    names: set[str] = set()

    def define(v: Value, producer):
        if id(v) in defined or v.name in names:
            raise IRError(f"value %{v.name} defined twice{where}")
        if v.producer is not producer:
            raise IRError(f"value %{v.name} has the wrong producer{where}")
        defined.add(id(v))
        names.add(v.name)

    for v in graph.inputs:
        define(v, None)
    for n in graph.nodes:
        for v in n.inputs:
            if id(v) not in defined:
                raise IRError(
                    f"{n.describe()} reads %{v.name}, which is not defined before it{where}"
                )
            if not v.type.static and n.op != "host":
                raise IRError(f"{n.describe()} reads dynamically shaped %{v.name}{where}")
        try:
            n.opdef.validate(n)
            expected = n.opdef.infer(n) if n.op != "host" else [o.type for o in n.outputs]
        except IRError as e:
            raise IRError(f"{e}{where}") from None
        if [o.type for o in n.outputs] != list(expected):
            got = ", ".join(str(o.type) for o in n.outputs)
            want = ", ".join(str(t) for t in expected)
            raise IRError(f"{n.describe()} outputs {got} but the op infers {want}{where}")
        for o in n.outputs:
            define(o, n)
    for v in graph.outputs:
        if id(v) not in defined:
            raise IRError(f"graph output %{v.name} is not defined{where}")
    _check_users(graph, where)


def graph_inputs_of(v: Value, limit: int | None = None) -> list[Value] | None:
    """The graph inputs `v` is computed from (walking producers back through every node
    but a const; [] for a value made only of constants), or None when the walk visits
    more than `limit` values."""
    inputs, seen, todo = [], set(), [v]
    while todo:
        u = todo.pop()
        if id(u) in seen:
            continue
        seen.add(id(u))
        if limit is not None and len(seen) > limit:
            return None
        if u.producer is None:
            inputs.append(u)
        elif u.producer.op != "const":
            todo.extend(u.producer.inputs)
    return inputs


def clone(graph: Graph) -> Graph:
    """A deep copy of the graph structure (constant arrays are shared: read-only)."""
    g = Graph(graph.name)
    vmap: dict[Value, Value] = {}
    for v in graph.inputs:
        vmap[v] = g.add_input(v.name, v.type)
    for n in graph.nodes:
        m = Node(n.op, [vmap[v] for v in n.inputs], n.attrs, n.name)
        for o in n.outputs:
            nv = Value(o.name, o.type, m)
            g.reserve_name(o.name)
            m.outputs.append(nv)
            vmap[o] = nv
        g._nodes.append(m)
    g.outputs = [vmap[v] for v in graph.outputs]
    return g
