"""Library-class ops: matmul, conv (N-d, grouped, dilated) and pooling.

Layouts are the frameworks' canonical ones: activations N,C,spatial...;
conv weights M, C/group, kernel...; `pads` lists all begin pads then all end
pads (ONNX order). The layout pass (passes/layout.py) may set `layout="NHWC"`
on conv and pooling: activations (input and output) are then N,spatial...,C;
weights keep their canonical layout (the kernel packs them at compile time).
matmul follows numpy for rank >= 2 (batch dims broadcast); importers reshape
rank-1 operands.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from compiler import dtypes
from compiler.ir import IRError, TensorType
from compiler.ops import REQUIRED, Family, OpDef, register
from compiler.ops.elementwise import broadcast_shapes


# -- matmul ---------------------------------------------------------------

def _matmul_infer(node):
    a, b = node.inputs
    if a.dtype != b.dtype or a.dtype not in dtypes.NUMERIC:
        raise IRError(f"{node.describe()}: dtypes {a.dtype} and {b.dtype}")
    if a.type.rank < 2 or b.type.rank < 2 or a.shape[-1] != b.shape[-2]:
        raise IRError(f"{node.describe()}: cannot multiply {a.shape} by {b.shape}")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2], where=node.describe())
    return [TensorType(a.dtype, batch + (a.shape[-2], b.shape[-1]))]


def _matmul_eval(node, a, b):
    if a.dtype.kind in "iu":
        out = np.matmul(a.astype(np.int64), b.astype(np.int64))
    else:
        out = np.matmul(a.astype(np.float64), b.astype(np.float64))
    return [out.astype(a.dtype)]


register(OpDef("matmul", Family.CONTRACTION, (2, 2), _matmul_infer, _matmul_eval))


# -- windows (conv and pooling share these) -------------------------------

def window_out_dims(in_dims, kernel, strides, pads, dilations, where) -> tuple:
    """Output spatial dims of a sliding window; IRError if any is < 1 or attrs mismatch."""
    n = len(in_dims)
    if not (len(kernel) == len(strides) == len(dilations) == n and len(pads) == 2 * n):
        raise IRError(f"{where}: kernel/strides/dilations/pads do not match {n} spatial dims")
    out = []
    for i in range(n):
        span = dilations[i] * (kernel[i] - 1) + 1
        size = in_dims[i] + pads[i] + pads[i + n] - span
        if strides[i] < 1 or dilations[i] < 1 or size < 0 or min(pads) < 0:
            raise IRError(f"{where}: window {kernel} does not fit input {tuple(in_dims)}")
        out.append(size // strides[i] + 1)
    return tuple(out)


def _windows(x, kernel, strides, pads, dilations, pad_value):
    """x: N,C,spatial -> N,C,out_spatial...,kernel... (a view, via numpy)."""
    n = len(kernel)
    width = [(0, 0), (0, 0)] + [(pads[i], pads[i + n]) for i in range(n)]
    xp = np.pad(x, width, constant_values=pad_value)
    spans = [dilations[i] * (kernel[i] - 1) + 1 for i in range(n)]
    w = sliding_window_view(xp, spans, axis=tuple(range(2, 2 + n)))
    sel = (slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides)
    sel += tuple(slice(None, None, d) for d in dilations)
    return w[sel]


_WINDOW_ATTRS = {
    "strides": ("ints", REQUIRED),
    "pads": ("ints", REQUIRED),
    "dilations": ("ints", REQUIRED),
    "layout": ("str", "NCHW"),
}
LAYOUTS = ("NCHW", "NHWC")


def channels_last(node) -> bool:
    """Whether a conv/pool node's activations are N,spatial...,C."""
    layout = node.attrs["layout"]
    if layout not in LAYOUTS:
        raise IRError(f"{node.describe()}: layout {layout!r} is not one of {LAYOUTS}")
    return layout == "NHWC"


def to_first(shape: tuple) -> tuple:
    """N,spatial...,C -> N,C,spatial..."""
    return (shape[0], shape[-1]) + tuple(shape[1:-1])


