"""aten-level FX graphs (from AOTAutograd) -> braze IR, specialized to concrete inputs.

`import_fx(gm, args)` walks the graph once. Shapes and dtypes come from each
node's fake value (`meta["val"]`), or from `vals` when the caller re-propagated
fake values for concrete shapes (dynamic graphs). Data is never read, except the
arrays of the inputs named in `frozen` (parameters, made IR constants).

Each aten node goes through the one converter table (importers/fx_context.py).
Where there is no converter, the converter refuses (`Fallback`), or the node is
random (it must draw from torch's generator), the node becomes a `host` node
(`framework="torch"`, payload = its key in `FxImport.host_ops`: the aten
callable and its argument structure, since aten targets are not serializable).
Factory ops (zeros, arange, full...) are evaluated here with torch: constants.
"""

from __future__ import annotations

import logging
import operator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.fx

from compiler.errors import CompileError
from compiler.ir import Graph, IRError, TensorType, Value
from importers import (  # noqa: F401  (fill the table)
    fx_elementwise, fx_movement, fx_nn, fx_resize, fx_rnn, fx_transformer, fx_windows)
from importers import fx_selection  # noqa: F401  (fill the table: topk, sort, kthvalue)
from importers import fx_special  # noqa: F401  (fill the table: lgamma, Bessel, zeta...)
from importers import (  # noqa: F401  (fill the table: addbmm, cdist, cummax, median,
    fx_embedding_bag, fx_linalg, fx_misc, fx_scans, fx_search)  # searchsorted...)
from importers.fx_context import CONVERTERS, SEEDED_CHECKED, Ctx, Fallback, tensor_type

log = logging.getLogger("braze")

# Factory results up to this many elements become constants at import; larger
# ones (rare: a huge zeros buffer) would bloat the graph and are made at run time.
FACTORY_CONST_LIMIT = 1 << 22


class UnrepresentableGraph(CompileError):
    """The graph holds a tensor of a dtype braze's IR has no type for (complex32, ...):
    not even a host node can carry it, so the whole graph runs on torch."""


@dataclass(frozen=True)
class Slot:
    """Where an IR input of a host node goes in the aten call's arguments."""

    index: int


@dataclass
class HostOp:
    """How to run one host node: `target(*args, **kwargs)`, Slots filled with its inputs;
    `picks[i]` is the path (tuple of indices) of IR output i inside the result."""

    target: Any
    args: tuple
    kwargs: dict
    picks: list[tuple]
    strides: list  # per input: the strides eager torch gives it (some aten ops read them)

    def __call__(self, inputs: list) -> list:
        """Run the aten op eagerly on `inputs` (tensors, in the host node's input order)."""
        inputs = [_restride(t, s) for t, s in zip(inputs, self.strides)]
        fill = (lambda x: inputs[x.index] if isinstance(x, Slot) else x)
        result = self.target(*_map(self.args, fill),
                             **{k: _map(v, fill) for k, v in self.kwargs.items()})
        outs = []
        for path in self.picks:
            r = result
            for i in path:
                r = r[i]
            outs.append(r)
        return outs


@dataclass
class FxImport:
    """An fx graph in braze IR: see the module docstring."""

    graph: Graph
    input_indices: list[int]  # fx placeholder index of each graph input
    # per fx output: ("value", index into graph.outputs, must_copy) or ("literal", value)
    outputs: list[tuple] = field(default_factory=list)
    host_ops: dict[str, HostOp] = field(default_factory=dict)
    refusals: list[tuple[str, str, str]] = field(default_factory=list)  # (node, op, reason)


def import_fx(gm: torch.fx.GraphModule, args: list, frozen: dict | None = None,
              vals: dict | None = None, name: str = "fx",
              trainable: frozenset = frozenset()) -> FxImport:
    """Import `gm` for the concrete `args` (tensors: only shapes and dtypes are read;
    ints: SymInt values); `frozen` maps placeholder index -> numpy array to bake in;
    `trainable`: placeholder indices of module weights passed as inputs (an optimizer may
    change them at every call), which some converters leave to torch (a convolution)."""
    return _Importer(gm, args, frozen or {}, vals, name, trainable).run()


