"""Host clusters of torch graphs, run with eager torch ops; tensor hand-offs without copies.

A host cluster's sub-graph holds IR primitives that braze's codegen left to the
host (contractions, pooling, dtypes it does not compile) and `host` nodes that
carry a real aten op (see importers/fx.py: `HostOp`). `TorchHostStep` runs it
node by node: each IR op through the torch function in `_IR_OPS` (the same
semantics as the op's numpy reference in compiler/ops), each host node by
calling its aten op. It takes and returns torch tensors; braze's kernels take
numpy arrays: `to_numpy` and `to_torch` share memory (contiguous only when a
kernel needs it).
"""

from __future__ import annotations

import logging
import warnings
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from compiler import dtypes
from compiler.errors import BrazeError, host_op_error
from compiler.ir import Graph, Node
from compiler.ops import facets

log = logging.getLogger("braze")


def torch_dtype(dtype: str) -> torch.dtype:
    """The torch dtype of an IR element type."""
    if dtype == "bf16":
        return torch.bfloat16
    return torch.from_numpy(np.empty(0, dtypes.to_numpy(dtype))).dtype


def to_torch(x):
    """A torch view of a numpy array (no copy; read-only arrays are shared too: braze's
    graphs never write into an input)."""
    if isinstance(x, torch.Tensor) or not isinstance(x, np.ndarray):
        return x
    if not x.flags.writeable:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(x)
    if x.dtype.byteorder not in "=|":
        x = x.astype(x.dtype.newbyteorder("="))
    return torch.from_numpy(x)


def to_numpy(x):
    """A C-contiguous numpy view of a CPU tensor (copied only when not contiguous)."""
    if not isinstance(x, torch.Tensor):
        return x
    if x.requires_grad:  # (detach() builds a new tensor: only where numpy() needs it)
        x = x.detach()
    if not x.is_contiguous():
        x = x.contiguous()
    if x.is_conj():
        x = x.resolve_conj()
    if x.is_neg():
        x = x.resolve_neg()
    return x.numpy()


# -- IR ops in torch --------------------------------------------------------

_UNARY = {
    "neg": torch.neg, "abs": torch.abs, "sign": torch.sign, "exp": torch.exp,
    "expm1": torch.expm1, "log": torch.log, "log1p": torch.log1p, "sqrt": torch.sqrt,
    "reciprocal": torch.reciprocal, "sin": torch.sin, "cos": torch.cos, "tan": torch.tan,
    "asin": torch.asin, "acos": torch.acos, "atan": torch.atan, "sinh": torch.sinh,
    "cosh": torch.cosh, "tanh": torch.tanh, "asinh": torch.asinh, "acosh": torch.acosh,
    "atanh": torch.atanh, "sigmoid": torch.sigmoid, "erf": torch.erf, "floor": torch.floor,
    "ceil": torch.ceil, "round": torch.round, "isnan": torch.isnan, "isinf": torch.isinf,
    "not": torch.logical_not, "bitnot": torch.bitwise_not,
}

_BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "pow": torch.pow,
    "max": torch.maximum, "min": torch.minimum, "mod": torch.remainder, "fmod": torch.fmod,
    "atan2": torch.atan2, "hypot": torch.hypot,
    "and": torch.logical_and, "or": torch.logical_or, "xor": torch.logical_xor,
    "bitand": torch.bitwise_and, "bitor": torch.bitwise_or, "bitxor": torch.bitwise_xor,
    "shl": torch.bitwise_left_shift, "shr": torch.bitwise_right_shift,
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt,
    "ge": torch.ge,
}

_REDUCE = {"reduce_sum": torch.sum, "reduce_max": torch.amax, "reduce_min": torch.amin}


def _div(node, a, b):
    if a.dtype.is_floating_point or a.dtype.is_complex:
        return torch.div(a, b)
    return torch.div(a, b, rounding_mode="trunc")  # IR integer div truncates (C, ONNX)


def _reduce(node, x):
    axes = node.attrs["axes"]
    if not axes:
        return x
    keep = node.attrs["keepdims"]
    if node.op == "reduce_prod":
        for a in sorted(axes, reverse=True):
            x = torch.prod(x, dim=a, keepdim=keep)
        return x.to(x.dtype)
    return _REDUCE[node.op](x, dim=axes, keepdim=keep).to(x.dtype)


def _arg(node, x):
    axis, keep = node.attrs["axis"], node.attrs["keepdims"]
    fn = torch.argmax if node.op == "argmax" else torch.argmin
    if node.attrs["select_last"]:
        idx = x.shape[axis] - 1 - fn(torch.flip(x, (axis,)), dim=axis, keepdim=keep)
    else:
        idx = fn(x, dim=axis, keepdim=keep)
    return idx


