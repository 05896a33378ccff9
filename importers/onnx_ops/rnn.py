"""ONNX LSTM, GRU and RNN -> one matmul for the input projection + a `recurrence` node.

    xw = X[T*B, I] @ [W_0; W_1]^T + bias      every step and direction in one GEMM
    y  = recurrence(xw, R, h0, lens, ...)     the time loop (kernels/recurrent.py)
    Y, Y_h, Y_c = slices of y (transposed for layout 1)

The bias in front is Wb + Rb, except the hidden gate's Rb of a GRU with
linear_before_reset, which multiplies with r inside the loop (the op's `rbh`). Absent
optional inputs become constants: zero states and biases, every sequence at full length,
zero peepholes (which the kernel then leaves out). Refused, with the node left to
onnxruntime: activation lists other than the defaults (the kernel's gate math is
sigmoid/tanh), LSTM's input_forget, dtypes other than float32 (float16 nodes compute in
float32: half_as_float) and what the kernel refuses (recurrent.refusal).
"""

from __future__ import annotations

import numpy as np

from importers.onnx_ops import Fallback, converter
from importers.onnx_ops.context import NodeContext, half_as_float

# per op: (IR cell, gates, its default activations per direction)
_CELLS = {"LSTM": ("lstm", 4, ("sigmoid", "tanh", "tanh")),
          "GRU": ("gru", 3, ("sigmoid", "tanh")),
          "RNN": ("rnn", 1, ("tanh",))}
_KNOWN = {"activations", "activation_alpha", "activation_beta", "clip", "direction",
          "hidden_size", "layout", "input_forget", "linear_before_reset"}


def _refusal(cx: NodeContext, op: str, dirs: int) -> str | None:
    unknown = sorted(set(cx.attrs) - _KNOWN)
    if unknown:
        return f"attributes {unknown}"
    acts = cx.attr("activations")
    default = _CELLS[op][2] * dirs
    if acts is not None and tuple(a.decode().lower() if isinstance(a, bytes) else a.lower()
                                  for a in acts) != default:
        return (f"activations {list(acts)}: braze's recurrence kernel computes the default "
                f"gates ({', '.join(_CELLS[op][2])}) only")
    if cx.attr("input_forget", 0):
        return "input_forget (coupled input and forget gates) is not compiled"
    x = cx.input(0)
    if x.dtype != "f32":
        return f"dtype {x.dtype}: the recurrence kernel is float32 only"
    if not all(v.type.static for v in cx.inputs if v is not None):
        return "symbolic dims"
    return None


def _bias(cx: NodeContext, cell: str, gh: int, hid: int, dirs: int):
    """(the projection's bias [D*G*H] or None, rbh [D, H] for a GRU)."""
    b = cx.input(3)
    lbr = cell == "gru" and bool(cx.attr("linear_before_reset", 0))
    dt = np.float32
    if b is None:
        return None, cx.const(np.zeros((dirs, hid), dt)) if cell == "gru" else None
    wb = cx.op("slice", b, starts=(0, 0), steps=(1, 1), sizes=(dirs, gh))
    rb = cx.op("slice", b, starts=(0, gh), steps=(1, 1), sizes=(dirs, gh))
    rbh = cx.const(np.zeros((dirs, hid), dt)) if cell == "gru" else None
    if lbr:  # the hidden gate's Rb stays in the loop; the others are added in front
        rbh = cx.op("slice", rb, starts=(0, 2 * hid), steps=(1, 1), sizes=(dirs, hid))
        keep = np.ones(gh, dt)
        keep[2 * hid:] = 0
        rb = cx.op("mul", rb, cx.const(keep))
    total = cx.op("add", wb, rb)
    return cx.reshape(total, (dirs * gh,)), rbh


