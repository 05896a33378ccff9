"""Positional and signal ops: RotaryEmbedding, AffineGrid, BlackmanWindow,
HammingWindow, HannWindow.

RotaryEmbedding (RoPE, every modern LLM export) rotates pairs of a head's first
rotary_embedding_dim channels by the angle of the token's position:

    real = cos * x1 - sin * x2,    imag = sin * x1 + cos * x2

the pairs being the halves (x1 = x[:R/2], x2 = x[R/2:R], written back as the halves)
or, interleaved, the neighbours (x1 = x[0:R:2], x2 = x[1:R:2], written back between
each other); the channels from R on pass through. The caches are [B, S, R/2], or rows
gathered from [max position, R/2] by the run-time position_ids [B, S]. A 4-D X is
[B, heads, S, head size], a 3-D one [B, S, heads * head size] (num_heads splits it):
the caches broadcast over the heads axis either way.

AffineGrid's base grid (the homogeneous positions (x, y[, z], 1) of each output pixel,
x along the last axis) is a constant of the constant `size`; the grid is its product
with the run-time theta^T, one batched matmul. The windows are constants of their
(constant) size.
"""

from __future__ import annotations

import numpy as np

from compiler import dtypes
from compiler.errors import InvalidModelError
from importers.onnx_ops import Fallback, converter
from importers.onnx_ops.context import NodeContext
from importers.onnx_ops.movement import slice_axis
from importers.onnx_types import NUMPY_DTYPES, dtype_of_elem


def _float(cx: NodeContext, *values) -> None:
    """Fallback unless every value is a statically shaped f32 or f64 tensor (braze
    computes no f16 or bf16)."""
    for v in values:
        if v.dtype not in ("f32", "f64"):
            raise Fallback(f"{cx.node.op_type} of {v.dtype} (braze computes f32 and f64)")
        if not v.type.static:
            raise Fallback(f"{cx.node.op_type} over {v.type}")


def _caches(cx: NodeContext):
    """cos and sin as [batch, sequence, R/2]: rows gathered at position_ids when given."""
    cos, sin, pos = cx.input(1), cx.input(2), cx.input(3)
    if pos is None:
        return cos, sin
    if not pos.type.static:
        raise Fallback(f"position_ids of type {pos.type}")
    return cx.op("gather", cos, pos, axis=0), cx.op("gather", sin, pos, axis=0)


