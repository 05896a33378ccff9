"""torch's nn.LSTM, nn.GRU and nn.RNN (tanh) under torch.compile -> recurrence nodes.

torch decomposes aten.lstm / gru / rnn_tanh while AOTAutograd traces (a Python kernel at
CompositeImplicitAutograd): into one cell per step, layer and direction, T x L x D small
addmm and gate ops. So `route_recurrent` (bridge/torch_backend.py calls it on dynamo's
graph, when it is compiled with gradients off: these ops have no backward) turns dynamo's
torch.lstm / gru / rnn_tanh calls into the opaque ops braze::lstm / gru / rnn_tanh
defined here, which run torch's own op when they are not converted. Their converters
build, per layer, what importers/onnx_ops/rnn.py builds for ONNX: one matmul for the
input projection of every step and both directions, then one `recurrence` node, with
torch's gate order (LSTM i f g o, GRU r z n) permuted to ONNX's (i o f c, z r h). torch's
GRU is ONNX's linear_before_reset form. Refused (torch runs the op): proj_size,
dropout while training, dtypes other than float32.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from importers.fx_context import Ctx, Fallback, converts

# torch gate blocks in ONNX's order, by cell
_ONNX_ORDER = {"lstm": (0, 3, 1, 2), "gru": (1, 0, 2), "rnn": (0,)}


def _fake(input: Tensor, hx: Tensor, params: list[Tensor], bidirectional: bool,
          batch_first: bool) -> Tensor:
    t, b = (input.shape[1], input.shape[0]) if batch_first else input.shape[:2]
    d = 2 if bidirectional else 1
    shape = (b, t, d * hx.shape[-1]) if batch_first else (t, b, d * hx.shape[-1])
    return input.new_empty(shape)


@torch.library.custom_op("braze::lstm", mutates_args=())
def lstm(input: Tensor, hx: list[Tensor], params: list[Tensor], has_biases: bool,
         num_layers: int, dropout: float, train: bool, bidirectional: bool,
         batch_first: bool) -> tuple[Tensor, Tensor, Tensor]:
    """torch.lstm as one opaque op (braze converts it; else it runs as itself)."""
    y, h, c = torch.lstm(input, hx, params, has_biases, num_layers, dropout, train,
                         bidirectional, batch_first)
    return y, h, c


@lstm.register_fake
def _(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    return (_fake(input, hx[0], params, bidirectional, batch_first), hx[0].new_empty(
        hx[0].shape), hx[1].new_empty(hx[1].shape))


def _define(name: str, fn):
    @torch.library.custom_op(f"braze::{name}", mutates_args=())
    def op(input: Tensor, hx: Tensor, params: list[Tensor], has_biases: bool,
           num_layers: int, dropout: float, train: bool, bidirectional: bool,
           batch_first: bool) -> tuple[Tensor, Tensor]:
        y, h = fn(input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
                  batch_first)
        return y, h

    @op.register_fake
    def _(input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
          batch_first):
        return _fake(input, hx, params, bidirectional, batch_first), hx.new_empty(hx.shape)

    return op


gru = _define("gru", torch.gru)
rnn_tanh = _define("rnn_tanh", torch.rnn_tanh)
_ROUTES = {torch.lstm: torch.ops.braze.lstm.default, torch.gru: torch.ops.braze.gru.default,
           torch.rnn_tanh: torch.ops.braze.rnn_tanh.default}


def route_recurrent(gm: torch.fx.GraphModule) -> int:
    """Turn dynamo's torch.lstm / gru / rnn_tanh calls (the padded-input form) into the
    braze:: ops, when gradients are off; returns how many."""
    if torch.is_grad_enabled():
        return 0
    count = 0
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target not in _ROUTES or n.kwargs \
                or len(n.args) != 9 or not isinstance(n.args[3], bool):
            continue  # the packed-sequence form has batch sizes where has_biases is
        hx = list(n.args[1]) if n.target is torch.lstm else n.args[1]
        n.args = (n.args[0], hx, list(n.args[2])) + tuple(n.args[3:])
        n.target = _ROUTES[n.target]
        count += 1
    if count:
        gm.recompile()
    return count


# -- the converters ------------------------------------------------------------------

def _slice(cx: Ctx, v, axis: int, start: int, size: int):
    starts = [0] * v.type.rank
    sizes = list(v.shape)
    starts[axis], sizes[axis] = start, size
    return cx.op("slice", v, starts=tuple(starts), steps=(1,) * v.type.rank,
                 sizes=tuple(sizes))


def _onnx_order(cx: Ctx, v, cell: str, hid: int):
    """Gate blocks of H along axis 0 in ONNX's order."""
    order = _ONNX_ORDER[cell]
    if order == tuple(range(len(order))):
        return v
    return cx.op("concat", *[_slice(cx, v, 0, k * hid, hid) for k in order], axis=0)


