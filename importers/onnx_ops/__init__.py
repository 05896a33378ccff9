"""The ONNX converter table: one entry per (domain, op_type) and schema version range.

A converter is `fn(cx: NodeContext) -> list[Value]` (one Value per ONNX output,
in order). It is registered for the ONNX schema versions it was written for:
`@converter("Softmax", 13)` covers every schema version of Softmax from 13 up
to NEWEST_CHECKED. The importer resolves the node's schema version at the
model's opset (`onnx.defs.get_schema(op, opset).since_version`) and looks it up
exactly; a version no entry covers (older or newer) is a host node with that
reason, never a guess at a neighbouring converter (unlike TVM's fallback to
the oldest `_impl_vN`). A converter refuses an instance it cannot express by
raising `Fallback(reason)`; the node then runs on the host framework.
"""

from __future__ import annotations

from typing import Callable

# The newest ONNX opset whose op definitions these converters were checked
# against: a schema version introduced after it gets no converter until someone
# reads its changes.
NEWEST_CHECKED = 28

Converter = Callable[..., list]
_TABLE: dict[tuple[str, str], list[tuple[int, int, Converter]]] = {}


class Fallback(Exception):
    """A converter cannot express this node in braze's IR; `reason` says why."""

    def __init__(self, reason: str, wants=None):
        super().__init__(reason)
        self.reason = reason
        self.wants = wants  # the Value whose constant value would have let it convert


def converter(op_type: str, since: int, until: int = NEWEST_CHECKED, domain: str = ""):
    """Register `fn` for schema versions since..until (inclusive) of domain.op_type."""

    def register(fn: Converter) -> Converter:
        entries = _TABLE.setdefault((domain, op_type), [])
        for lo, hi, other in entries:
            if lo <= until and since <= hi:
                raise ValueError(f"{op_type}: versions {since}..{until} overlap "
                                 f"{other.__name__} ({lo}..{hi})")
        entries.append((since, until, fn))
        return fn

    return register


def lookup(domain: str, op_type: str, version: int) -> tuple[Converter | None, str]:
    """The converter for this schema version, or (None, the reason there is none)."""
    entries = _TABLE.get((domain, op_type))
    qualified = f"{domain}.{op_type}" if domain else op_type
    if not entries:
        return None, f"no braze converter for {qualified}"
    for lo, hi, fn in entries:
        if lo <= version <= hi:
            return fn, ""
    covered = ", ".join(f"{lo}..{hi}" for lo, hi, _ in sorted(entries, key=lambda e: e[0]))
    return None, f"no braze converter for {qualified} version {version} (covers {covered})"


def table() -> dict[tuple[str, str], list[tuple[int, int, Converter]]]:
    """A copy of the converter table (for coverage reports)."""
    return {k: list(v) for k, v in _TABLE.items()}


# The converter modules register themselves; import order is irrelevant.
from importers.onnx_ops import (  # noqa: E402,F401
    attention,
    causal_conv,
    einsum,
    elementwise,
    activations,
    linalg,
    losses,
    nn,
    normalization,
    movement,
    positional,
    quantize,
    reduce,
    resize,
    rnn,
    selection,
    shape,
)
