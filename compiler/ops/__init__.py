"""The closed op set of braze's IR: one registry, one `OpDef` per op.

Each OpDef states its family, arity, attribute schema, shape/dtype inference
and numpy reference semantics (`evaluate`, used by constant folding and as the
oracle in tests). Importers only ever build these ops; codegen only ever
lowers these ops. Families (tinygrad's GroupOp, XLA's opcode categories):

  ELEMENTWISE  numpy-broadcasting unary/binary/ternary maps, compare, select, cast
  REDUCTION    reduce_* over a set of axes, argmax/argmin
  MOVEMENT     reshape, transpose, broadcast, slice, concat, pad, gather
  CONTRACTION  matmul, conv                ("library-class": own kernels; also attention,
               recurrence and scatter)
  POOL         max_pool, avg_pool          ("library-class")
  CONST        const
  HOST         host: an opaque framework op run by the host framework
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from compiler.ir import IRError, Node, TensorType


class Family(enum.Enum):
    ELEMENTWISE = "elementwise"
    REDUCTION = "reduction"
    MOVEMENT = "movement"
    CONTRACTION = "contraction"
    POOL = "pool"
    CONST = "const"
    HOST = "host"


REQUIRED = object()

# attribute kinds -> a coercion to the canonical stored form
_COERCE: dict[str, Callable] = {
    "int": lambda v: int(v),
    "float": lambda v: float(v),
    "bool": lambda v: bool(v),
    "str": lambda v: str(v),
    "bytes": lambda v: bytes(v),
    "ints": lambda v: tuple(int(x) for x in v),
    "floats": lambda v: tuple(float(x) for x in v),
    "strs": lambda v: tuple(str(x) for x in v),
    "array": lambda v: v,
    "dtype": lambda v: str(v),
    "types": lambda v: tuple(v),
}


@dataclass
class OpDef:
    """What the IR knows about one op."""

    name: str
    family: Family
    arity: tuple[int, int | None]  # (min, max) inputs; max None = variadic
    infer_fn: Callable[[Node], list[TensorType]]
    eval_fn: Callable[..., list[np.ndarray]] | None
    attrs: dict[str, tuple[str, object]] = field(default_factory=dict)
    check_fn: Callable[[Node], None] | None = None
    # what each format does with the op, attached by the formats' tables
    # (compiler/ops/facets.py): facet -> entry, and facet -> foreign names imported as it
    facets: dict[str, object] = field(default_factory=dict, repr=False)
    imports: dict[str, set] = field(default_factory=dict, repr=False)

    def normalize_attrs(self, attrs: dict, node_name: str = "") -> dict:
        """Fill defaults, coerce to canonical types, reject unknown/missing attributes."""
        out = {}
        for key in attrs:
            if key not in self.attrs:
                raise IRError(f"{self.name} {node_name!r}: unknown attribute {key!r}")
        for key, (kind, default) in self.attrs.items():
            if key in attrs:
                try:
                    out[key] = _COERCE[kind](attrs[key])
                except (TypeError, ValueError) as e:
                    raise IRError(f"{self.name}: attribute {key} must be {kind}: {e}") from None
            elif default is REQUIRED:
                raise IRError(f"{self.name} {node_name!r}: missing attribute {key!r}")
            else:
                out[key] = default
        return out

    def validate(self, node: Node) -> None:
        """Arity and attribute checks (shape checks happen in infer)."""
        lo, hi = self.arity
        n = len(node.inputs)
        if n < lo or (hi is not None and n > hi):
            want = f"{lo}" if lo == hi else f"{lo}..{hi if hi is not None else 'n'}"
            raise IRError(f"{node.describe()} takes {want} inputs, got {n}")
        if set(node.attrs) != set(self.attrs):
            raise IRError(f"{node.describe()} has attributes {sorted(node.attrs)}, "
                          f"expected {sorted(self.attrs)}")
        if self.check_fn:
            self.check_fn(node)

    def infer(self, node: Node) -> list[TensorType]:
        self.validate(node)
        return self.infer_fn(node)

    def evaluate(self, node: Node, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """numpy reference semantics: the oracle for folding and tests."""
        if self.eval_fn is None:
            raise IRError(f"{node.describe()} has no reference evaluation")
        return self.eval_fn(node, *inputs)


_REGISTRY: dict[str, OpDef] = {}


def register(opdef: OpDef) -> OpDef:
    if opdef.name in _REGISTRY:
        raise ValueError(f"op {opdef.name} registered twice")
    _REGISTRY[opdef.name] = opdef
    return opdef


def get_op(name: str) -> OpDef:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise IRError(f"unknown op {name!r}") from None


def ops_in(family: Family) -> list[str]:
    return [n for n, d in _REGISTRY.items() if d.family is family]


# The op definitions register themselves; import order is irrelevant.
from compiler.ops import elementwise, reduction, movement, contraction, misc, recurrence  # noqa: E402,F401,E501
from compiler.ops import scatter  # noqa: E402,F401
