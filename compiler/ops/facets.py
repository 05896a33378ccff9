"""What each format does with an IR op, hung off the op registry (compiler/ops).

Every format's table stays beside the code that uses it (the ONNX exporter's functions
in runtime/fallback_onnx.py, the importers' op maps, the torch host step's functions,
the register epilogue's vector ops), but is attached here when its module loads:

    _EXPORTERS = facets.attach("onnx_export", {...})        IR op -> how it is written
    UNARY = facets.attach_imports("onnx_import", {...})     foreign name -> IR op

`attach` and `attach_imports` refuse a key or target that is not a registered op (a
typo, or an op removed from the IR, fails when the table's module is imported, not
when a model first needs it), and record the entry on the op's OpDef. So one place,
`describe(op)`, says what every format does with an op, and
tests/compiler/test_op_tables.py walks the registry: every op has each WRITERS facet
or a stated reason (STATED) it has none, and import and export name each other.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from compiler.ir import IRError
from compiler.ops import _REGISTRY, OpDef, get_op

# facets an op is written by: facet -> where its table lives
WRITERS = {
    "onnx_export": "runtime/fallback_onnx.py: _EXPORTERS (the host step's ONNX export)",
    "torch_host": "runtime/fallback_torch.py: _IR_OPS (the torch front end's host step)",
}
# facets that read foreign ops into IR ops: facet -> where its tables live
READERS = {
    "onnx_import": "importers/onnx_ops/elementwise.py (UNARY, BINARY, VARIADIC)",
    "fx_import": "importers/fx_elementwise.py (_UNARY, _PREDICATE, _ARITH, _COMPARE, "
                 "_LOGICAL)",
}
# facets that only some ops have (no op must have them): facet -> where
OPTIONAL = {
    "cpu_vector": "compiler/codegen/register_ops.py: REGISTER_OPS (an epilogue op on "
                  "whole accumulator vectors)",
}

# Ops that have no entry in a WRITERS facet, and why (the test accepts these only).
STATED = {
    ("const", "onnx_export"): "a constant is written as an initializer, not a node",
    ("host", "onnx_export"): "a host node is the framework's own op, written back as itself",
    ("const", "torch_host"): "a constant is a tensor the step is given",
    ("host", "torch_host"): "a host node is the framework's own op, run as itself",
    ("atan2", "onnx_export"): "ONNX has no Atan2: only the torch importer makes it, and "
                              "the torch front end's host steps run on torch",
    ("hypot", "onnx_export"): "ONNX has no Hypot: only the torch importer makes it, and "
                              "the torch front end's host steps run on torch",
}

# The modules whose import attaches the tables (`load_all`); the torch ones only where
# torch is installed.
_MODULES = ("runtime.fallback_onnx", "importers.onnx_ops.elementwise",
            "compiler.codegen.register_ops")
_TORCH_MODULES = ("runtime.fallback_torch", "importers.fx_elementwise")


def _facet(name: str) -> None:
    if name not in WRITERS and name not in READERS and name not in OPTIONAL:
        raise ValueError(f"unknown op facet {name!r}")


def _op(name, facet: str) -> OpDef:
    try:
        return get_op(name)
    except IRError:
        raise ValueError(f"{facet} table names {name!r}, which is not an IR op "
                         "(compiler/ops registers the op set)") from None


def attach(facet: str, table: Mapping) -> Mapping:
    """Record `table` (IR op -> this format's entry for it) on the ops; returns it."""
    _facet(facet)
    for name, entry in table.items():
        _op(name, facet).facets[facet] = entry
    return table


def attach_imports(facet: str, table: Mapping) -> Mapping:
    """Record `table` (foreign op name -> IR op, or (IR op, ...) tuples; None for a
    name this format refuses) as the names each op is imported from; returns it."""
    _facet(facet)
    for foreign, target in table.items():
        name = target[0] if isinstance(target, tuple) else target
        if name is None:
            continue
        _op(name, facet).imports.setdefault(facet, set()).add(_foreign_name(foreign))
    return table


def _foreign_name(foreign) -> str:
    """An ONNX op type as it is; a torch OpOverload as its packet's name (aten.mul.Tensor
    -> "mul")."""
    packet = getattr(foreign, "overloadpacket", None)
    return packet.__name__ if packet is not None else str(foreign)


def load_all(torch: bool = True) -> None:
    """Import every module that attaches a table (the torch ones if `torch`)."""
    for module in _MODULES + (_TORCH_MODULES if torch else ()):
        importlib.import_module(module)


def entry(op: str, facet: str):
    """`facet`'s entry for `op`, or None."""
    return get_op(op).facets.get(facet)


def imported_from(op: str, facet: str) -> frozenset:
    """The foreign names `facet` imports as `op`."""
    return frozenset(get_op(op).imports.get(facet, ()))


def missing(facet: str) -> list[str]:
    """Ops with no `facet` entry and no STATED reason for it."""
    return sorted(name for name, d in _REGISTRY.items()
                  if facet not in d.facets and (name, facet) not in STATED)


def describe(op: str) -> str:
    """What every format does with `op`, one line per facet (for people and tests)."""
    d = get_op(op)
    lines = [f"{op} ({d.family.value})"]
    for facet in WRITERS:
        e = d.facets.get(facet)
        why = STATED.get((op, facet))
        lines.append(f"  {facet}: " + (getattr(e, "__name__", repr(e)) if e is not None
                                        else f"none: {why}" if why else "MISSING"))
    for facet in READERS:
        names = sorted(d.imports.get(facet, ()))
        lines.append(f"  {facet}: {', '.join(names) if names else '-'}")
    for facet in OPTIONAL:
        if facet in d.facets:
            lines.append(f"  {facet}: yes")
    return "\n".join(lines)