def _state(cx: NodeContext, i: int, dirs: int, batch: int, hid: int, layout: int):
    """initial_h / initial_c as [D, B, H] (zeros when absent)."""
    v = cx.input(i)
    if v is None:
        return cx.const(np.zeros((dirs, batch, hid), np.float32))
    return cx.transpose(v, (1, 0, 2)) if layout else v


def _convert(cx: NodeContext, op: str):
    cell, gates, _ = _CELLS[op]
    direction = cx.attr("direction", "forward")
    dirs = 2 if direction == "bidirectional" else 1
    reason = _refusal(cx, op, dirs)
    if reason is not None:
        raise Fallback(reason)
    layout = int(cx.attr("layout", 0))
    x, w, r = cx.input(0), cx.input(1), cx.input(2)
    if layout:
        x = cx.transpose(x, (1, 0, 2))
    t, batch, width = x.shape
    hid = r.shape[-1]
    declared = cx.attr("hidden_size", hid)
    if int(declared) != hid:  # onnxruntime refuses such a node when it runs: so does braze
        raise Fallback(f"hidden_size {declared} does not match R's {hid} columns")
    gh = gates * hid
    if w.shape != (dirs, gh, width) or r.shape != (dirs, gh, hid):
        raise Fallback(f"W {w.shape} or R {r.shape} do not match {dirs} direction(s) of "
                       f"{gates} gates of {hid}")
    wt = cx.transpose(cx.reshape(w, (dirs * gh, width)), (1, 0))
    xw = cx.op("matmul", x, wt)  # [T, B, D*G*H]: the recurrence's rows as they are
    bias, rbh = _bias(cx, cell, gh, hid, dirs)
    if bias is not None:
        xw = cx.op("add", xw, bias)
    lens = cx.input(4)
    lens = cx.const(np.full(batch, t, np.int32)) if lens is None else cx.cast(lens, "i32")
    inputs = [xw, r, _state(cx, 5, dirs, batch, hid, layout), lens]
    if cell == "lstm":
        p = cx.input(7)
        inputs += [_state(cx, 6, dirs, batch, hid, layout),
                   cx.const(np.zeros((dirs, 3 * hid), np.float32)) if p is None else p]
    elif cell == "gru":
        inputs.append(rbh)
    from compiler.kernels import recurrent

    why = recurrent.refusal_for(inputs, cell)
    if why is not None:
        raise Fallback(f"braze's recurrence kernel refuses it: {why}")
    y = cx.op("recurrence", *inputs, cell=cell, direction=direction,
              clip=float(cx.attr("clip", 0.0)),
              linear_before_reset=bool(cx.attr("linear_before_reset", 0)))
    return _outputs(cx, y, t, dirs, batch, hid, cell, layout)


def _outputs(cx: NodeContext, y, t: int, dirs: int, batch: int, hid: int, cell: str,
             layout: int) -> list:
    """Y [T, D, B, H] (layout 1: [B, T, D, H]), Y_h (and Y_c) [D, B, H] ([B, D, H])."""
    whole = (1, 1, 1, 1)
    ys = cx.op("slice", y, starts=(0, 0, 0, 0), steps=whole, sizes=(t, dirs, batch, hid))
    outs = [cx.transpose(ys, (2, 0, 1, 3)) if layout else ys]
    for i in range(2 if cell == "lstm" else 1):
        s = cx.op("slice", y, starts=(t + i, 0, 0, 0), steps=whole, sizes=(1, dirs, batch, hid))
        s = cx.reshape(s, (dirs, batch, hid))
        outs.append(cx.transpose(s, (1, 0, 2)) if layout else s)
    return outs[:max(1, len(cx.node.output))]


@converter("LSTM", 7)
@half_as_float
def convert_lstm(cx: NodeContext):
    return _convert(cx, "LSTM")


@converter("GRU", 7)
@half_as_float
def convert_gru(cx: NodeContext):
    return _convert(cx, "GRU")


@converter("RNN", 7)
@half_as_float
def convert_rnn(cx: NodeContext):
    return _convert(cx, "RNN")