def _slice(node, x):
    a = node.attrs
    out = x
    for d, (s, st, n) in enumerate(zip(a["starts"], a["steps"], a["sizes"])):
        if n == x.shape[d] and s == 0 and st == 1:
            continue
        if st > 0:
            out = out.narrow(d, s, 0) if n == 0 else out[(slice(None),) * d
                                                          + (slice(s, s + (n - 1) * st + 1, st),)]
        else:
            idx = s + st * torch.arange(n)
            out = out.index_select(d, idx)
    return out


def _pad(node, x):
    pads, mode = node.attrs["pads"], node.attrs["mode"]
    r = x.dim()
    if mode == "constant":
        flat = [p for d in reversed(range(r)) for p in (pads[d], pads[d + r])]
        return F.pad(x, flat, value=node.attrs["value"])
    np_mode = {"reflect": "reflect", "edge": "edge", "wrap": "wrap"}[mode]
    for d in range(r):  # per dimension: an index vector, as numpy's pad modes define it
        if pads[d] or pads[d + r]:
            idx = np.pad(np.arange(x.shape[d]), (pads[d], pads[d + r]), mode=np_mode)
            x = x.index_select(d, torch.from_numpy(idx))
    return x


def _gather(node, data, idx):
    axis = node.attrs["axis"]
    n = data.shape[axis]
    flat = idx.reshape(-1).to(torch.int64)
    flat = torch.where(flat < 0, flat + n, flat)
    out = data.index_select(axis, flat)
    return out.reshape(data.shape[:axis] + idx.shape + data.shape[axis + 1:])


_SCATTER_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


def _scatter(node, data, idx, upd):
    """The flat scatter on torch's CPU kernels, which apply the updates in order; a
    position out of range is an IndexError, as from the compiled kernel."""
    out = data.reshape(-1).clone()
    flat, src = idx.reshape(-1).to(torch.int64), upd.reshape(-1).to(out.dtype)
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= out.numel()):
        raise IndexError(f"scatter position out of range [0, {out.numel()})")
    red = node.attrs["reduction"]
    if red == "none":
        out.scatter_(0, flat, src)
    else:
        out.scatter_reduce_(0, flat, src, _SCATTER_REDUCE[red], include_self=True)
    return out.reshape(data.shape)


def _conv(node, x, w, b=None):
    a = node.attrs
    n = x.dim() - 2
    pads = a["pads"]
    begin, end = pads[:n], pads[n:]
    if begin != end:
        x = F.pad(x, [p for d in reversed(range(n)) for p in (begin[d], end[d])])
        begin = [0] * n
    fn = (F.conv1d, F.conv2d, F.conv3d)[n - 1]
    return fn(x, w, b, stride=a["strides"], padding=begin, dilation=a["dilations"],
              groups=a["group"])


def _lowest(dtype):
    return float("-inf") if dtype.is_floating_point else torch.iinfo(dtype).min


def _max_pool(node, x):
    a = node.attrs
    n = x.dim() - 2
    pads = a["pads"]
    if any(pads):
        x = F.pad(x, [p for d in reversed(range(n)) for p in (pads[d], pads[d + n])],
                  value=_lowest(x.dtype))
    fn = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[n - 1]
    return fn(x, a["kernel"], a["strides"], 0, a["dilations"])


def _avg_pool(node, x):
    a = node.attrs
    n = x.dim() - 2
    if any(d != 1 for d in a["dilations"]):
        raise NotImplementedError("dilated average pooling")
    pads = a["pads"]
    fn = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[n - 1]
    if pads[:n] == pads[n:] and all(2 * p <= k for p, k in zip(pads[:n], a["kernel"])):
        return fn(x, a["kernel"], a["strides"], pads[:n],
                  count_include_pad=a["count_include_pad"])
    flat = [p for d in reversed(range(n)) for p in (pads[d], pads[d + n])]
    total = fn(F.pad(x, flat), a["kernel"], a["strides"], 0, divisor_override=1)
    if a["count_include_pad"]:
        return total / float(np.prod(a["kernel"]))
    ones = F.pad(torch.ones((1, 1) + tuple(x.shape[2:]), dtype=x.dtype), flat)
    return total / fn(ones, a["kernel"], a["strides"], 0, divisor_override=1)


def _channels_first(fn: Callable) -> Callable:
    """Run a conv/pool through its NCHW definition when the layout pass made it NHWC."""
    def run(node, x, *rest):
        if node.attrs["layout"] != "NHWC":
            return fn(node, x, *rest)
        return fn(node, torch.movedim(x, -1, 1), *rest).movedim(1, -1).contiguous()
    return run


