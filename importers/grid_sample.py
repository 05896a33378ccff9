"""Grid sampling (ONNX GridSample, torch's grid_sample) as gathers at computed indices.

    Y[n, c, p] = sum over corners k of w_k(n, p) * X[n, c, idx_k(n, p)]

X is (N, C, D_1 .. D_r), the grid (N, P_1 .. P_r, r), its last dim holding one source
coordinate per spatial dim in reverse order (grid[..., 0] is along D_r, the width).
Each coordinate g in [-1, 1] becomes a position in the input:

    align_corners:      (g + 1) / 2 * (size - 1)    (-1 and 1: the corner pixels' centres)
    otherwise:          ((g + 1) * size - 1) / 2    (-1 and 1: the corner pixels' edges)

then the padding mode: "zeros" leaves it (taps outside read 0), "border" clips it to
[0, size - 1], "reflection" reflects it about the edges (the corner centres, or their
outer edges without align_corners) and clips it. "linear" reads the 2^r corners around
it, floor and floor + 1 on each axis, weighted by 1 - f and f (f its fraction);
"nearest" reads the one at its rounding (half to even). A corner outside the input
weighs 0 (its weight times 0). Where the grid holds NaN every comparison with it is
false, so its taps are outside: their indices are selected to 0 before the cast to an
integer (no undefined conversion of a NaN), so every gather reads inside X, and a
linear sample's NaN weights make its output NaN (as torch's 2-d kernel has it; a
nearest sample reads nothing there, 0). Cubic is not built here (its converters leave
it to the host).
"""

from __future__ import annotations

import itertools

import numpy as np

MODES = ("linear", "nearest")
PADDINGS = ("zeros", "border", "reflection")


class Refused(Exception):
    """A grid sample this builder does not express (the converter falls back)."""


def grid_sample_ir(cx, x, grid, mode: str, padding: str, align_corners: bool):
    """Y as above, from the IR builder `cx` (the ONNX or the torch converter's context:
    op, const, scalar, cast, reshape); X and the grid with static shapes."""
    if mode not in MODES:
        raise Refused(f"mode {mode!r}")
    if padding not in PADDINGS:
        raise Refused(f"padding mode {padding!r}")
    rank = x.type.rank - 2
    if rank < 1 or grid.type.rank != rank + 2 or grid.shape[-1] != rank \
            or grid.shape[0] != x.shape[0]:
        raise Refused(f"input {x.shape} with grid {grid.shape}")
    if x.dtype not in ("f32", "f64"):
        raise Refused(f"dtype {x.dtype}")
    n, c, sizes = x.shape[0], x.shape[1], x.shape[2:]
    out_sp = tuple(grid.shape[1:-1])
    p = int(np.prod(out_sp, dtype=np.int64))
    if min(sizes) == 0 or p == 0 or n * c == 0:
        raise Refused("an empty input or grid")
    dt = x.dtype
    g = cx.cast(grid, dt)
    # one (N, 1, P) coordinate per spatial dim d, the first spatial dim first
    coords = []
    for d in range(rank):
        comp = rank - 1 - d
        starts = (0,) * (rank + 1) + (comp,)
        part = cx.op("slice", g, starts=starts, steps=(1,) * (rank + 2),
                     sizes=tuple(grid.shape[:-1]) + (1,))
        coords.append(_position(cx, cx.reshape(part, (n, 1, p)), sizes[d], dt,
                                padding, align_corners))
    strides = [int(np.prod(sizes[d + 1:], dtype=np.int64)) for d in range(rank)]
    total_in = int(np.prod(sizes, dtype=np.int64))
    # (N, C, 1): where each image and channel starts in X's flat buffer
    base = cx.const((np.arange(n * c, dtype=np.int64) * total_in).reshape(n, c, 1))
    flat = cx.reshape(x, (n * c * total_in,))
    taps = [_taps_linear(cx, q, size, dt) if mode == "linear" else
            _tap_nearest(cx, q, size, dt) for q, size in zip(coords, sizes)]
    out = None
    for corner in itertools.product(*taps):
        weight, inside, index = None, None, None
        for (w, ok, i), stride in zip(corner, strides):
            weight = w if weight is None else (cx.op("mul", weight, w) if w is not None
                                               else weight)
            inside = ok if inside is None else cx.op("and", inside, ok)
            term = cx.op("mul", i, cx.scalar(stride, "i64")) if stride != 1 else i
            index = term if index is None else cx.op("add", index, term)
        index = cx.op("add", index, base)  # (N, C, P)
        vals = cx.op("gather", flat, index, axis=0)
        mask = cx.cast(inside, dt)  # a product, not a select: a NaN weight stays NaN
        w = mask if weight is None else cx.op("mul", weight, mask)
        term = cx.op("mul", vals, w)
        out = term if out is None else cx.op("add", out, term)
    return cx.reshape(out, (n, c) + out_sp)