def _layer(cx: Ctx, cell: str, x, ps: list, dirs: int, h0, c0):
    """One layer: x [T, B, I] -> the recurrence's result [T + S, D, B, H]."""
    t, batch, _ = x.shape
    per = len(ps) // dirs
    hid = ps[1].shape[-1]
    gh = hid * len(_ONNX_ORDER[cell])
    w = cx.op("concat", *[_onnx_order(cx, ps[d * per], cell, hid) for d in range(dirs)],
              axis=0)
    xw = cx.op("matmul", x, cx.op("transpose", w, perm=(1, 0)))  # [T, B, D*G*H]
    r = cx.op("concat", *[cx.reshape(_onnx_order(cx, ps[d * per + 1], cell, hid),
                                     (1, gh, hid)) for d in range(dirs)], axis=0)
    rbh = cx.const(np.zeros((dirs, hid), np.float32))
    if per == 4:
        bias, hidden = [], []
        for d in range(dirs):
            bi, bh = (_onnx_order(cx, ps[d * per + k], cell, hid) for k in (2, 3))
            if cell == "gru":  # n's b_hn multiplies with r inside the loop
                keep = np.ones(gh, np.float32)
                keep[2 * hid:] = 0
                bh = cx.op("mul", bh, cx.const(keep))
                hidden.append(cx.reshape(_slice(cx, ps[d * per + 3], 0, 2 * hid, hid), (1, hid)))
            bias.append(cx.op("add", bi, bh))
        xw = cx.op("add", xw, cx.op("concat", *bias, axis=0))
        if hidden:
            rbh = cx.op("concat", *hidden, axis=0)
    inputs = [xw, r, h0,
              cx.const(np.full(batch, t, np.int32))]
    if cell == "lstm":
        inputs += [c0, cx.const(np.zeros((dirs, 3 * hid), np.float32))]
    elif cell == "gru":
        inputs.append(rbh)
    from compiler.kernels import recurrent

    why = recurrent.refusal_for(inputs, cell)
    if why is not None:
        raise Fallback(f"braze's recurrence kernel refuses it: {why}")
    return cx.op("recurrence", *inputs, cell=cell,
                 direction="bidirectional" if dirs == 2 else "forward",
                 linear_before_reset=cell == "gru")


def _convert(cx: Ctx, cell: str, x, hx: list, params, has_biases, num_layers, dropout,
             train, bidirectional, batch_first):
    if train and dropout:
        raise Fallback(f"dropout {dropout} between layers while training: random")
    if x.dtype != "f32" or x.type.rank != 3:
        raise Fallback(f"input {x.type}: braze compiles float32 [T, B, I] sequences")
    dirs = 2 if bidirectional else 1
    per = 4 if has_biases else 2
    if len(params) != num_layers * dirs * per:
        raise Fallback("projections (proj_size): weights the recurrence does not take")
    if batch_first:
        x = cx.op("transpose", x, perm=(1, 0, 2))
    t, batch, _ = x.shape
    hid = hx[0].shape[-1]
    finals: list[list] = [[] for _ in hx]
    for layer in range(num_layers):
        states = [_slice(cx, s, 0, layer * dirs, dirs) for s in hx]
        y = _layer(cx, cell, x, params[layer * dirs * per:(layer + 1) * dirs * per], dirs,
                   states[0], states[1] if cell == "lstm" else None)
        seq = _slice(cx, y, 0, 0, t)  # [T, D, B, H] -> [T, B, D * H]
        x = cx.reshape(cx.op("transpose", seq, perm=(0, 2, 1, 3)), (t, batch, dirs * hid))
        for i, f in enumerate(finals):
            f.append(cx.reshape(_slice(cx, y, 0, t + i, 1), (dirs, batch, hid)))
    out = cx.op("transpose", x, perm=(1, 0, 2)) if batch_first else x
    return (out,) + tuple(f[0] if len(f) == 1 else cx.op("concat", *f, axis=0) for f in finals)


@converts(torch.ops.braze.lstm.default)
def _lstm(cx: Ctx, x, hx, params, *flags):
    return _convert(cx, "lstm", x, list(hx), list(params), *flags)


@converts(torch.ops.braze.gru.default)
def _gru(cx: Ctx, x, hx, params, *flags):
    return _convert(cx, "gru", x, [hx], list(params), *flags)


@converts(torch.ops.braze.rnn_tanh.default)
def _rnn_tanh(cx: Ctx, x, hx, params, *flags):
    return _convert(cx, "rnn", x, [hx], list(params), *flags)
