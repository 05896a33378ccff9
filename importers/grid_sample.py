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
nearest sample reads nothing there, 0).

"cubic" (2-d only) reads the 4 x 4 taps floor - 1 .. floor + 2 around the unpadded
position, weighted by Keys' cubic kernel (A = -0.75, as torch and onnxruntime), and
applies the padding mode to each tap's position on its own, as torch does.
"""

from __future__ import annotations

import itertools

import numpy as np

MODES = ("linear", "nearest", "cubic")
# Keys' cubic convolution coefficient of torch's (and onnxruntime's) bicubic sampling.
CUBIC_A = -0.75
PADDINGS = ("zeros", "border", "reflection")


class Refused(Exception):
    """A grid sample this builder does not express (the converter falls back)."""


def grid_sample_ir(cx, x, grid, mode: str, padding: str, align_corners: bool):
    """Y as above, from the IR builder `cx` (the ONNX or the torch converter's context:
    op, const, scalar, cast, reshape). Refused (the converters' host fallback, with its
    reason) for what it does not build: dynamic shapes, 3-d cubic, other dtypes."""
    if not x.type.static or not grid.type.static:
        raise Refused("dynamic shapes")
    if mode not in MODES:
        raise Refused(f"mode {mode!r}")
    if mode == "cubic" and x.type.rank != 4:
        raise Refused(f"cubic sampling of a {x.type.rank - 2}-d input (2-d only)")
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
        g_d = cx.reshape(part, (n, 1, p))
        coords.append(_unnormalize(cx, g_d, sizes[d], dt, align_corners) if mode == "cubic"
                      else _position(cx, g_d, sizes[d], dt, padding, align_corners))
    strides = [int(np.prod(sizes[d + 1:], dtype=np.int64)) for d in range(rank)]
    total_in = int(np.prod(sizes, dtype=np.int64))
    # (N, C, 1): where each image and channel starts in X's flat buffer
    base = cx.const((np.arange(n * c, dtype=np.int64) * total_in).reshape(n, c, 1))
    flat = cx.reshape(x, (n * c * total_in,))
    taps = [_taps_linear(cx, q, size, dt) if mode == "linear" else
            _tap_nearest(cx, q, size, dt) if mode == "nearest" else
            _taps_cubic(cx, q, size, dt, padding, align_corners)
            for q, size in zip(coords, sizes)]
    out = None
    for corner in itertools.product(*taps):
        weight, inside, index = None, None, None
        for (w, ok, i), stride in zip(corner, strides):
            if w is not None:  # nearest taps have none
                weight = w if weight is None else cx.op("mul", weight, w)
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


def _unnormalize(cx, g, size: int, dt: str, align_corners: bool):
    """A normalized coordinate as a position along an input dim of `size`."""
    if align_corners:
        return cx.op("mul", cx.op("add", g, cx.scalar(1.0, dt)),
                     cx.scalar((size - 1) / 2, dt))
    return cx.op("sub", cx.op("mul", cx.op("add", g, cx.scalar(1.0, dt)),
                              cx.scalar(size / 2, dt)), cx.scalar(0.5, dt))


def _position(cx, g, size: int, dt: str, padding: str, align_corners: bool):
    """A normalized coordinate as a position along an input dim of `size`, padded."""
    return _padded(cx, _unnormalize(cx, g, size, dt, align_corners), size, dt, padding,
                   align_corners)


def _padded(cx, q, size: int, dt: str, padding: str, align_corners: bool):
    """Position q under the padding mode: as it is (zeros), clipped into the input
    (border), or reflected about its edges and clipped (reflection)."""
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


def _taps_cubic(cx, q, size: int, dt: str, padding: str, align_corners: bool):
    """The four taps of a cubic sample along one dim (torch's bicubic): floor(q) - 1 ..
    floor(q) + 2 weighted by Keys' kernel (CUBIC_A) at their distances from q, each tap
    position padded on its own (border and reflection move the tap, zeros drops it)."""
    lo = cx.op("floor", q)
    t = cx.op("sub", q, lo)
    one = cx.scalar(1.0, dt)
    weights = [_cubic_far(cx, cx.op("add", t, one), dt), _cubic_near(cx, t, dt),
               _cubic_near(cx, cx.op("sub", one, t), dt),
               _cubic_far(cx, cx.op("sub", cx.scalar(2.0, dt), t), dt)]
    taps = []
    for k, w in enumerate(weights):
        pos = cx.op("add", lo, cx.scalar(float(k - 1), dt))
        inside, index = _index(cx, _padded(cx, pos, size, dt, padding, align_corners), size, dt)
        taps.append((w, inside, index))
    return taps


def _cubic_near(cx, d, dt: str):
    """Keys' kernel at distance d <= 1: ((A + 2) d - (A + 3)) d^2 + 1."""
    a = CUBIC_A
    inner = cx.op("sub", cx.op("mul", cx.scalar(a + 2, dt), d), cx.scalar(a + 3, dt))
    return cx.op("add", cx.op("mul", inner, cx.op("mul", d, d)), cx.scalar(1.0, dt))


def _cubic_far(cx, d, dt: str):
    """Keys' kernel at distance 1 < d < 2: ((A d - 5A) d + 8A) d - 4A."""
    a = CUBIC_A
    v = cx.op("sub", cx.op("mul", cx.scalar(a, dt), d), cx.scalar(5 * a, dt))
    v = cx.op("add", cx.op("mul", v, d), cx.scalar(8 * a, dt))
    return cx.op("sub", cx.op("mul", v, d), cx.scalar(4 * a, dt))