@converter("RotaryEmbedding", 23)
def convert_rotary_embedding(cx: NodeContext):
    x = cx.x
    _float(cx, x, cx.input(1), cx.input(2))
    if x.type.rank == 3:
        heads = cx.attr("num_heads", 0)
        b, s, width = x.shape
        if not heads or width % heads:
            raise InvalidModelError(f"{cx.describe}: 3-D input of width {width} needs a "
                                    f"num_heads that divides it, not {heads}")
        x = cx.reshape(x, (b, s, heads, width // heads))
        head_axis, seq_axis = 2, 1
    elif x.type.rank == 4:
        head_axis, seq_axis = 1, 2
    else:
        raise InvalidModelError(f"{cx.describe}: input of rank {x.type.rank} (3 or 4)")
    d = x.shape[-1]
    rot = cx.attr("rotary_embedding_dim", 0) or d
    if rot % 2 or rot > d:
        raise InvalidModelError(f"{cx.describe}: rotary_embedding_dim {rot} for heads of "
                                f"size {d}")
    half = rot // 2
    cos, sin = _caches(cx)
    want = (x.shape[0], x.shape[seq_axis], half)
    if cos.shape != want or sin.shape != want:  # onnxruntime broadcasts neither
        raise InvalidModelError(f"{cx.describe}: caches of shapes {cos.shape} and "
                                f"{sin.shape}, expected {want}")
    shape = list(cos.shape)
    shape.insert(head_axis, 1)
    cos, sin = cx.reshape(cos, shape), cx.reshape(sin, shape)
    last = x.type.rank - 1
    interleaved = bool(cx.attr("interleaved", 0))
    x1 = slice_axis(cx, x, last, 0, 2 if interleaved else 1, half)
    x2 = slice_axis(cx, x, last, 1 if interleaved else half, 2 if interleaved else 1, half)
    real = cx.op("sub", cx.op("mul", cos, x1), cx.op("mul", sin, x2))
    imag = cx.op("add", cx.op("mul", sin, x1), cx.op("mul", cos, x2))
    if interleaved:
        pairs = x1.shape + (1,)
        y = cx.op("concat", cx.reshape(real, pairs), cx.reshape(imag, pairs), axis=last + 1)
        parts = [cx.reshape(y, x1.shape[:-1] + (rot,))]
    else:
        parts = [real, imag]
    if rot < d:
        parts.append(slice_axis(cx, x, last, rot, 1, d - rot))
    y = cx.op("concat", *parts, axis=last)
    return [cx.reshape(y, cx.x.shape)]


def _linspace(n: int, align_corners: bool) -> np.ndarray:
    """The n pixel centres' coordinates in [-1, 1]: with align_corners -1 and 1 are the
    corner pixels' centres (one pixel: at 1, as onnxruntime has it, Eigen's LinSpaced;
    torch puts it at 0, the spec's reference at -1), without them their outer edges."""
    if align_corners:
        return np.linspace(-1.0, 1.0, n) if n > 1 else np.ones(1)
    return (2 * np.arange(n) + 1) / n - 1


def _base_grid(sizes: list[int], align_corners: bool) -> np.ndarray:
    """[prod(sizes), r + 1]: each position's coordinates, the last axis's first, then 1."""
    axes = [_linspace(n, align_corners) for n in sizes]
    mesh = np.meshgrid(*axes, indexing="ij")
    cols = [m.reshape(-1) for m in mesh[::-1]]
    return np.stack(cols + [np.ones_like(cols[0])], axis=1)


@converter("AffineGrid", 20)
def convert_affine_grid(cx: NodeContext):
    """grid[n, p] = theta[n] @ (x_p, y_p[, z_p], 1): base [P, r + 1] @ theta^T."""
    theta = cx.x
    _float(cx, theta)
    size = cx.ints_input(1, "size")
    r = len(size) - 2
    if r not in (2, 3) or theta.shape[1:] != (r, r + 1) or size[0] != theta.shape[0] \
            or min(size[2:]) < 1:
        raise InvalidModelError(f"{cx.describe}: theta {theta.shape} for size {size}")
    base = _base_grid(size[2:], bool(cx.attr("align_corners", 0)))
    base = cx.const(base[None].astype(np.float32 if theta.dtype == "f32" else np.float64))
    grid = cx.op("matmul", base, cx.transpose(theta, (0, 2, 1)))
    return [cx.reshape(grid, [size[0]] + size[2:] + [r])]


def _window(cx: NodeContext, terms: list[float]) -> list:
    """sum_k terms[k] cos(2 pi k n / N), n < size, N = size (periodic) or size - 1,
    in float64 cast to output_datatype, as a constant."""
    size = cx.ints_input(0, "size")
    if len(size) != 1 or size[0] < 1:  # onnxruntime refuses an empty window
        raise InvalidModelError(f"{cx.describe}: size {size} (one positive integer)")
    dtype = dtype_of_elem(cx.attr("output_datatype", 1))
    if dtype not in NUMPY_DTYPES:
        raise Fallback(f"a window of {dtype}")
    n = np.arange(size[0], dtype=np.float64)
    length = size[0] if cx.attr("periodic", 1) else size[0] - 1
    with np.errstate(divide="ignore", invalid="ignore"):  # size 1, symmetric: NaN
        w = sum(a * np.cos(2 * np.pi * k * n / length) for k, a in enumerate(terms))
        return [cx.const(w.astype(dtypes.to_numpy(dtype)))]


@converter("HannWindow", 17)
def convert_hann_window(cx: NodeContext):
    return _window(cx, [0.5, -0.5])


@converter("HammingWindow", 17)
def convert_hamming_window(cx: NodeContext):
    """alpha = 25 / 46 (the spec's and onnxruntime's, not torch's 0.54)."""
    return _window(cx, [25 / 46, -21 / 46])


@converter("BlackmanWindow", 17)
def convert_blackman_window(cx: NodeContext):
    return _window(cx, [0.42, -0.5, 0.08])
