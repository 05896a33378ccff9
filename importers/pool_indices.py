"""Max pooling with the position of each maximum, shared by both importers (torch's
max_pool{1,2,3}d_with_indices and adaptive_max_pool{1,2,3}d; ONNX MaxPool's Indices).

Each output position o reads, along every spatial dim d, the input coordinates
P_d[o_d, k] of its window's taps k, valid where V_d[o_d, k] (inside the input, inside
the window):

  regular windows   P[o, k] = o * stride - pad_begin + k * dilation,  V = 0 <= P < I
  adaptive windows  P[o, k] = floor(o I / O) + k,  V = P < ceil((o + 1) I / O)
                    (k up to the longest window; torch's windows)

Tap t = (k_1, ..., k_n) reads x at (P_1[., k_1], ..., P_n[., k_n]): a strided slice of
x (padded where taps reach past it) when those coordinates step evenly along every
dim, else a gather with constant coordinates. The maximum and its place are one chain
of selects over the taps in row-major order, each tap's flat position in the plane a
constant known now:

  best = lowest, at = the first valid tap's position
  for t: take = V_t and (x_t > best  [or isnan(x_t): torch's CPU kernel]);
         best = select(take, x_t, best); at = select(take, pos_t, at)

so ties keep the first maximum, as torch and onnxruntime do, and with nan_wins a NaN
takes the place as torch's kernel has it (`val > max || isnan(val)`). The positions
are flat within one (N, C) plane, sum_d P_d * S_d with S the plane's row-major strides
(ONNX's storage_order=1: column-major over the spatial dims); ONNX's are over the
whole tensor, the caller adds (n * C + c) * plane. The chain is elementwise and
movement ops only: one fused loop, nothing on the host.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from compiler import dtypes
from importers.transposed import NotLowered

# Windows with more taps than this are refused: each tap is a slice or gather and five
# elementwise ops in the one loop (a 3x3 pool has 9, an adaptive 7 -> 2 pool 16).
POOL_INDEX_MAX_TAPS = 256


@dataclass
class Windows:
    """One spatial dim's windows: `positions` [O, K] the input coordinate of each
    output's k-th tap, `valid` [O, K] whether that tap reads the input."""

    size: int  # the input's length along this dim
    positions: np.ndarray
    valid: np.ndarray


def regular(size: int, out: int, kernel: int, stride: int, pad: int,
            dilation: int) -> Windows:
    """Windows of `kernel` taps `dilation` apart, `stride` apart, from -pad."""
    pos = (np.arange(out)[:, None] * stride - pad + np.arange(kernel)[None, :] * dilation)
    return Windows(size, pos, (pos >= 0) & (pos < size))


