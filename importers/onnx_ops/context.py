"""What a converter sees: one ONNX node, its input Values, and IR builders that fold.

`NodeContext.op` builds one IR node and folds it on the spot when every input
is a `const` (evaluated with the op's numpy reference), so shape subgraphs
(Shape -> Gather -> Concat -> Reshape) become constants during import and the
ops that need static attributes (Reshape, Expand, Slice, Pad, Tile) find them.
"""

from __future__ import annotations

import functools

import numpy as np
from onnx import NodeProto, helper

from compiler import dtypes
from compiler.errors import InvalidModelError
from compiler.ir import Graph, Node, Value
from compiler.ops import get_op
from importers.onnx_load import node_name
from importers.onnx_ops import Fallback
from importers.onnx_types import NUMPY_DTYPES

# Fold a node only if its output has at most this many elements: enough for
# every shape computation and small weight transforms, and it bounds the memory
# and time import spends evaluating constant subgraphs in numpy.
FOLD_LIMIT = 1_000_000


def const_array(v: Value | None) -> np.ndarray | None:
    """The array of a value produced by a `const` node, else None."""
    if v is not None and v.producer is not None and v.producer.op == "const":
        return v.producer.attrs["value"]
    return None


class NodeContext:
    """One ONNX node being converted: attributes, inputs, and folding IR builders."""

    def __init__(self, graph: Graph, node: NodeProto, version: int, inputs: list,
                 describe: str):
        self.graph = graph
        self.node = node
        self.version = version
        self.inputs = inputs
        self.describe = describe
        self.attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        self.name = node_name(node)
        self._hint = (node.output[0] if node.output and node.output[0] else node.op_type)

    # -- reading the ONNX node --------------------------------------------

    def attr(self, name: str, default=None):
        """An attribute's value (strings decoded), or `default` when absent."""
        value = self.attrs.get(name, default)
        if isinstance(value, bytes):
            return value.decode()
        return value

    def input(self, i: int) -> Value | None:
        """The i-th input, or None when absent or given as ""."""
        return self.inputs[i] if i < len(self.inputs) else None

    @property
    def x(self) -> Value:
        return self.inputs[0]

    def wants_output(self, i: int) -> bool:
        """Whether the node's i-th output is requested (present and not "")."""
        return i < len(self.node.output) and self.node.output[i] != ""

    def const_input(self, i: int, what: str) -> np.ndarray | None:
        """The constant value of input i (None if absent); Fallback if not constant."""
        v = self.input(i)
        if v is None:
            return None
        arr = const_array(v)
        if arr is None:
            raise Fallback(f"its {what} input is not a constant", wants=v)
        return arr

    def ints_input(self, i: int, what: str) -> list[int] | None:
        """A constant integer list input (None if absent)."""
        arr = self.const_input(i, what)
        return None if arr is None else [int(a) for a in arr.reshape(-1)]

    def axis(self, axis: int, rank: int) -> int:
        """A possibly negative axis made non-negative; InvalidModelError if out of range
        (onnxruntime refuses such a model)."""
        if not -rank <= axis < max(rank, 1):
            raise InvalidModelError(f"{self.describe}: axis {axis} out of range for rank "
                                    f"{rank}")
        return axis + rank if axis < 0 else axis

    # -- building IR --------------------------------------------------------

    def op(self, name: str, *inputs: Value, **attrs) -> Value:
        """Append one single-output IR op (folded to a const if all inputs are)."""
        opdef = get_op(name)
        node = Node(name, list(inputs), opdef.normalize_attrs(attrs, self.name),
                    self.name)
        types = opdef.infer(node)
        arrays = [const_array(v) for v in inputs]
        if (len(types) == 1 and all(a is not None for a in arrays)
                and types[0].dtype in NUMPY_DTYPES and types[0].size <= FOLD_LIMIT):
            return self.const(opdef.evaluate(node, arrays)[0])
        return self.graph.add_node(name, inputs, node.attrs, name=self.name,
                                   out_names=[f"{self._hint}.{name}"], out_types=types).output

    def const(self, array) -> Value:
        """A `const` node holding `array`."""
        return self.graph.const(np.asarray(array), name=f"{self._hint}.c")

    def scalar(self, value, dtype: str) -> Value:
        """A rank-0 constant of an IR dtype."""
        return self.const(np.array(value, dtype=dtypes.to_numpy(dtype)))

    def cast(self, v: Value, dtype: str) -> Value:
        """`v` cast to dtype (itself if it already has it)."""
        return v if v.dtype == dtype else self.op("cast", v, to=dtype)

    def reshape(self, v: Value, shape) -> Value:
        """`v` reshaped (itself if the shape is already right)."""
        shape = tuple(int(d) for d in shape)
        return v if v.shape == shape else self.op("reshape", v, shape=shape)

    def transpose(self, v: Value, perm) -> Value:
        perm = tuple(int(p) for p in perm)
        return v if perm == tuple(range(len(perm))) else self.op("transpose", v, perm=perm)

    def reduce(self, kind: str, v: Value, axes, keepdims: bool = True) -> Value:
        """reduce_<kind> over `axes` (sorted and de-duplicated here)."""
        return self.op(f"reduce_{kind}", v, axes=tuple(sorted(set(axes))), keepdims=keepdims)

    def mean(self, v: Value, axes, keepdims: bool = True) -> Value:
        """Arithmetic mean over axes, as reduce_sum / count."""
        count = int(np.prod([v.shape[a] for a in axes])) if axes else 1
        total = self.reduce("sum", v, axes, keepdims)
        return self.op("div", total, self.scalar(count, v.dtype))


def half_as_float(fn):
    """A converter whose kernel is float32 only (fused attention, the recurrence) run on
    f32 casts of its f16 inputs, its float outputs cast back to f16: the node computes
    in f32 and rounds once, as onnxruntime runs f16 nodes it has no f16 kernel for.
    Elsewhere f16 needs no such wrapper: compiler/passes/widen.py computes every f16 op
    as f32 after import."""

    @functools.wraps(fn)
    def convert(cx: NodeContext) -> list:
        if not any(v is not None and v.dtype == "f16" for v in cx.inputs):
            return fn(cx)
        cx.inputs = [cx.cast(v, "f32") if v is not None and v.dtype == "f16" else v
                     for v in cx.inputs]
        return [cx.cast(o, "f16") if o is not None and o.dtype == "f32" else o
                for o in fn(cx)]

    return convert