def op_name(target) -> str:
    """'aten.add.Tensor' for an OpOverload; the function name otherwise."""
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._opname}.{target._overloadname}"
    return getattr(target, "__name__", str(target))


class _Importer:
    def __init__(self, gm, args, frozen, vals, name, trainable=frozenset()):
        self.gm = gm
        self.args = list(args)
        self.frozen = frozen
        self.trainable = frozenset(trainable) - set(frozen)
        self.trainable_values: set[Value] = set()  # their graph inputs
        self.vals = vals
        self.graph = Graph(name)
        self.env: dict[torch.fx.Node, Any] = {}
        self.result = FxImport(self.graph, [])

    def val(self, node: torch.fx.Node):
        if self.vals is not None:
            return self.vals[node]
        if "val" not in node.meta:
            raise CompileError(f"fx node {node.name} ({op_name(node.target)}) has no "
                               "meta['val']: the graph was not traced with fake tensors")
        return node.meta["val"]

    def run(self) -> FxImport:
        placeholders = 0
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self.env[node] = self.placeholder(node, placeholders)
                placeholders += 1
            elif node.op == "call_function":
                self.env[node] = self.call(node)
            elif node.op == "get_attr":
                self.env[node] = self.attr(node)
            elif node.op == "output":
                self.output(node.args[0])
            else:
                raise CompileError(f"fx node {node.name}: unsupported kind {node.op!r}")
        return self.result

    # -- inputs and outputs ------------------------------------------------

    def placeholder(self, node: torch.fx.Node, i: int):
        arg = self.args[i]
        if not isinstance(arg, torch.Tensor):
            return arg  # a SymInt (or other scalar), concrete at this specialization
        t = _ir_type(node, arg)
        if i in self.frozen:
            return self.graph.const(self.frozen[i], name=node.name)
        self.result.input_indices.append(i)
        v = self.graph.add_input(self.graph.fresh_name(node.name), t)
        if i in self.trainable:
            self.trainable_values.add(v)
        return v

    def attr(self, node: torch.fx.Node) -> Value:
        """A tensor the graph owns (AOTAutograd's lifted constants): an IR constant."""
        t = getattr(self.gm, node.target)
        if not isinstance(t, torch.Tensor):
            raise CompileError(f"fx node {node.name} reads a non-tensor attribute")
        try:
            arr = t.detach().cpu().numpy()
        except (TypeError, RuntimeError):
            raise CompileError(f"fx node {node.name}: constant of dtype {t.dtype}") from None
        return self.graph.const(arr, name=node.name)

    def output(self, outs) -> None:
        seen: set[Value] = set()
        for ref in (outs if isinstance(outs, (list, tuple)) else [outs]):
            v = self.env[ref] if isinstance(ref, torch.fx.Node) else ref
            if not isinstance(v, Value):
                self.result.outputs.append(("literal", v))
                continue
            # a fresh aten result that braze resolved to an input or to another output
            # (clone, identity view) must not alias it: copy at run time
            alias = v in seen or (v.producer is None and ref.op != "placeholder")
            seen.add(v)
            self.result.outputs.append(("value", len(self.graph.outputs), alias))
            self.graph.outputs.append(v)

    # -- aten nodes --------------------------------------------------------

    def call(self, node: torch.fx.Node):
        target = node.target
        args = torch.fx.node.map_arg(node.args, lambda n: self.env[n])
        kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: self.env[n])
        if target is operator.getitem and isinstance(args[0], (tuple, list)):
            return args[0][args[1]]
        val = self.val(node)
        if not _has_tensor(val):
            return self.scalar(node, target, args, kwargs)
        reason = self.refusal(node, target, args, kwargs)
        if reason is None or reason.startswith("no braze converter"):
            if (const := self.factory(target, args, kwargs, val)) is not None:
                return const
        if reason is None:
            mark = len(self.graph.nodes)
            try:
                return self.convert(node, target, args, kwargs, val)
            except (Fallback, IRError) as e:
                del self.graph.nodes[mark:]
                reason = str(e)
        self.result.refusals.append((node.name, op_name(target), reason))
        return self.host(node, target, args, kwargs, val, reason)

    def scalar(self, node, target, args, kwargs):
        """A node computing a Python scalar (SymInt arithmetic, sym_size): evaluate it."""
        if target in (torch.ops.aten.sym_size.int, torch.ops.aten.sym_numel.default,
                      torch.ops.aten.sym_stride.int):
            shape = args[0].shape
            if target is torch.ops.aten.sym_numel.default:
                return int(np.prod(shape))
            if target is torch.ops.aten.sym_size.int:
                return shape[args[1]]
        flat = _flat(args) + _flat(kwargs)
        if any(isinstance(a, Value) for a in flat):
            raise CompileError(f"fx node {node.name} ({op_name(target)}) computes a Python "
                               "scalar from tensor data (data-dependent)")
        if any(a is None for a in flat) and any(isinstance(a, torch.fx.Node) for a in
                                                _flat(node.args) + _flat(node.kwargs)):
            # a size only a host op's run knows (nonzero's, unique's): an unbacked SymInt
            hosts = ", ".join(f"{name} ({why})" for name, _, why in self.result.refusals)
            raise CompileError(f"fx node {node.name} ({op_name(target)}) computes a Python "
                               "scalar from a size known only at run time (data-dependent)"
                               + (f", after host node(s) {hosts}" if hosts else ""))
        return target(*args, **kwargs)

    @staticmethod
    def refusal(node, target, args, kwargs) -> str | None:
        """Why this node cannot be converted at all (None: try its converter)."""
        if not isinstance(target, torch._ops.OpOverload):
            return f"{op_name(target)} is not an aten op"
        if torch.Tag.nondeterministic_seeded in target.tags and target not in SEEDED_CHECKED:
            return "random op: it draws from torch's generator, so torch runs it"
        if target not in CONVERTERS:
            return f"no braze converter for {op_name(target)}"
        for a in _flat(args) + _flat(kwargs):
            if isinstance(a, Value) and not a.type.static:
                return f"input %{a.name} has a data-dependent shape"
        return None

    def factory(self, target, args, kwargs, val):
        """A deterministic op with no tensor inputs (zeros, arange, full), or one braze has
        no converter for whose tensor inputs are all constants (Swin's shifted-window
        mask: new_zeros, then slice_scatter and copy of counts) -> a constant, computed
        by torch once, now. Ops that mutate an argument are left to run."""
        values = [a for a in _flat(args) + _flat(kwargs) if isinstance(a, Value)]
        if any(not a.is_const for a in values):
            return None
        if values and target._schema.is_mutable:
            return None

        def tensor(a):  # row-major, as the graph's value was (a folded transpose's array
            # is not: aten.view on it raised, and BEiT's graph ran eagerly)
            return (torch.from_numpy(np.array(a.const_value, order="C"))
                    if isinstance(a, Value) else a)

        return self._evaluate(target, _map(args, tensor),
                              {k: _map(v, tensor) for k, v in kwargs.items()}, val)

    def _evaluate(self, target, args, kwargs, val):
        if not isinstance(val, torch.Tensor) or val.numel() > FACTORY_CONST_LIMIT:
            return None
        out = target(*args, **{k: v for k, v in kwargs.items() if k != "device"})
        try:
            arr = out.detach().cpu().numpy()
        except (TypeError, RuntimeError):
            return None  # bf16 and other dtypes numpy lacks: computed at run time
        return self.graph.const(arr, name="const")

    def convert(self, node, target, args, kwargs, val):
        used = frozenset(u.args[1] for u in node.users if u.target is operator.getitem)
        cx = Ctx(self.graph, node.name, target, val, used)
        cx.trainable = self.trainable_values
        cx.arg_vals = [self.val(a) if isinstance(a, torch.fx.Node) else None for a in node.args]
        cx.readers = [(u.target, u.meta.get("val") if self.vals is None else self.vals.get(u))
                      for u in node.users]
        out = CONVERTERS[target](cx, *args, **kwargs)
        _check_types(node, out, val)
        return out

    def host(self, node, target, args, kwargs, val, reason: str):
        inputs: list[Value] = []
        eager_strides = {}
        for n in node.all_input_nodes:
            v, fake = self.env[n], self.val(n)
            if isinstance(v, Value) and isinstance(fake, torch.Tensor):
                eager_strides[v] = tuple(fake.stride())

        def slot(v):
            if isinstance(v, Value):
                inputs.append(v)
                return Slot(len(inputs) - 1)
            return v

        h_args = _map(args, slot)
        h_kwargs = {k: _map(v, slot) for k, v in kwargs.items()}
        picks, types = [], []
        for path, t in _tensor_leaves(val):
            picks.append(path)
            types.append(_ir_type(node, t))
        key = f"{node.name}"
        strides = [eager_strides.get(v) for v in inputs]
        self.result.host_ops[key] = HostOp(target, h_args, h_kwargs, picks, strides)
        n = self.graph.add_node(
            "host", inputs, {"framework": "torch", "domain": "aten", "op_type": op_name(target),
                             "payload": key.encode(), "reason": reason},
            name=node.name, out_names=[node.name] * len(types), out_types=types)
        if not isinstance(val, (tuple, list)):
            return n.outputs[0]
        return _rebuild(val, dict(zip(picks, n.outputs)))


