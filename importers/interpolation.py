"""Resizing one axis as taps: out[j] = sum_t w[t, j] * x[idx[t, j]], all known at import.

ONNX's Resize (and Upsample) is separable: the n-d resize is a 1-d resize of each axis
in turn. For one axis of `n_in` elements resized to `n_out`, each output j maps to a
source coordinate x = x_ori(j) (the coordinate transformation mode), and reads the
`taps` inputs nearest x with coefficients of the ratio r = x - floor(x) (r = 1 where x
is an integer, as ONNX's reference convention has it):

  base = floor(x), or x - 1 where x is an integer
  idx[t] = base + t - taps/2 + 1          (t < taps; taps is even in every mode)
  nearest: 2 taps, one of weight 1 (per nearest_mode); linear: [1 - r, r];
  cubic: Keys' kernel with coefficient A at distances 1 + r, r, 1 - r, 2 - r;
  antialias (linear or cubic when downsampling by s < 1): the kernel stretched by
  1/s over 2 - 2 * floor(-k/s + 1) taps (k = 1 linear, 2 cubic), normalized to sum 1.

A tap outside [0, n_in) reads the edge element (ONNX pads with the edge), or with
exclude_outside gets weight 0 and the rest are renormalized. The converter
(importers/onnx_ops/resize.py) turns each axis into gathers with constant indices,
scaled by constant weights and summed: index arithmetic in braze's kernels
(`resize_ir`, shared by the ONNX and torch converters).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel",
                    "align_corners", "asymmetric")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple")
# Taps per output at most: linear antialias downsampling by 1/8 needs 16, and a wider
# footprint is a convolution better left to the host library.
MAX_TAPS = 16


@dataclass(frozen=True)
class Interpolation:
    """How every axis is resized (ONNX Resize's attributes)."""

    mode: str = "nearest"  # "nearest", "linear" or "cubic"
    coordinates: str = "half_pixel"
    nearest: str = "round_prefer_floor"  # "simple": ONNX Resize-10 / Upsample (ORT)
    cubic_a: float = -0.75
    exclude_outside: bool = False
    antialias: bool = False


@dataclass(frozen=True)
class Taps:
    """One axis's taps: out[j] = sum_t weights[t, j] * x[indices[t, j]]."""

    indices: np.ndarray  # int64 [taps, n_out], each in [0, n_in)
    weights: np.ndarray  # float64 [taps, n_out]
    n_in: int

    def is_identity(self) -> bool:
        """Whether the axis keeps its length and every output j is input j, unscaled."""
        n_out = self.indices.shape[1]
        if n_out != self.n_in:
            return False
        picks = (self.indices == np.arange(n_out)) & (self.weights == 1.0)
        rest = np.where(picks, 0.0, self.weights)
        return bool(np.all(picks.any(axis=0)) and not np.any(rest))


def source_coordinates(how: Interpolation, n_in: int, n_out: int, scale: float) -> np.ndarray:
    """x_ori for every output index, computed in float32 operation by operation as
    onnxruntime does: a coordinate that lands on an integer in float32 and just below it
    in float64 picks another nearest neighbour. (ONNX's Python reference differs from
    onnxruntime in two corners, where braze follows onnxruntime: align_corners divides by
    the integer output length less one, and pytorch_half_pixel maps a length-1 output to
    0, not -0.5.)"""
    f = np.float32
    y = np.arange(n_out, dtype=f)
    s = f(scale)
    half = f(0.5)
    mode = how.coordinates
    if mode == "align_corners":
        if n_out == 1:
            return np.zeros(1)
        return (y * f(n_in - 1) / f(n_out - 1)).astype(np.float64)
    if mode == "asymmetric":
        return (y / s).astype(np.float64)
    if mode == "pytorch_half_pixel":
        if n_out == 1:
            return np.zeros(1)
        return ((y + half) / s - half).astype(np.float64)
    if mode == "half_pixel":
        return ((y + half) / s - half).astype(np.float64)
    if mode == "half_pixel_symmetric":
        adjustment = f(n_out) / (s * f(n_in))
        offset = f(n_in) / f(2) * (f(1) - adjustment)
        return (offset + (y + half) / s - half).astype(np.float64)
    raise ValueError(f"coordinate transformation mode {mode!r}")


def axis_taps(how: Interpolation, n_in: int, n_out: int, scale: float,
              x: np.ndarray | None = None) -> Taps:
    """The taps resizing one axis of n_in elements to n_out (module doc), at the source
    coordinates `x` when given (torch's own), else at ONNX's (`source_coordinates`)."""
    if x is None:
        x = source_coordinates(how, n_in, n_out, scale)
    floor = np.floor(x)
    whole = x == floor
    ratio = np.where(whole, 1.0, x - floor)
    base = np.where(whole, x - 1, floor).astype(np.int64)
    weights = _coefficients(how, ratio, scale)
    taps = weights.shape[0]
    indices = base[None, :] + (np.arange(taps) - taps // 2 + 1)[:, None]
    if how.exclude_outside:
        weights = np.where((indices < 0) | (indices >= n_in), 0.0, weights)
        weights = weights / weights.sum(axis=0, keepdims=True)
    return Taps(np.clip(indices, 0, n_in - 1), weights, n_in)


def _coefficients(how: Interpolation, ratio: np.ndarray, scale: float) -> np.ndarray:
    """[taps, n_out] coefficients for each output's ratio."""
    if how.mode == "nearest":
        return _nearest(how.nearest, ratio, scale)
    s = min(scale, 1.0) if how.antialias else 1.0
    reach = 1 if how.mode == "linear" else 2  # the kernel's half width
    start = int(np.floor(-reach / s) + 1)
    offsets = np.arange(start, 2 - start, dtype=np.float64)
    dist = np.abs((offsets[:, None] - ratio[None, :]) * s)
    if how.mode == "linear":
        coeffs = np.clip(1 - dist, 0, 1)
    else:
        coeffs = _keys(dist, how.cubic_a)
    if how.antialias:
        coeffs = coeffs / coeffs.sum(axis=0, keepdims=True)
    return coeffs


def _keys(d: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel at distances d >= 0."""
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def _nearest(mode: str, ratio: np.ndarray, scale: float) -> np.ndarray:
    """[2, n_out]: which of the two taps around x each output takes."""
    if mode == "round_prefer_floor":
        upper = ratio > 0.5
    elif mode == "round_prefer_ceil":
        upper = ratio >= 0.5
    elif mode == "floor":
        upper = np.zeros(ratio.shape, bool)
    elif mode == "ceil":
        upper = np.ones(ratio.shape, bool)
    elif mode == "simple":  # onnxruntime's rule before nearest_mode existed
        upper = np.full(ratio.shape, scale < 1)
    else:
        raise ValueError(f"nearest mode {mode!r}")
    upper = upper | (ratio == 1.0)  # an integer coordinate is the upper tap itself
    return np.stack([~upper, upper]).astype(np.float64)


class NotInterpolable(Exception):
    """A resize `resize_ir` does not express; the message says why (a converter's
    Fallback reason)."""


def resize_ir(cx, x, how: Interpolation, out: list[int], factors: list[float],
              coordinates=None):
    """The IR value of `x` resized axis by axis to `out` with `how`: one gather per tap
    (constant indices), scaled by a constant per output position, summed. `cx` is a
    converter context (its `op` and `const`); `factors[a]` is axis a's scale
    (out / in, or the one given), `coordinates(axis, n_in, n_out)` the source
    coordinates when the front end defines its own. Axes left unchanged are skipped."""
    if x.dtype not in ("f32", "f64"):
        raise NotInterpolable(f"resizing {x.dtype} data")
    if any(n <= 0 for n in out) or 0 in x.shape:
        raise NotInterpolable("an empty input or output")
    for axis in _axis_order(x.shape, out):
        n_in, n_out = x.shape[axis], out[axis]
        if n_in == n_out and factors[axis] == 1.0:
            continue
        at = None if coordinates is None else coordinates(axis, n_in, n_out)
        taps = axis_taps(how, n_in, n_out, factors[axis], at)
        if not taps.is_identity():
            x = resize_axis(cx, x, axis, taps)
    return x


def _axis_order(shape, out) -> list[int]:
    """The order the axes are resized in. A gather along the last axis reads a computed
    position per element (no vectors); along any other it reads whole rows, which the
    loop vectorizer widens. So the last axis goes first when the others grow, and the
    few elements it is gathered for are the input's: a 28x28 -> 224x224 bilinear
    upsample of 21 channels, NCHW, gathered 131K elements one by one instead of 1M
    (2.26 -> 0.5 ms at 1 thread; onnxruntime 0.78)."""
    axes = list(range(len(shape)))
    if not axes:
        return axes
    grow = np.prod(out[:-1], dtype=np.float64) >= np.prod(shape[:-1], dtype=np.float64)
    return axes[-1:] + axes[:-1] if grow else axes


def resize_axis(cx, x, axis: int, taps: Taps):
    """x resized along `axis` by `taps`: a gather per tap with a nonzero weight, scaled
    and summed (NotInterpolable past MAX_TAPS)."""
    keep = np.any(taps.weights != 0, axis=1)  # taps with some nonzero weight
    indices, weights = taps.indices[keep], taps.weights[keep]
    if len(indices) > MAX_TAPS:
        raise NotInterpolable(f"{len(indices)} taps per output on axis {axis} "
                              f"(at most {MAX_TAPS})")
    shape = [1] * x.type.rank
    shape[axis] = indices.shape[1]
    dtype = np.float32 if x.dtype == "f32" else np.float64
    total = None
    for idx, w in zip(indices, weights):
        term = cx.op("gather", x, cx.const(idx), axis=axis)
        if not np.all(w == 1.0):
            term = cx.op("mul", term, cx.const(w.astype(dtype).reshape(shape)))
        total = term if total is None else cx.op("add", total, term)
    return total
