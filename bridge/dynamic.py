"""A dynamic length without a compile per length: buckets, padding and slicing (ONNX).

An ONNX input dim declared with a name (`dim_param`, e.g. "seq") is symbolic. Once a
symbol is dynamic (Options.dynamic: "auto", when a third distinct value of it is
called, EXACT_LENGTHS; or named), a call whose exact shapes are not compiled runs the
specialization of its bucket: the smallest power of two >= n (BUCKET_BASE), at least
MIN_BUCKET. The inputs are zero-padded to the bucket along that symbol's axes, a bool
`valid` input says which positions are real, and the outputs' length axes are sliced
back to n. compiler/passes/padding.py
proves that padding cannot change a valid output (rewriting reductions, contractions
and attention over the length so that padded positions count as their identity), or
refuses with a reason: then that length compiles exactly, as without this module.

Lengths 1..512 need at most 8 bucket compiles (4, 8, ..., 512); with "auto", two more
for the first two lengths, compiled exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.passes.padding import Padding

BUCKET_BASE = 2  # buckets are powers of two: at most log2(max length) + 1 compiles
# The smallest bucket: lengths 1..4 share it (padding a handful of rows costs nothing
# worth a compile), and its probe (3) stays clear of the passes' size-1 special cases.
MIN_BUCKET = 4
# With "auto", the first distinct values of a symbol compile exactly (a model called
# with two shapes, two fixed lengths or batch sizes, keeps exact code for both, never
# paying for padding); the next one shows the dim really varies and starts the buckets.
# Lengths 1..512 then take at most EXACT_LENGTHS + 8 compiles.
EXACT_LENGTHS = 2
AUTO, OFF = "auto", "off"  # Options.dynamic's words (any other string names a symbol)


def bucket_of(n: int) -> int:
    """The bucket length serving length n: the smallest power of BUCKET_BASE >= n, at
    least MIN_BUCKET."""
    b = MIN_BUCKET
    while b < n:
        b *= BUCKET_BASE
    return b


def probe_length(length: int) -> int:
    """The length the padding pass compares the bucket's graph with: one less, so that a
    size threshold of the passes at a power of two (constants folded or merged "up to"
    4096 elements, 1 MiB) falls on the same side for both."""
    return length - 1


def probe_lengths(length: int) -> list[int]:
    """Every length the bucket's graph is compared with: probe_length, and the shortest
    length the bucket serves (the previous bucket + 1; 2 for the first, whose size-1
    case the passes special-case) where that is another, so a constant built from the
    length is checked at both ends of the lengths it will run."""
    shortest = length // BUCKET_BASE + 1 if length > MIN_BUCKET else 2
    return [probe_length(length)] + ([shortest] if shortest < probe_length(length) else [])


def symbolic_dims(model) -> dict:
    """symbol -> [(input name, axis)] for the graph inputs' named dims (an unnamed
    unknown dim is its own symbol, '<input>:<axis>')."""
    inits = {t.name for t in model.graph.initializer}
    found: dict = {}
    for vi in model.graph.input:
        if vi.name in inits or vi.type.WhichOneof("value") != "tensor_type":
            continue
        for axis, d in enumerate(vi.type.tensor_type.shape.dim):
            if not d.HasField("dim_value"):
                found.setdefault(d.dim_param or f"{vi.name}:{axis}", []).append((vi.name, axis))
    return found


class LengthPolicy:
    """Which symbol, if any, a call is bucketed along (Options.dynamic)."""

    def __init__(self, model, dynamic: str):
        self.mode = dynamic
        self.symbols = symbolic_dims(model) if dynamic != OFF else {}
        self.seen: dict = {s: set() for s in self.symbols}
        if dynamic not in (AUTO, OFF) and dynamic not in self.symbols:
            from compiler.errors import BrazeError

            raise BrazeError(f"dynamic={dynamic!r} names no symbolic input dim of the "
                             f"model; its symbolic dims are {sorted(self.symbols) or 'none'}")

    def length(self, shapes: dict) -> tuple[str, int] | None:
        """(symbol, n) to bucket this call along, or None (exact shapes)."""
        values = {s: {shapes[i][a] for i, a in where if i in shapes}
                  for s, where in self.symbols.items()}
        for s, v in values.items():
            if len(v) == 1:
                self.seen[s] |= v
        for s in self._dynamic():
            if len(values[s]) == 1:
                n = next(iter(values[s]))
                return s, n
        return None

    def _dynamic(self) -> list:
        if self.mode == AUTO:
            return [s for s, v in self.seen.items() if len(v) > EXACT_LENGTHS]
        return [self.mode] if self.mode in self.symbols else []

    def with_length(self, shapes: dict, symbol: str, length: int) -> dict:
        """The shapes with the symbol's dims set to `length`."""
        out = {k: list(v) for k, v in shapes.items()}
        for name, axis in self.symbols[symbol]:
            if name in out:
                out[name][axis] = length
        return {k: tuple(v) for k, v in out.items()}


# -- running a padded specialization -------------------------------------------------

@dataclass(frozen=True)
class PadPlan:
    """How to call a padded specialization: the compiler's Padding, in JSON too."""

    padding: Padding

    def to_json(self) -> dict:
        p = self.padding
        return {"length": p.length, "valid": p.valid,
                "inputs": {k: list(v) for k, v in p.inputs.items()},
                "outputs": [list(v) for v in p.outputs]}

    @classmethod
    def from_json(cls, d: dict) -> PadPlan:
        return cls(Padding(int(d["length"]),
                           {str(k): tuple(int(a) for a in v) for k, v in d["inputs"].items()},
                           [tuple(int(a) for a in v) for v in d["outputs"]], str(d["valid"])))

    def serves(self, shapes: dict, saved: dict) -> int | None:
        """n when inputs of these shapes run on this plan (saved: its bucket shapes)."""
        ns = set()
        if set(shapes) != set(saved):
            return None
        for name, shape in shapes.items():
            axes = self.padding.inputs.get(name, ())
            want = saved[name]
            if len(shape) != len(want):
                return None
            for k, (d, w) in enumerate(zip(shape, want)):
                if k in axes:
                    ns.add(d)
                elif d != w:
                    return None
        if len(ns) != 1:
            return None
        n = next(iter(ns))
        return n if 1 <= n <= self.padding.length else None

    def run(self, executable, input_names: list, given: dict, n: int) -> list:
        """Pad the inputs to the bucket, run, slice the outputs back to n."""
        p = self.padding
        valid = np.arange(p.length) < n
        args = [valid if name == p.valid else _padded(given[name], p.inputs.get(name, ()),
                                                      p.length)
                for name in input_names]
        outs = executable.run(args)
        return [_sliced(o, axes, n) for o, axes in zip(outs, p.outputs)]


def _padded(a: np.ndarray, axes: tuple, length: int) -> np.ndarray:
    if not axes:
        return a
    widths = [(0, length - d if k in axes else 0) for k, d in enumerate(a.shape)]
    return np.pad(a, widths)


def _sliced(o, axes: tuple, n: int):
    if not axes:
        return o
    index = tuple(slice(0, n) if k in axes else slice(None) for k in range(o.ndim))
    return np.ascontiguousarray(o[index])
