"""`recurrence`: the time loop of an LSTM, GRU or plain RNN layer (kernels/recurrent.py).

    recurrence(xw, r, h0, lens[, c0, p])      cell = "lstm"
    recurrence(xw, r, h0, lens[, rbh])        cell = "gru"
    recurrence(xw, r, h0, lens)               cell = "rnn"

The input projection is not part of the op: the importers compute it for every
timestep and direction as one matmul, so `xw` [T*B, D*G*H] (that matmul's result as it
is: rows t-major, then batch, in any leading dims, e.g. [T, B, D*G*H]; columns
direction-major, then gate) holds X W^T plus every bias
that is added outside a gate's nonlinearity (Wb + Rb; for a GRU with
linear_before_reset, all but Rb of the hidden gate, which is `rbh` [D, H]; without
linear_before_reset, rbh is not read). `r`
[D, G*H, H] is ONNX's recurrence weight (gates in ONNX order: LSTM i o f c, GRU z r h),
`h0` and `c0` [D, B, H] the initial states, `lens` [B] (i32) the steps of each batch
row (clamped to [0, T]), `p` [D, 3H] LSTM's peepholes (i o f). D is 2 for
direction = "bidirectional" (direction 0 forward, 1 reverse), else 1. The gate
activations are ONNX's defaults (sigmoid, tanh, tanh); `clip` > 0 bounds the gates'
inputs to [-clip, clip] (an LSTM's tanh of its cell state is not clipped: onnxruntime's
rule, which the spec leaves open).

The result is one tensor [T + S, D, B, H] (S = 2 for an LSTM, else 1): rows t < T are
ONNX's Y (0 at t >= lens[b]), row T the final hidden state Y_h, row T + 1 an LSTM's
final cell state Y_c. The importers slice and transpose it into the outputs they need.
A reverse direction walks t = lens[b] - 1 down to 0.
"""

from __future__ import annotations

import numpy as np

from compiler.ir import IRError, TensorType
from compiler.ops import REQUIRED, Family, OpDef, register

CELLS = {"lstm": 4, "gru": 3, "rnn": 1}  # cell -> gates
DIRECTIONS = ("forward", "reverse", "bidirectional")
# inputs after (xw, r, h0, lens) by cell
EXTRA = {"lstm": ("c0", "p"), "gru": ("rbh",), "rnn": ()}


def dims(node) -> tuple[int, int, int, int, int]:
    """(T, B, D, G, H) of a recurrence node."""
    rows = int(np.prod(node.inputs[0].shape[:-1], dtype=np.int64))
    d, _, h = node.inputs[1].shape
    batch = node.inputs[2].shape[1]
    return rows // max(batch, 1), batch, d, CELLS[node.attrs["cell"]], h


def states(cell: str) -> int:
    """Rows after Y in the result: the final h (and an LSTM's final c)."""
    return 2 if cell == "lstm" else 1


def _check(node):
    cell, direction = node.attrs["cell"], node.attrs["direction"]
    if cell not in CELLS or direction not in DIRECTIONS:
        raise IRError(f"{node.describe()}: cell {cell!r}, direction {direction!r}")
    if len(node.inputs) != 4 + len(EXTRA[cell]):
        raise IRError(f"{node.describe()}: a {cell} takes {4 + len(EXTRA[cell])} inputs")


