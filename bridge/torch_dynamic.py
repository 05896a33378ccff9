"""Buckets for torch.compile's dynamic graphs: one compile per power-of-two length.

Once dynamo marks a dim dynamic (its automatic dynamic shapes, after a second shape;
or `dynamic=True`), braze receives an aten graph whose placeholders have symbolic
sizes, and would compile it for every concrete length. Where the inference graph's
symbolic sizes are one symbol s, used as a whole tensor dim (s, not 2*s) or as an int
argument (any expression of s), a call with s = n runs the specialization of n's bucket
(bridge/dynamic.py: bucket_of): tensors zero-padded along their s dims, int arguments
evaluated at the bucket, a bool `valid` mask input, outputs sliced back to n. The
graph is imported at the bucket and at bucket - 1, and compiler/passes/padding.py
proves padding safe or refuses (then n compiles exactly, as before, logged).
"""

from __future__ import annotations

import torch

from bridge.dynamic import PadPlan, probe_lengths
from compiler.passes.padding import PaddingRefused


class LengthSymbol:
    """The one symbol of an aten graph's placeholders, and where it appears."""

    def __init__(self, symbol, dims: dict, ints: dict):
        self.symbol = symbol
        self.dims = dims  # placeholder index -> axes whose size is the symbol itself
        self.ints = ints  # placeholder index -> the sympy expression of an int argument

    @classmethod
    def of(cls, gm: torch.fx.GraphModule) -> LengthSymbol | None:
        """The graph's length symbol, or None (no symbol, several, or one folded into a
        dim as an expression: not bucketed)."""
        symbols, dims, ints = set(), {}, {}
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        for i, node in enumerate(placeholders):
            v = node.meta.get("val")
            if isinstance(v, torch.SymInt):
                ints[i] = v.node.expr
                symbols |= v.node.expr.free_symbols
            elif isinstance(v, torch.Tensor):
                for k, d in enumerate(v.shape):
                    if isinstance(d, torch.SymInt):
                        if not d.node.expr.is_Symbol:
                            return None
                        symbols.add(d.node.expr)
                        dims.setdefault(i, []).append(k)
        if len(symbols) != 1:
            return None
        return cls(next(iter(symbols)), {i: tuple(a) for i, a in dims.items()}, ints)

    def length(self, args) -> int | None:
        """n for these arguments, when every symbolic size agrees on it."""
        found = {args[i].shape[k] for i, axes in self.dims.items() for k in axes}
        if len(found) != 1:
            return None
        n = next(iter(found))
        try:
            if any(args[i] != self.value(i, n) for i in self.ints):
                return None
        except (TypeError, ValueError):  # an int argument sympy cannot evaluate to a number
            return None
        return n

    def signature(self, args, length: int, order: tuple) -> tuple:
        """The specialization key of the bucket `length` (GraphRunner._signature's form
        with the length's sizes and ints at the bucket), marked as padded."""
        key: list = ["@padded", length, len(args)]
        for i in order:
            a = args[i]
            if i in self.dims:
                axes = self.dims[i]
                key.append((tuple(length if k in axes else d for k, d in enumerate(a.shape)),
                            a.dtype))
            elif i in self.ints:
                key.append(self.value(i, length))
            elif isinstance(a, torch.Tensor):
                key.append((tuple(a.shape), a.dtype))
            else:
                key.append(a)
        return tuple(key)

    def value(self, i: int, n: int) -> int:
        return int(self.ints[i].subs(self.symbol, n))

    def at(self, args, length: int) -> list:
        """Arguments at `length`: zero tensors for those with length dims (only their
        shapes are read when compiling), int arguments evaluated there."""
        out = list(args)
        for i, axes in self.dims.items():
            shape = [length if k in axes else d for k, d in enumerate(args[i].shape)]
            out[i] = torch.zeros(shape, dtype=args[i].dtype)
        for i in self.ints:
            out[i] = self.value(i, length)
        return out


class PaddedRun:
    """A bucket's executable with what running it takes: which arguments it reads, its
    PadPlan and the fx outputs."""

    def __init__(self, runner, symbol: LengthSymbol, args, length: int):
        from bridge.torch_backend import _frozen_arrays, _TorchSteps, concrete_vals
        from compiler import driver
        from importers.fx import import_fx
        from compiler.passes.padding import pad_length
        from runtime.executable import build_executable

        opts = runner.opts
        frozen = _frozen_arrays(runner.static, args)
        imported = []
        for at in (length, *probe_lengths(length)):
            at_args = symbol.at(args, at)
            imp = import_fx(runner.gm, at_args, frozen, concrete_vals(runner.gm, at_args),
                            runner.name, trainable=runner.weights)
            driver.optimize(imp.graph, opts.target)
            imported.append(imp)
        bucket, *probes = imported
        if any(o[0] == "literal" for o in bucket.outputs):
            raise PaddingRefused("the graph returns sizes or scalars, which would be the "
                                 "bucket's")
        others = [(p.graph, n) for p, n in zip(probes, probe_lengths(length))]
        padding = pad_length(bucket.graph, others[0][0], length, others[0][1],
                             more=tuple(others[1:]))
        plan = driver.cut(bucket.graph, opts.target, opts.allow_fallback)
        plan.check()
        self.pad_plan = PadPlan(padding)
        self.imported = bucket
        self.names = [v.name for v in bucket.graph.inputs]  # last: the valid mask
        self.parts = _TorchSteps(runner, bucket.host_ops).parts(plan)
        self.executable = build_executable(plan.graph, plan.clusters,
                                           [p.step for p in self.parts])

    def run(self, args, n: int) -> list:
        """Pad the tensors to the bucket, run, slice the outputs back to n."""
        from runtime.fallback_torch import to_torch

        p = self.pad_plan.padding
        ins = [_padded(args[i], p.inputs.get(name, ()), p.length)
               for name, i in zip(self.names, self.imported.input_indices)]
        outs = self.executable.run(ins + [torch.arange(p.length) < n])
        result = []
        for spec in self.imported.outputs:
            t, axes = to_torch(outs[spec[1]]), p.outputs[spec[1]]
            if axes:
                t = t[tuple(slice(0, n) if k in axes else slice(None)
                            for k in range(t.ndim))].clone()
            elif spec[2]:
                t = t.clone()
            result.append(t)
        return result


def _padded(t: torch.Tensor, axes: tuple, length: int) -> torch.Tensor:
    if not axes:
        return t
    out = t.new_zeros([length if k in axes else d for k, d in enumerate(t.shape)])
    out[tuple(slice(0, d) for d in t.shape)] = t
    return out


