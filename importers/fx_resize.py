"""torch's F.interpolate (nearest, nearest-exact, linear, bilinear, trilinear, bicubic)
as constant-index gathers, weighted and summed.

AOTAutograd decomposes the upsample ops while it traces (Python kernels at
CompositeImplicitAutograd and Autograd) into advanced indexing with several computed
index tensors. So `route_interpolate` (bridge/torch_backend.py calls it on dynamo's
graph with gradients off, as it routes recurrent layers: the op has no backward here)
turns dynamo's F.interpolate calls into the opaque op braze::interpolate, which runs
F.interpolate itself when it is not converted. Its converter resizes each axis with
taps from importers/interpolation.py at torch's own source coordinates, computed in
float32 as ATen does (UpSample.h):

  scale    = align_corners ? (in - 1) / (out - 1) (0 for out = 1)
             : 1 / scale_factor when one was given (in double), else in / out
  nearest        src = floor(dst * scale)            (clamped to in - 1)
  nearest-exact  src = floor((dst + 0.5) * scale)
  linear, cubic  src = align_corners ? dst * scale : (dst + 0.5) * scale - 0.5,
                 and linear clamps a negative src to 0
  an axis whose length does not change is copied, whatever the scale (not by bicubic)

Linear takes the two inputs around src, cubic four with Keys' A = -0.75, both reading
the edge for taps past it, as ONNX's Resize does (the same interpolation module).
"""

from __future__ import annotations

import numpy as np
import torch

import torch.nn.functional as F
from torch import Tensor

from importers.fx_context import Ctx, Fallback, converts
from importers.interpolation import Interpolation, NotInterpolable, Taps, resize_axis, resize_ir

# F.interpolate's modes: (interpolation, nearest-exact?) in importers/interpolation.py
MODES = {"nearest": ("nearest", False), "nearest-exact": ("nearest", True),
         "linear": ("linear", False), "bilinear": ("linear", False),
         "trilinear": ("linear", False), "bicubic": ("cubic", False)}


@torch.library.custom_op("braze::interpolate", mutates_args=())
def interpolate(input: Tensor, size: list[int], mode: str, align_corners: bool,
                scales: list[float]) -> Tensor:
    """F.interpolate as one opaque op (braze converts it; else it runs as itself): the
    scale factors when the call gave them (torch's coordinates use them), else `size`."""
    corners = align_corners if MODES[mode][0] != "nearest" else None
    if scales:
        return F.interpolate(input, scale_factor=scales, mode=mode, align_corners=corners)
    return F.interpolate(input, size=size, mode=mode, align_corners=corners)


@interpolate.register_fake
def _(input, size, mode, align_corners, scales):
    return input.new_empty(tuple(input.shape[:2]) + tuple(size))


def route_interpolate(gm: torch.fx.GraphModule) -> int:
    """Turn dynamo's F.interpolate calls into braze::interpolate, when gradients are off
    and the output shape is static; returns how many."""
    if torch.is_grad_enabled():
        return 0
    count = 0
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is F.interpolate:
            args = _routed_args(n)
            if args is not None:
                n.target, n.args, n.kwargs = torch.ops.braze.interpolate.default, args, {}
                count += 1
    if count:
        gm.recompile()
    return count


_PARAMS = ("input", "size", "scale_factor", "mode", "align_corners",
           "recompute_scale_factor", "antialias")


def _routed_args(n: torch.fx.Node) -> tuple | None:
    """braze::interpolate's arguments for one F.interpolate node, or None when it stays
    as it is (a mode braze does not convert, antialias, a dynamic shape)."""
    call = dict(zip(_PARAMS, n.args), **n.kwargs)
    out = n.meta.get("example_value")
    mode = call.get("mode", "nearest")
    if mode not in MODES or call.get("antialias") or not isinstance(out, torch.Tensor) \
            or not all(isinstance(d, int) for d in out.shape):
        return None
    spatial = out.dim() - 2
    scale = call.get("scale_factor")
    if call.get("recompute_scale_factor") or scale is None:
        scales = []
    else:
        scales = [float(s) for s in (scale if isinstance(scale, (list, tuple))
                                     else [scale] * spatial)]
    if any(isinstance(s, torch.SymFloat) for s in scales):
        return None
    return (call["input"], list(out.shape[2:]), mode, bool(call.get("align_corners")),
            scales)


@converts(torch.ops.braze.interpolate.default)
def _interpolate(cx: Ctx, x, size, mode, align_corners, scales):
    kind, exact = MODES[mode]
    return _resize(cx, x, kind, align_corners and kind != "nearest", scales or None, exact)


def _resize(cx: Ctx, x, mode: str, align_corners: bool, scales, exact: bool = False):
    out = cx.out().shape
    if any(d is None for d in out) or any(d is None for d in x.shape):
        raise Fallback("a dynamic size")
    spatial = x.type.rank - 2
    given = (scales or [None] * spatial) + [None] * spatial

    def coordinates(axis: int, n_in: int, n_out: int) -> np.ndarray:
        return _source(mode, align_corners, exact, n_in, n_out, given[axis - 2])

    factors = [1.0] * x.type.rank
    for a in range(2, x.type.rank):  # the scale torch's coordinates use
        factors[a] = given[a - 2] or out[a] / x.shape[a]
    how = Interpolation(mode=mode, nearest="floor")
    try:
        return resize_ir(cx, x, how, list(out), factors, coordinates)
    except NotInterpolable as e:
        raise Fallback(str(e)) from None