def to_last(shape: tuple) -> tuple:
    """N,C,spatial... -> N,spatial...,C"""
    return (shape[0],) + tuple(shape[2:]) + (shape[1],)


def _first(x: np.ndarray) -> np.ndarray:
    return np.moveaxis(x, -1, 1)


def _last(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.moveaxis(x, 1, -1))


def _in_canonical(eval_fn):
    """Evaluate an NHWC node through the NCHW definition (moving the channel axis)."""
    def run(node, x, *rest):
        if not channels_last(node):
            return eval_fn(node, x, *rest)
        return [_last(y) for y in eval_fn(node, _first(x), *rest)]
    return run


# -- conv -----------------------------------------------------------------

def _conv_infer(node):
    x, w = node.inputs[:2]
    g = node.attrs["group"]
    if x.dtype != w.dtype or x.dtype not in dtypes.FLOATS:
        raise IRError(f"{node.describe()}: dtypes {x.dtype} and {w.dtype}")
    if x.type.rank < 3 or w.type.rank != x.type.rank:
        raise IRError(f"{node.describe()}: input {x.shape} and weight {w.shape} ranks")
    last = channels_last(node)
    xs = to_first(x.shape) if last else x.shape
    if g < 1 or xs[1] != w.shape[1] * g or w.shape[0] % g:
        raise IRError(f"{node.describe()}: channels {xs[1]} vs weight {w.shape}, group {g}")
    if len(node.inputs) == 3:
        b = node.inputs[2]
        if b.dtype != x.dtype or b.shape != (w.shape[0],):
            raise IRError(f"{node.describe()}: bias {b.type} for {w.shape[0]} channels")
    a = node.attrs
    sp = window_out_dims(xs[2:], w.shape[2:], a["strides"], a["pads"], a["dilations"],
                         node.describe())
    out = (xs[0], w.shape[0]) + sp
    return [TensorType(x.dtype, to_last(out) if last else out)]