def _infer(node):
    xw, r, h0, lens = node.inputs[:4]
    where = node.describe()
    if xw.type.rank < 2 or r.type.rank != 3 or h0.type.rank != 3:
        raise IRError(f"{where}: xw {xw.shape}, r {r.shape}, h0 {h0.shape}")
    t, batch, d, g, h = dims(node)
    if batch == 0 or t * batch != np.prod(xw.shape[:-1]):
        raise IRError(f"{where}: xw {xw.shape}'s rows are not T x B for B = {batch}")
    if d != (2 if node.attrs["direction"] == "bidirectional" else 1):
        raise IRError(f"{where}: {d} directions for {node.attrs['direction']}")
    want = {"r": (d, g * h, h), "h0": (d, batch, h), "lens": (batch,), "c0": (d, batch, h),
            "p": (d, 3 * h), "rbh": (d, h)}
    names = ("xw", "r", "h0", "lens") + EXTRA[node.attrs["cell"]]
    if xw.shape[-1] != d * g * h:
        raise IRError(f"{where}: xw {xw.shape} for {d} direction(s) of {g} gates of {h}")
    for name, v in zip(names[1:], node.inputs[1:]):
        dtype = "i32" if name == "lens" else xw.dtype
        if v.shape != want[name] or v.dtype != dtype:
            raise IRError(f"{where}: {name} is {v.type}, want {dtype}{list(want[name])}")
    if xw.dtype not in ("f32", "f64"):
        raise IRError(f"{where}: dtype {xw.dtype}")
    return [TensorType(xw.dtype, (t + states(node.attrs["cell"]), d, batch, h))]


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def cell_step(node, gates, h, c, d, extra):
    """One step of the cell in float64: gates = the step's xw row plus h R^T (for a GRU
    without linear_before_reset, the hidden gate's product is taken inside, it needs r);
    returns (h, c)."""
    cell, clip = node.attrs["cell"], node.attrs["clip"]
    hid = h.shape[-1]
    act = (lambda f: lambda x: f(np.clip(x, -clip, clip))) if clip > 0 else (lambda f: f)
    sig, tanh = act(_sigmoid), act(np.tanh)
    part = [gates[..., i * hid:(i + 1) * hid] for i in range(CELLS[cell])]
    if cell == "rnn":
        return tanh(part[0]), c
    if cell == "lstm":
        i, o, f, g = part
        p = extra["p"][d]
        i = sig(i + p[:hid] * c)
        f = sig(f + p[2 * hid:] * c)
        c = f * c + i * tanh(g)
        o = sig(o + p[hid:2 * hid] * c)
        return o * np.tanh(c), c  # the cell's tanh takes no clip (onnxruntime's rule)
    z, r, hh = part
    return None, (sig(z), sig(r), hh)


def _eval(node, xw, r, h0, lens, *rest):
    cell = node.attrs["cell"]
    extra = dict(zip(EXTRA[cell], [x.astype(np.float64) for x in rest]))
    t_len, batch, dirs, _, hid = dims(node)
    out = np.zeros((t_len + states(cell), dirs, batch, hid))
    x64 = xw.astype(np.float64).reshape(t_len, batch, dirs, -1)
    r64 = r.astype(np.float64)
    clip = node.attrs["clip"]
    tanh = (lambda x: np.tanh(np.clip(x, -clip, clip))) if clip > 0 else np.tanh
    for d in range(dirs):
        rev = node.attrs["direction"] == "reverse" or d == 1
        for b in range(batch):
            n = int(np.clip(lens[b], 0, t_len))
            h = h0[d, b].astype(np.float64)
            c = extra["c0"][d, b] if cell == "lstm" else None
            for s in range(n):
                t = n - 1 - s if rev else s
                if cell == "gru":
                    g = x64[t, b, d] + np.concatenate([r64[d, :2 * hid] @ h, np.zeros(hid)])
                    _, (z, rg, hx) = cell_step(node, g, h, c, d, extra)
                    rh = r64[d, 2 * hid:]
                    if node.attrs["linear_before_reset"]:
                        hx = hx + rg * (rh @ h + extra["rbh"][d])
                    else:
                        hx = hx + rh @ (rg * h)
                    h = (1 - z) * tanh(hx) + z * h
                else:
                    h, c = cell_step(node, x64[t, b, d] + r64[d] @ h, h, c, d, extra)
                out[t, d, b] = h
            out[t_len, d, b] = h
            if cell == "lstm":
                out[t_len + 1, d, b] = c
    return [out.astype(xw.dtype)]


register(OpDef("recurrence", Family.CONTRACTION, (4, 6), _infer, _eval,
               attrs={"cell": ("str", REQUIRED), "direction": ("str", "forward"),
                      "clip": ("float", 0.0), "linear_before_reset": ("bool", False)},
               check_fn=_check))