def _source(mode: str, align_corners: bool, exact: bool, n_in: int, n_out: int,
            scale_factor) -> np.ndarray:
    """ATen's source coordinate of every output index, in float32 (module doc)."""
    f = np.float32
    dst = np.arange(n_out, dtype=f)
    if n_in == n_out and mode != "cubic":  # ATen copies such an axis (not for bicubic)
        return dst.astype(np.float64)
    if align_corners:
        scale = f(n_in - 1) / f(n_out - 1) if n_out > 1 else f(0)
    elif scale_factor is not None and scale_factor > 0:
        scale = f(1.0 / scale_factor)  # in double, then float: ATen's compute_scales_value
    else:
        scale = f(n_in) / f(n_out)
    if mode == "nearest":
        src = (dst + f(0.5)) * scale if exact else dst * scale
        return np.minimum(np.floor(src), n_in - 1).astype(np.float64)
    if align_corners:
        return (dst * scale).astype(np.float64)
    src = (dst + f(0.5)) * scale - f(0.5)
    if mode == "linear":
        src = np.maximum(src, f(0))
    return src.astype(np.float64)


# torch's antialiased resizing (F.interpolate(antialias=True), torchvision's resize of
# tensors): the aten op -> (its filter, the filter's support at scale 1)
def _aa_linear(x: np.ndarray) -> np.ndarray:
    return np.maximum(0.0, 1.0 - np.abs(x))


def _aa_cubic(x: np.ndarray) -> np.ndarray:
    a, x = -0.5, np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return np.where(x < 1, near, np.where(x < 2, far, 0.0))


_AA = {torch.ops.aten._upsample_bilinear2d_aa.default: (_aa_linear, 2),
       torch.ops.aten._upsample_bicubic2d_aa.default: (_aa_cubic, 4)}


@converts(*_AA)
def _resize_antialiased(cx: Ctx, x, output_size, align_corners, scales_h=None,
                        scales_w=None):
    """Antialiased bilinear / bicubic resizing of the last two axes, as aten computes it
    (`aa_taps`), one axis after the other: gathers at constant indices with constant
    weights, as the other resizes."""
    filt, size = _AA[cx.target]
    out = cx.out().shape
    if any(d is None for d in out) or any(d is None for d in x.shape):
        raise Fallback("a dynamic size")
    if x.dtype not in ("f32", "f64"):
        raise Fallback(f"antialiased resizing of {x.dtype} data")
    for axis, given in ((3, scales_w), (2, scales_h)):
        taps = aa_taps(x.shape[axis], out[axis], align_corners, given, filt, size)
        if not taps.is_identity():
            try:
                x = resize_axis(cx, x, axis, taps)
            except NotInterpolable as e:
                raise Fallback(str(e)) from None
    return x


def aa_taps(n_in: int, n_out: int, align_corners: bool, scale_factor, filt,
            size: int) -> Taps:
    """aten's antialiased taps of one axis (float inputs): scale = n_in / n_out (or
    1 / the given factor; (n_in - 1) / (n_out - 1) with align_corners), the filter
    stretched by the scale when downsampling (support = size / 2 * max(scale, 1)),
    output i centred at scale * (i + 0.5), reading inputs [xmin, xmin + xsize) with the
    filter's weights normalized to sum 1."""
    f = np.float32  # aten computes the taps in float for float inputs
    if align_corners:
        scale = f(n_in - 1) / f(n_out - 1) if n_out > 1 else f(0)
    elif scale_factor is not None and scale_factor > 0:
        scale = f(1.0 / scale_factor)
    else:
        scale = f(n_in) / f(n_out)
    support = f(size * 0.5) * scale if scale >= 1 else f(size * 0.5)
    invscale = f(1) / scale if scale >= 1 else f(1)
    width = int(np.ceil(support)) * 2 + 1
    indices = np.zeros((width, n_out), np.int64)
    weights = np.zeros((width, n_out), np.float64)
    for i in range(n_out):
        center = scale * f(i + 0.5)
        xmin = max(int(center - support + f(0.5)), 0)
        xsize = min(max(min(int(center + support + f(0.5)), n_in) - xmin, 0), width)
        j = np.arange(xsize, dtype=f)
        w = filt((j + f(xmin) - center + f(0.5)) * invscale).astype(f)
        total = w.sum(dtype=f) if xsize else f(0)
        indices[:, i] = min(xmin, n_in - 1)
        indices[:xsize, i] = xmin + np.arange(xsize)
        weights[:xsize, i] = w / total if total != 0 else w
    return Taps(indices, weights, n_in)


# aten's grid sampler codes: interpolation 0 bilinear, 1 nearest, 2 bicubic; padding 0
# zeros, 1 border, 2 reflection.
_GRID_MODES = {0: "linear", 1: "nearest", 2: "cubic"}
_GRID_PADDINGS = {0: "zeros", 1: "border", 2: "reflection"}


@converts(torch.ops.aten.grid_sampler_2d.default, torch.ops.aten.grid_sampler_3d.default)
def _grid_sampler(cx: Ctx, x, grid, interpolation_mode, padding_mode, align_corners):
    """F.grid_sample (RAFT's flow warping, spatial transformers): bilinear, nearest or
    bicubic, any padding, as gathers at computed indices (importers/grid_sample.py)."""
    from importers.grid_sample import Refused, grid_sample_ir

    try:
        return grid_sample_ir(cx, x, grid, _GRID_MODES.get(interpolation_mode, "?"),
                              _GRID_PADDINGS.get(padding_mode, "?"), bool(align_corners))
    except Refused as e:
        raise Fallback(f"grid sampling: {e}") from None