def _ir_type(node: torch.fx.Node, val) -> TensorType:
    """The IR type of a node's (fake) tensor; UnrepresentableGraph where braze has none."""
    try:
        return tensor_type(val)
    except Fallback as e:
        what = "input" if node.op == "placeholder" else op_name(node.target)
        raise UnrepresentableGraph(f"fx node {node.name} ({what}): {e}") from None


def _restride(t, stride):
    """t laid out with the strides eager torch would have given it (a copy if they differ)."""
    if stride is None or not isinstance(t, torch.Tensor) or t.stride() == stride:
        return t
    if not all(isinstance(s, int) for s in stride) or t.dim() != len(stride):
        return t
    layout = torch.empty_strided(t.shape, stride, device="meta")
    if t.is_contiguous() and layout.is_contiguous():
        return t  # strides of size-1 dims differ only: the same layout
    if not torch._prims_common.is_non_overlapping_and_dense_or_false(layout):
        return t  # expanded or overlapping: eager's own layout cannot be rebuilt by a copy
    return torch.empty_strided(t.shape, stride, dtype=t.dtype).copy_(t)


def _has_tensor(val) -> bool:
    return any(True for _ in _tensor_leaves(val))


def _tensor_leaves(val, path=()):
    """(path, tensor) for every tensor in a (nested) result."""
    if isinstance(val, torch.Tensor):
        yield path, val
    elif isinstance(val, (tuple, list)):
        for i, v in enumerate(val):
            yield from _tensor_leaves(v, path + (i,))


def _rebuild(val, by_path: dict, path=()):
    """The result's structure with each tensor replaced by its IR value (None elsewhere)."""
    if isinstance(val, torch.Tensor):
        return by_path[path]
    if isinstance(val, (tuple, list)):
        return tuple(_rebuild(v, by_path, path + (i,)) for i, v in enumerate(val))
    return None


def _flat(x) -> list:
    if isinstance(x, dict):
        return [a for v in x.values() for a in _flat(v)]
    if isinstance(x, (list, tuple)):
        return [a for v in x for a in _flat(v)]
    return [x]


def _map(x, fn):
    if isinstance(x, (list, tuple)):
        return type(x)(_map(v, fn) for v in x)
    return fn(x)


def _check_types(node, out, val) -> None:
    """A converter's result must have exactly the types aten's fake value states."""
    for path, t in _tensor_leaves(val):
        v = out
        for i in path:
            v = v[i] if isinstance(v, tuple) else None
        if v is None and path:
            continue  # an output the converter does not produce: unused (checked there)
        want = tensor_type(t)
        if not isinstance(v, Value) or v.type != want:
            got = v.type if isinstance(v, Value) else type(v).__name__
            raise Fallback(f"converter produced {got} where aten gives {want} (braze bug)")