_IR_OPS: dict[str, Callable] = facets.attach("torch_host", {
    **{k: (lambda f: lambda node, x: f(x))(f) for k, f in _UNARY.items()},
    **{k: (lambda f: lambda node, a, b: f(a, b))(f) for k, f in _BINARY.items()},
    "div": _div,
    "select": lambda node, c, a, b: torch.where(c, a, b),
    "cast": lambda node, x: x.to(torch_dtype(node.attrs["to"])),
    "bitcast": lambda node, x: x.view(torch_dtype(node.attrs["to"])),
    **{k: _reduce for k in ("reduce_sum", "reduce_prod", "reduce_max", "reduce_min")},
    "argmax": _arg, "argmin": _arg,
    "reshape": lambda node, x: x.reshape(node.attrs["shape"]),
    "transpose": lambda node, x: x.permute(node.attrs["perm"]),
    "broadcast": lambda node, x: x.expand(node.attrs["shape"]),
    "slice": _slice,
    "concat": lambda node, *xs: torch.cat(xs, dim=node.attrs["axis"]),
    "pad": _pad,
    "gather": _gather,
    "scatter": _scatter,
    "matmul": lambda node, a, b: torch.matmul(a, b),
    "attention": lambda node, q, k, v, mask=None: _attention(node, q, k, v, mask),
    # the time loop by the op's numpy reference (a recurrence braze does not compile)
    "recurrence": lambda node, *args: _reference(node, list(args))[0],
    "conv": _channels_first(_conv),
    "max_pool": _channels_first(_max_pool),
    "avg_pool": _channels_first(_avg_pool),
})


def _attention(node: Node, q, k, v, mask=None):
    """torch's SDPA; a causal one with a mask gets the diagonal folded into the mask (torch
    takes one or the other)."""
    causal = node.attrs["causal"]
    if causal and mask is not None:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        mask, causal = mask.masked_fill(~keep, float("-inf")), False
    y = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal, scale=node.attrs["scale"])
    return torch.nan_to_num(y, nan=0.0) if node.attrs["empty_rows_zero"] else y


def _reference(node: Node, args: list) -> list:
    """The op's numpy reference semantics (for what torch lacks, e.g. int pooling)."""
    outs = node.opdef.evaluate(node, [to_numpy(a) for a in args])
    return [to_torch(np.ascontiguousarray(o)) for o in outs]


# -- the step ---------------------------------------------------------------

class TorchHostStep:
    """Runs a host cluster's sub-graph with eager torch: `step(args) -> list of tensors`.

    `host_ops` maps a host node's payload key to a callable `(list of tensors) -> list
    of tensors` that runs its framework op (importers/fx.py: HostOp). An exception a
    node raises comes out as a HostOpError naming the node that is also an instance of
    torch's class (IndexError, RuntimeError...), with torch's exception as its cause."""

    def __init__(self, graph: Graph, host_ops: dict):
        self.graph = graph
        slots = {v: i for i, v in enumerate(graph.inputs)}
        self._consts: dict[int, torch.Tensor] = {}
        self._plan: list[tuple[Node, Callable, tuple, tuple]] = []
        for n in graph.nodes:
            for o in n.outputs:
                slots[o] = len(slots)
            outs = tuple(slots[o] for o in n.outputs)
            if n.op == "const":
                self._consts[outs[0]] = to_torch(n.attrs["value"])
                continue
            self._plan.append((n, self._runner(n, host_ops), tuple(slots[v] for v in n.inputs),
                               outs))
        self._n_slots = len(slots)
        self._outputs = tuple(slots[v] for v in graph.outputs)
        self._input_slots = range(len(graph.inputs))

    @staticmethod
    def _runner(n: Node, host_ops: dict) -> Callable:
        if n.op == "host":
            return host_ops[n.attrs["payload"].decode()]
        fn = _IR_OPS.get(n.op)
        if fn is None:
            log.info("braze: %s runs with its numpy reference (no torch equivalent)",
                     n.describe())
            return lambda args: _reference(n, args)
        return _IROpCall(n, fn)

    def __call__(self, args: list) -> list:
        env: list = [None] * self._n_slots
        for i, a in zip(self._input_slots, args):
            env[i] = to_torch(a)
        for s, t in self._consts.items():
            env[s] = t
        for node, fn, ins, outs in self._plan:
            try:
                results = fn([env[i] for i in ins])
            except BrazeError:
                raise
            except Exception as e:
                raise host_op_error(f"torch failed running {node.describe()}: "
                                    f"{_first_line(e)}", e, keep_type=True) from e
            for s, r in zip(outs, results):
                env[s] = r
        return [env[s] for s in self._outputs]


def _first_line(e: Exception) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__


class _IROpCall:
    """One IR op in torch; the numpy reference where torch has no kernel for the dtype."""

    def __init__(self, node: Node, fn: Callable):
        self.node, self.fn = node, fn

    def __call__(self, args: list) -> list:
        try:
            return [self.fn(self.node, *args)]
        except (RuntimeError, NotImplementedError) as e:
            if any(a.dtype == torch.bfloat16 for a in args):
                raise
            log.debug("braze: torch refused %s (%s); using its numpy reference",
                      self.node.describe(), e)
            return _reference(self.node, args)