def _conv_eval(node, x, w, b=None):
    a = node.attrs
    g = a["group"]
    n = x.ndim - 2
    win = _windows(x.astype(np.float64), w.shape[2:], a["strides"], a["pads"],
                   a["dilations"], 0.0)
    N, C = x.shape[:2]
    M = w.shape[0]
    win = win.reshape((N, g, C // g) + win.shape[2:])
    wg = w.astype(np.float64).reshape((g, M // g, C // g) + w.shape[2:])
    sp = "".join("hijk"[:n])
    kk = "".join("pqrs"[:n])
    out = np.einsum(f"ngc{sp}{kk},gmc{kk}->ngm{sp}", win, wg, optimize=True)
    out = out.reshape((N, M) + out.shape[3:])
    if b is not None:
        out = out + b.astype(np.float64).reshape((1, M) + (1,) * n)
    return [out.astype(x.dtype)]


register(OpDef("conv", Family.CONTRACTION, (2, 3), _conv_infer, _in_canonical(_conv_eval),
               attrs={**_WINDOW_ATTRS, "group": ("int", 1)}))


# -- pooling --------------------------------------------------------------

def _pool_infer(node):
    x = node.inputs[0]
    if x.dtype not in dtypes.NUMERIC or x.type.rank < 3:
        raise IRError(f"{node.describe()}: cannot pool {x.type}")
    if node.op == "avg_pool" and x.dtype not in dtypes.FLOATS:
        raise IRError(f"{node.describe()}: avg_pool needs a float dtype, got {x.dtype}")
    a = node.attrs
    last = channels_last(node)
    xs = to_first(x.shape) if last else x.shape
    sp = window_out_dims(xs[2:], a["kernel"], a["strides"], a["pads"], a["dilations"],
                         node.describe())
    out = xs[:2] + sp
    return [TensorType(x.dtype, to_last(out) if last else out)]


def _lowest(dtype):
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


def _max_pool_eval(node, x):
    a = node.attrs
    k = len(a["kernel"])
    win = _windows(x, a["kernel"], a["strides"], a["pads"], a["dilations"], _lowest(x.dtype))
    return [win.max(axis=tuple(range(-k, 0))).astype(x.dtype)]


def _avg_pool_eval(node, x):
    a = node.attrs
    k = len(a["kernel"])
    axes = tuple(range(-k, 0))
    win = _windows(x.astype(np.float64), a["kernel"], a["strides"], a["pads"], a["dilations"], 0)
    total = win.sum(axis=axes)
    if a["count_include_pad"]:
        count = np.prod(a["kernel"])
    else:
        ones = np.ones((1, 1) + x.shape[2:])
        count = _windows(ones, a["kernel"], a["strides"], a["pads"], a["dilations"], 0).sum(axes)
    return [(total / count).astype(x.dtype)]


register(OpDef("max_pool", Family.POOL, (1, 1), _pool_infer, _in_canonical(_max_pool_eval),
               attrs={"kernel": ("ints", REQUIRED), **_WINDOW_ATTRS}))
register(OpDef("avg_pool", Family.POOL, (1, 1), _pool_infer, _in_canonical(_avg_pool_eval),
               attrs={"kernel": ("ints", REQUIRED), **_WINDOW_ATTRS,
                      "count_include_pad": ("bool", False)}))


# -- attention ------------------------------------------------------------
# attention(q, k, v[, mask]) = softmax(scale * q @ k^T + mask [causal: -inf above the
# diagonal, key j > query i]) @ v, over the last two dims; q [..., T, D], k [..., S, D],
# v [..., S, Dv], mask additive, broadcastable to [..., T, S]; batch dims equal. A row
# whose keys are all masked is NaN (torch), or 0 with empty_rows_zero (ONNX's rule).
# passes/attention.py makes it from the decomposed pattern and the importers' ops.

def _attention_infer(node):
    q, k, v = node.inputs[:3]
    where = node.describe()
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in dtypes.FLOATS:
        raise IRError(f"{where}: dtypes {q.dtype}, {k.dtype}, {v.dtype}")
    if q.type.rank < 2 or not (q.type.rank == k.type.rank == v.type.rank):
        raise IRError(f"{where}: ranks of {q.shape}, {k.shape}, {v.shape}")
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-1] != v.shape[:-1] or q.shape[-1] != k.shape[-1]:
        raise IRError(f"{where}: q {q.shape}, k {k.shape}, v {v.shape} do not agree")
    out = TensorType(q.dtype, q.shape[:-1] + (v.shape[-1],))
    if len(node.inputs) == 4:
        m = node.inputs[3]
        scores = q.shape[:-1] + (k.shape[-2],)
        if m.dtype != q.dtype or broadcast_shapes(m.shape, scores, where=where) != scores:
            raise IRError(f"{where}: mask {m.type} does not broadcast to {scores}")
    return [out]


def attention_scores(node, q, k, mask=None) -> np.ndarray:
    """scale * q @ k^T + mask, causal entries -inf, in float64."""
    s = node.attrs["scale"] * (q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2))
    if mask is not None:
        s = s + mask.astype(np.float64)
    if node.attrs["causal"]:
        t, n = s.shape[-2:]
        s = np.where(np.tril(np.ones((t, n), bool)), s, -np.inf)
    return s


def _attention_eval(node, q, k, v, mask=None):
    s = attention_scores(node, q, k, mask)
    with np.errstate(invalid="ignore"):  # a fully masked row is NaN, as in torch
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        p = p / p.sum(axis=-1, keepdims=True)
    if node.attrs["empty_rows_zero"]:
        p = np.where(np.isneginf(s).all(axis=-1, keepdims=True), 0.0, p)
    return [(p @ v.astype(np.float64)).astype(q.dtype)]


register(OpDef("attention", Family.CONTRACTION, (3, 4), _attention_infer, _attention_eval,
               attrs={"scale": ("float", REQUIRED), "causal": ("bool", False),
                      "empty_rows_zero": ("bool", False)}))
