"""Resize and Upsample: each resized axis as constant-index gathers, weighted and summed.

The taps of each axis come from importers/interpolation.py (ONNX's coordinate
transforms, nearest modes, linear, cubic, exclude_outside, antialias); here they
become IR: one gather per tap along the axis (constant indices: index arithmetic in
the kernel), times a constant weight per output position, summed. Axes whose taps
are the identity are left alone. Output sizes must be known at import (constant
scales or sizes, static input shape); tf_crop_and_resize (a region and an
extrapolation value) and non-float data stay on the host.

Resize-10 and Upsample use onnxruntime's rules from before coordinate_transformation_mode
existed: asymmetric coordinates, and nearest takes floor(x) when upsampling and
ceil(x) when downsampling.
"""

from __future__ import annotations

import numpy as np

from compiler.errors import InvalidModelError
from compiler.ir import Value
from importers.interpolation import (COORDINATE_MODES, NEAREST_MODES, Interpolation,
                                     NotInterpolable, resize_ir)
from importers.onnx_ops import Fallback, converter
from importers.onnx_ops.context import NodeContext

MODES = ("nearest", "linear", "cubic")


@converter("Resize", 11)
def convert_resize(cx: NodeContext):
    x = cx.x
    how = _interpolation(cx)
    scales, sizes = cx.const_input(2, "scales"), cx.const_input(3, "sizes")
    if scales is not None and scales.size == 0:
        scales = None
    axes = _axes(cx, x.type.rank)
    out, factors = _output(cx, x.shape, axes, scales, sizes)
    return [resize(cx, x, how, out, factors)]


@converter("Resize", 10, 10)
def convert_resize_10(cx: NodeContext):
    return _legacy(cx, cx.const_input(1, "scales"))


@converter("Upsample", 9, 9)
def convert_upsample_9(cx: NodeContext):
    return _legacy(cx, _upscales(cx, cx.const_input(1, "scales")))


@converter("Upsample", 7, 8)
def convert_upsample_7(cx: NodeContext):
    return _legacy(cx, _upscales(cx, np.asarray(cx.attr("scales"), np.float32)))


def _upscales(cx: NodeContext, scales: np.ndarray) -> np.ndarray:
    """Upsample's scales: at least 1 each (onnxruntime refuses the model otherwise)."""
    if np.any(scales < 1):
        raise InvalidModelError(f"{cx.describe}: Upsample scales must be at least 1, got "
                                f"{scales.tolist()}")
    return scales


def _legacy(cx: NodeContext, scales: np.ndarray):
    mode = cx.attr("mode", "nearest")
    mode = "linear" if mode == "bilinear" else mode  # Upsample-7's other name for it
    if mode not in ("nearest", "linear"):
        raise InvalidModelError(f"{cx.describe}: mode {mode!r}")
    how = Interpolation(mode=mode, coordinates="asymmetric", nearest="simple")
    x = cx.x
    out, factors = _output(cx, x.shape, list(range(x.type.rank)), scales, None)
    return [resize(cx, x, how, out, factors)]


def _interpolation(cx: NodeContext) -> Interpolation:
    mode = cx.attr("mode", "nearest")
    coordinates = cx.attr("coordinate_transformation_mode", "half_pixel")
    nearest = cx.attr("nearest_mode", "round_prefer_floor")
    if mode not in MODES:
        raise InvalidModelError(f"{cx.describe}: mode {mode!r}")
    if coordinates == "tf_crop_and_resize":
        raise Fallback("tf_crop_and_resize: a region of interest and an extrapolation value")
    if coordinates not in COORDINATE_MODES or nearest not in NEAREST_MODES[:4]:
        raise InvalidModelError(f"{cx.describe}: coordinate_transformation_mode "
                                f"{coordinates!r} / nearest_mode {nearest!r}")
    if cx.attr("keep_aspect_ratio_policy", "stretch") not in ("stretch", "not_larger",
                                                                "not_smaller"):
        raise InvalidModelError(f"{cx.describe}: keep_aspect_ratio_policy")
    return Interpolation(mode=mode, coordinates=coordinates, nearest=nearest,
                         cubic_a=float(cx.attr("cubic_coeff_a", -0.75)),
                         exclude_outside=bool(cx.attr("exclude_outside", 0)),
                         antialias=bool(cx.attr("antialias", 0)) and mode != "nearest")


def _axes(cx: NodeContext, rank: int) -> list[int]:
    axes = cx.attr("axes")
    if axes is None:
        return list(range(rank))
    axes = [cx.axis(a, rank) for a in axes]
    if len(set(axes)) != len(axes):
        raise InvalidModelError(f"{cx.describe}: repeated axes {axes}")
    return axes


def _output(cx: NodeContext, shape, axes, scales, sizes) -> tuple[list[int], list[float]]:
    """Each axis's output length and the scale its coordinates use (ONNX Resize)."""
    if not all(isinstance(d, int) for d in shape):
        raise Fallback("the input shape is not static")
    out, factors = list(shape), [1.0] * len(shape)
    if (scales is None) == (sizes is None):
        raise InvalidModelError(f"{cx.describe}: exactly one of scales and sizes is needed")
    given = scales if scales is not None else sizes
    if given.size != len(axes):
        raise InvalidModelError(f"{cx.describe}: {given.size} scales or sizes for "
                                f"{len(axes)} axes")
    if scales is not None:
        for a, s in zip(axes, scales.astype(np.float64)):
            if not s > 0:
                raise InvalidModelError(f"{cx.describe}: scale {s}")
            # the product in float32, as onnxruntime takes it
            out[a], factors[a] = int(np.float32(shape[a]) * np.float32(s)), float(s)
        return out, factors
    for a, n in zip(axes, sizes.astype(np.int64)):
        out[a], factors[a] = int(n), int(n) / shape[a] if shape[a] else 1.0
    policy = cx.attr("keep_aspect_ratio_policy", "stretch")
    if policy != "stretch":
        pick = min if policy == "not_larger" else max
        s = pick(factors[a] for a in axes)
        for a in axes:
            out[a], factors[a] = int(s * shape[a] + 0.5), s
    return out, factors


def resize(cx: NodeContext, x: Value, how: Interpolation, out: list[int],
           factors: list[float]) -> Value:
    """x resized axis by axis to `out` (importers/interpolation.py)."""
    try:
        return resize_ir(cx, x, how, out, factors)
    except NotInterpolable as e:
        raise Fallback(str(e)) from None


# GridSample-16 names its modes bilinear, nearest, bicubic; GridSample-20 (n-d) linear,
# nearest, cubic.
_GRID_MODES = {"bilinear": "linear", "linear": "linear", "nearest": "nearest",
               "bicubic": "cubic", "cubic": "cubic"}


@converter("GridSample", 16)
def convert_grid_sample(cx: NodeContext):
    """Linear, nearest and (2-d) cubic sampling with any padding mode as gathers at
    computed indices (importers/grid_sample.py); what it refuses stays on the host."""
    from importers.grid_sample import Refused, grid_sample_ir

    x, grid = cx.inputs[:2]
    mode = cx.attr("mode", "bilinear" if cx.version < 20 else "linear")
    if mode not in _GRID_MODES:
        raise InvalidModelError(f"{cx.describe}: unknown mode {mode!r}")
    padding = cx.attr("padding_mode", "zeros")
    try:
        return [grid_sample_ir(cx, x, grid, _GRID_MODES[mode], padding,
                               bool(cx.attr("align_corners", 0)))]
    except Refused as e:
        raise Fallback(f"GridSample: {e}") from None