def adaptive(size: int, out: int) -> Windows:
    """torch's adaptive windows [floor(o I / O), ceil((o + 1) I / O))."""
    lo = np.arange(out) * size // out
    hi = -(-(np.arange(out) + 1) * size // out)
    pos = lo[:, None] + np.arange(int((hi - lo).max()))[None, :]
    return Windows(size, pos, pos < hi[:, None])


def plane_strides(spatial, column_major: bool = False) -> list[int]:
    """Element strides of each spatial dim within one (N, C) plane."""
    dims = list(spatial)[::-1] if column_major else list(spatial)
    st = [math.prod(dims[i + 1:]) for i in range(len(dims))]
    return st[::-1] if column_major else st


def max_with_indices(cx, x, windows: list[Windows], strides, nan_wins: bool):
    """(the maximum over each window, its flat i64 position within the (N, C) plane):
    x is N, C, spatial...; one `Windows` and one plane stride per spatial dim."""
    _check(x, windows)
    x, shifted = _padded(cx, x, windows)
    out_dims = tuple(w.positions.shape[0] for w in windows)
    best = cx.const(np.asarray(_lowest(x.dtype), dtypes.to_numpy(x.dtype)))
    at = cx.const(_first_positions(windows, strides))
    floats = x.dtype in dtypes.FLOATS
    for tap in itertools.product(*(range(w.positions.shape[1]) for w in windows)):
        valid = _outer([w.valid[:, k] for w, k in zip(windows, tap)], np.logical_and)
        if not valid.any():
            continue
        piece = _tap(cx, x, shifted, tap, out_dims)
        take = cx.op("gt", piece, best)
        if nan_wins and floats:
            take = cx.op("or", take, cx.op("isnan", piece))
        if not valid.all():
            take = cx.op("and", take, cx.const(valid.reshape((1, 1) + out_dims)))
        pos = _outer([w.positions[:, k] * s for w, k, s in zip(windows, tap, strides)],
                     np.add)
        best = cx.op("select", take, piece, best)
        at = cx.op("select", take, cx.const(pos.astype(np.int64).reshape((1, 1) + out_dims)),
                   at)
    shape = tuple(x.shape[:2]) + out_dims
    return tuple(v if v.shape == shape else cx.op("broadcast", v, shape=shape)
                 for v in (best, at))


def _check(x, windows) -> None:
    if not x.type.static or x.type.rank != len(windows) + 2:
        raise NotLowered(f"max pooling with indices over {x.type}")
    if x.dtype not in dtypes.NUMERIC or x.dtype == "bool":
        raise NotLowered(f"max pooling with indices over {x.dtype}")
    if 0 in x.shape or any(w.positions.size == 0 for w in windows):
        raise NotLowered("max pooling with indices over an empty input or output")
    taps = math.prod(w.positions.shape[1] for w in windows)
    if taps > POOL_INDEX_MAX_TAPS:
        raise NotLowered(f"max pooling with indices over windows of {taps} taps "
                         f"(> POOL_INDEX_MAX_TAPS)")


def _lowest(dtype: str):
    if dtype in dtypes.FLOATS:
        return -np.inf
    return np.iinfo(dtypes.to_numpy(dtype)).min


def _outer(vectors, combine) -> np.ndarray:
    """combine(v_1[:, None, ...], v_2[None, :, ...], ...): one entry per output position."""
    n = len(vectors)
    out = None
    for d, v in enumerate(vectors):
        v = np.asarray(v).reshape((1,) * d + (-1,) + (1,) * (n - d - 1))
        out = v if out is None else combine(out, v)
    return out


def _first_positions(windows, strides) -> np.ndarray:
    """Each output's first valid tap's flat position (where no tap beats `lowest`)."""
    firsts = []
    for w in windows:
        k = np.argmax(w.valid, axis=1)
        firsts.append(w.positions[np.arange(len(k)), k])
    pos = _outer([f * s for f, s in zip(firsts, strides)], np.add)
    return pos.astype(np.int64).reshape((1, 1) + pos.shape)


def _padded(cx, x, windows):
    """x padded where taps reach before 0 or past the end (the padding is never taken:
    those taps are not valid), and the windows' positions shifted to match."""
    before = [max(0, -int(w.positions.min())) for w in windows]
    after = [max(0, int(w.positions.max()) - (w.size - 1)) for w in windows]
    if any(before) or any(after):
        x = cx.op("pad", x, pads=(0, 0) + tuple(before) + (0, 0) + tuple(after),
                  mode="constant", value=0.0)
    shifted = [Windows(w.size, w.positions + b, w.valid) for w, b in zip(windows, before)]
    return x, shifted


def _tap(cx, x, windows, tap, out_dims):
    """x at tap `tap` of every window: N, C, out_dims (a strided slice along the dims
    whose coordinates step evenly, a gather of constant coordinates along the others)."""
    starts, steps, sizes = [0, 0], [1, 1], list(x.shape[:2])
    gathers = []
    for d, (w, k) in enumerate(zip(windows, tap)):
        coords = w.positions[:, k]
        step = int(coords[1] - coords[0]) if len(coords) > 1 else 1
        if step >= 1 and np.array_equal(coords, coords[0] + step * np.arange(len(coords))):
            starts.append(int(coords[0]))
            steps.append(step)
            sizes.append(out_dims[d])
        else:  # uneven (adaptive windows): the whole dim here, gathered below
            starts.append(0)
            steps.append(1)
            sizes.append(x.shape[2 + d])
            gathers.append((2 + d, coords))
    piece = x
    if tuple(sizes) != tuple(x.shape) or any(starts) or any(s != 1 for s in steps):
        piece = cx.op("slice", x, starts=tuple(starts), steps=tuple(steps),
                      sizes=tuple(sizes))
    for axis, coords in gathers:
        piece = cx.op("gather", piece, cx.const(coords.astype(np.int64)), axis=axis)
    return piece
