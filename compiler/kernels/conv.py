"""2-d convolution, channels-last, as an implicit GEMM on the packed micro-kernel.

    Y[p, co] = bias[co] + sum over (kh, kw, ci) of X[pixel(p, kh, kw), ci] * W[co, ci, kh, kw]

with p = (n, oh, ow) an output pixel (the GEMM's rows, M = N * OH * OW), the
output channels its columns, and K = KH * KW * Cin. The weight is packed once,
at compile time, as B[(kh, kw, ci), co] in gemm.py's panels; X is never copied
(no im2col): for each (kh, kw), a tile's rows each point at their input
pixel's Cin contiguous channels, or at a row of zeros where the window hangs
over the padding, and the micro-kernel's inner loop runs over ci. Strides and
dilations only change where those pointers point.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from compiler.kernels import gemm, summation
from compiler.kernels.gemm import F32, I64, Tile

# Input channels the zero row covers (a window over the padding reads it).
_ZEROS = "braze.conv.zeros"


def refusal(node) -> str | None:
    """None if this kernel runs the NHWC conv `node`, else why not."""
    x, w = node.inputs[:2]
    if x.dtype != "f32":
        return f"dtype {x.dtype}: braze's conv kernel is float32 only"
    if node.attrs["group"] != 1:
        return f"group {node.attrs['group']}: grouped convolution is not compiled yet"
    if 0 in w.shape[1:]:
        return "no input channels or an empty window: an empty contraction (its result is "\
            "the bias; the kernel assumes one product at least)"
    for v in node.inputs[1:]:
        if v.producer is None or v.producer.op != "const":
            return f"%{v.name} is not a constant (the weight is packed at compile time)"
    return None


def pack_weight(w: np.ndarray, tile: Tile) -> np.ndarray:
    """W[co, ci, kh, kw] -> gemm panels of B[(kh, kw, ci), co] (gemm.pack_b's layout,
    [panel][(kh, kw, ci)][NR], co zero-padded to whole panels), in one reordering copy."""
    co, ci, kh, kw = w.shape
    nr = tile.nr
    panels = -(-co // nr)
    w = w.astype(np.float32, copy=False)
    if panels * nr != co:
        w = np.concatenate([w, np.zeros((panels * nr - co, ci, kh, kw), np.float32)])
    packed = w.reshape(panels, nr, ci, kh, kw).transpose(0, 3, 4, 2, 1)
    return np.ascontiguousarray(packed).reshape(panels, kh * kw * ci, nr)


def pack_bias(bias: np.ndarray, tile: Tile) -> np.ndarray:
    """bias[co], zero-padded to whole panels (the epilogue loads whole vectors)."""
    out = np.zeros(-(-bias.size // tile.nr) * tile.nr, np.float32)
    out[:bias.size] = bias
    return out


@dataclass(frozen=True)
class ConvShape:
    n: int
    h: int
    w: int
    cin: int
    oh: int
    ow: int
    cout: int
    kh: int
    kw: int
    strides: tuple
    pads: tuple  # top, left
    dilations: tuple
    pads_end: tuple  # bottom, right (they only bound the output size)
    tile: Tile  # the target's register tile

    @classmethod
    def of(cls, node, tile: Tile) -> ConvShape:
        x, w = node.inputs[:2]
        y = node.outputs[0]
        a = node.attrs
        return cls(x.shape[0], x.shape[1], x.shape[2], x.shape[3], y.shape[1], y.shape[2],
                   y.shape[3], w.shape[2], w.shape[3], tuple(a["strides"]),
                   tuple(a["pads"][:2]), tuple(a["dilations"]), tuple(a["pads"][2:]), tile)

    @property
    def wide_rows(self) -> bool:
        """Without padding or dilation, a window row (kw, ci) is contiguous in NHWC: the
        micro-kernel's inner loop can run over all KW * Cin of it (worth it for few
        channels: the stem's 3; the layout pass pads such inputs ahead of time)."""
        return (self.pads == (0, 0) and self.pads_end == (0, 0)
                and self.dilations == (1, 1) and self.cin < 16)

    @property
    def copies_rows(self) -> bool:
        """A 1x1 conv (each output pixel reads one input pixel's Cin channels) whose
        pixels are a multiple of 4 KiB apart, on a tile with more rows than L1 has ways:
        its tiles read their rows from a padded copy, made once per row block and panel
        group (gemm.copies_rows, gemm.packed_rows, tile_order)."""
        return self.kh == self.kw == 1 and gemm.copies_rows(self.tile,
                                                            self.cin * self.strides[1] * 4,
                                                            self.cin)

    @property
    def m(self) -> int:
        return self.n * self.oh * self.ow

    @property
    def k(self) -> int:
        return self.kh * self.kw * self.cin

    @property
    def items(self) -> int:
        t = self.tile
        return -(-self.m // gemm.tile_rows(self.m, t.mr)) * -(-self.cout // t.nr)

    @property
    def macs(self) -> int:
        return self.m * self.k * self.cout


def _i64(n: int) -> ir.Constant:
    return ir.Constant(I64, int(n))


def zeros_row(b: ir.IRBuilder, cin: int):
    """A module-level row of at least `cin` zeros."""
    mod = b.module
    name = f"{_ZEROS}.{cin}"
    try:
        return mod.get_global(name)
    except KeyError:
        t = ir.ArrayType(F32, cin)
        g = ir.GlobalVariable(mod, t, name)
        g.global_constant = True
        g.linkage = "internal"
        g.initializer = ir.Constant(t, None)
        g.align = 64
        return g


def emit_item(b: ir.IRBuilder, s: ConvShape, x_ptr, packed_ptr, bias_ptr, y_ptr,
              item, after=None, before=None, transform=None) -> None:
    """Compute work item `item` (MR output pixels x NR output channels); before,
    `before(b, rows, row0, panel)`, and after, `after(...)`, if given (prefetches for
    the tile; an epilogue over the tile just stored)."""
    zeros = zeros_row(b, s.cin)
    wide = s.wide_rows
    t = s.tile

    def tile(b, rows, row0, panel, rb):
        if before is not None:
            before(b, rows, row0, panel)
        pix = [_pixel(b, s, b.add(row0, _i64(r))) for r in range(rows)]
        copied = None
        if s.copies_rows and rows > 1:  # a 1x1 conv's rows are pixels, read from a copy
            copied = gemm.packed_rows(b, t, rows, s.cin, row0, [
                _input_row(b, s, x_ptr, zeros, n, y0, x0, _i64(0), _i64(0))
                for n, y0, x0 in pix])

        def row_ptrs(b, kk):
            if copied is not None:  # pointwise: kk is 0
                return copied
            if wide:  # kk is kh: the window row's KW * Cin elements are contiguous
                return [_wide_row(b, s, x_ptr, n, y0, x0, kk) for n, y0, x0 in pix]
            dy = b.mul(b.udiv(kk, _i64(s.kw)), _i64(s.dilations[0]))
            dx = b.mul(b.urem(kk, _i64(s.kw)), _i64(s.dilations[1]))
            return [_input_row(b, s, x_ptr, zeros, n, y0, x0, dy, dx) for n, y0, x0 in pix]

        outer, inner = (s.kh, s.kw * s.cin) if wide else (s.kh * s.kw, s.cin)
        far = gemm.next_panel(b, t, s.m, s.k, rb, panel, by_rows, group)

        def product(b, tt):
            vals = summation.accumulate(b, tt, rows, packed_ptr, b.mul(panel, _i64(s.k)),
                                        outer, inner, row_ptrs, far)
            gemm.store_tile(b, tt, s.cout, rows, vals, y_ptr, row0, panel, bias_ptr,
                            transform)

        gemm.by_panel(b, t, s.cout, panel, product)
        if after is not None:
            after(b, rows, row0, panel)

    by_rows, group = gemm.tile_order(t, s.k, s.cout, s.m, s.n * s.h * s.w * s.cin * 4,
                                     s.copies_rows)
    gemm.for_each_tile(b, t, s.m, s.cout, item, tile, by_rows, group)


def _pixel(b: ir.IRBuilder, s: ConvShape, p) -> tuple:
    """Output pixel p -> (n, top row, left column) of its window in the unpadded input."""
    ow = b.urem(p, _i64(s.ow))
    t = b.udiv(p, _i64(s.ow))
    oh = b.urem(t, _i64(s.oh))
    n = b.udiv(t, _i64(s.oh))
    y0 = b.sub(b.mul(oh, _i64(s.strides[0])), _i64(s.pads[0]))
    x0 = b.sub(b.mul(ow, _i64(s.strides[1])), _i64(s.pads[1]))
    return n, y0, x0


def _wide_row(b: ir.IRBuilder, s: ConvShape, x_ptr, n, y0, x0, kh):
    """Pointer to X[n, y0 + kh, x0, :]: the KW * Cin elements of a window row (no padding,
    so always inside the image)."""
    off = b.mul(b.add(b.mul(b.add(b.mul(n, _i64(s.h)), b.add(y0, kh)), _i64(s.w)), x0),
                _i64(s.cin))
    return b.gep(x_ptr, [off], source_etype=F32, inbounds=True)


def _input_row(b: ir.IRBuilder, s: ConvShape, x_ptr, zeros, n, y0, x0, dy, dx):
    """Pointer to X[n, y0 + dy, x0 + dx, :], or to the zero row outside the image."""
    iy, ix = b.add(y0, dy), b.add(x0, dx)
    inside = b.and_(b.icmp_unsigned("<", iy, _i64(s.h)), b.icmp_unsigned("<", ix, _i64(s.w)))
    off = b.mul(b.add(b.mul(b.add(b.mul(n, _i64(s.h)), iy), _i64(s.w)), ix), _i64(s.cin))
    off = b.select(inside, off, _i64(0))  # keep the unused address in bounds too
    row = b.gep(x_ptr, [off], source_etype=F32, inbounds=True)
    return b.select(inside, row, b.bitcast(zeros, ir.PointerType()))