def _position(cx, g, size: int, dt: str, padding: str, align_corners: bool):
    """A normalized coordinate as a position along an input dim of `size`, padded."""
    if align_corners:
        q = cx.op("mul", cx.op("add", g, cx.scalar(1.0, dt)), cx.scalar((size - 1) / 2, dt))
    else:
        q = cx.op("sub", cx.op("mul", cx.op("add", g, cx.scalar(1.0, dt)),
                               cx.scalar(size / 2, dt)), cx.scalar(0.5, dt))
    if padding == "reflection":
        q = _reflect(cx, q, size, dt, align_corners)
    if padding in ("border", "reflection"):
        q = cx.op("min", cx.op("max", q, cx.scalar(0.0, dt)), cx.scalar(float(size - 1), dt))
    return q


def _reflect(cx, q, size: int, dt: str, align_corners: bool):
    """q reflected into [lo, hi] (the corner centres, or edges), as torch does: its
    distance from lo folded by the span, flipped on odd folds."""
    lo, hi = (0.0, float(size - 1)) if align_corners else (-0.5, size - 0.5)
    span = hi - lo
    if span <= 0:
        return cx.op("mul", q, cx.scalar(0.0, dt))
    dist = cx.op("abs", cx.op("sub", q, cx.scalar(lo, dt)))
    folds = cx.op("floor", cx.op("div", dist, cx.scalar(span, dt)))
    extra = cx.op("sub", dist, cx.op("mul", folds, cx.scalar(span, dt)))
    odd = cx.op("ne", cx.op("sub", folds, cx.op("mul", cx.op(
        "floor", cx.op("mul", folds, cx.scalar(0.5, dt))), cx.scalar(2.0, dt))),
        cx.scalar(0.0, dt))
    flipped = cx.op("sub", cx.scalar(span, dt), extra)
    return cx.op("add", cx.op("select", odd, flipped, extra), cx.scalar(lo, dt))


def _index(cx, q, size: int, dt: str):
    """(inside, index): whether integral position q lies in [0, size), and q as an i64
    (0 where it does not: a NaN is never converted)."""
    inside = cx.op("and", cx.op("ge", q, cx.scalar(0.0, dt)),
                   cx.op("le", q, cx.scalar(float(size - 1), dt)))
    safe = cx.op("select", inside, q, cx.scalar(0.0, dt))
    return inside, cx.cast(safe, "i64")


def _taps_linear(cx, q, size: int, dt: str):
    """The two taps of a linear sample along one dim: [(weight, inside, index)]."""
    lo = cx.op("floor", q)
    frac = cx.op("sub", q, lo)
    hi = cx.op("add", lo, cx.scalar(1.0, dt))
    taps = []
    for pos, w in ((lo, cx.op("sub", cx.scalar(1.0, dt), frac)), (hi, frac)):
        inside, index = _index(cx, pos, size, dt)
        taps.append((w, inside, index))
    return taps


def _tap_nearest(cx, q, size: int, dt: str):
    """The one tap of a nearest sample (position rounded half to even)."""
    inside, index = _index(cx, cx.op("round", q), size, dt)
    return [(None, inside, index)]
