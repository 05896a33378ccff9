"""3x3 stride-1 convolution by Winograd's F(2x2, 3x3): 2.25x fewer multiplies.

Each 2x2 block of output pixels (a tile) comes from a 4x4 input patch d:

    Y = A^T [ sum over ci of (G g G^T) . (B^T d B) ] A         (. elementwise, 4x4)

so a conv becomes 16 GEMMs, one per position k of the 4x4 transform domain:
M_k[tile, co] = sum over ci of V_k[tile, ci] U_k[ci, co], with U = G g G^T computed
and packed (gemm.py's panels, one set per k) at compile time, V = B^T d B computed per
tile on the fly, and the output transform A^T M A, the bias and the register epilogue
applied before the store. A work item is a block of up to MR tiles: it transforms
their input patches once into a scratch on its thread's stack (16 x tiles x Cin
floats), then, for each panel of NR output channels, runs the 16 GEMMs on the
micro-kernel into a second small scratch and writes the 2x2 outputs of every tile.

Multiplies per output: 16/4 * Cin per co, against 9 * Cin directly. The transforms
cost adds and memory traffic, so this pays where Cin is large enough and the image
has several tiles (`refusal`). Rounding: the transforms add a few ulps (B, G and A
hold 0, +-1 and +-1/2 only); measured max rel error ~1e-6 on ResNet shapes (tests).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from compiler.kernels import conv, gemm
from compiler.kernels.conv import ConvShape
from compiler.kernels.gemm import F32, I64, NR, NV, V16, VEC

# G (4x3) turns a 3x3 filter into the 4x4 transform domain: U = G g G^T.
G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])
# Stack bytes a work item may use for its transformed patches (16 x tiles x Cin floats).
SCRATCH_BYTES = 1 << 19
# Smallest output side worth tiling: below it, padding the last tile wastes too much.
MIN_SIDE = 7
# Work items wanted at least, so two threads split them within ~10% (see `groups`).
MIN_ITEMS = 8


def refusal(node) -> str | None:
    """None if the NHWC conv `node` runs on the Winograd kernel, else why the direct one."""
    reason = conv.refusal(node)
    if reason is not None:
        return reason
    x, w = node.inputs[:2]
    a = node.attrs
    cin, cout = x.shape[3], w.shape[0]
    oh, ow = node.outputs[0].shape[1:3]
    if w.shape[2:] != (3, 3) or tuple(a["strides"]) != (1, 1) or tuple(a["dilations"]) != (1, 1):
        return "not a 3x3 stride-1 undilated conv"
    if cin % VEC or cout % NR:
        return f"channels {cin} -> {cout}: Winograd needs multiples of {VEC} in, {NR} out"
    if 16 * gemm.MR * cin * 4 > SCRATCH_BYTES:
        return f"{cin} input channels: the transformed patches would not fit the scratch"
    if min(oh, ow) < MIN_SIDE:
        return f"{oh}x{ow} output: too few 2x2 tiles"
    return None


def pack_weight(w: np.ndarray) -> np.ndarray:
    """W[co, ci, 3, 3] -> U = G g G^T per (co, ci), as 16 sets of gemm panels of
    U_k[ci, co], k = 4a + b, one after another."""
    g32 = G.astype(np.float32)  # exact: G holds 0, 1 and +-1/2
    u = np.einsum("ai,ocij,bj->abco", g32, w.astype(np.float32), g32, optimize=True)
    return np.concatenate([gemm.pack_b(u[a, b]).reshape(-1)  # u[a, b]: [ci, co]
                           for a in range(4) for b in range(4)])


class WinogradShape(ConvShape):
    """A 3x3 stride-1 conv's shape (ConvShape's fields), cut into 2x2 output tiles."""

    @property
    def th(self) -> int:
        return -(-self.oh // 2)

    @property
    def tw(self) -> int:
        return -(-self.ow // 2)

    @property
    def tiles(self) -> int:
        return self.n * self.th * self.tw

    @property
    def rows(self) -> int:
        return gemm.tile_rows(self.tiles)

    @property
    def blocks(self) -> int:
        return -(-self.tiles // self.rows)

    @property
    def groups(self) -> int:
        """Panel groups a block of tiles is split into: enough work items for the threads
        to share evenly (each group transforms its tiles' inputs again: a few percent)."""
        panels = self.cout // NR
        if self.blocks >= MIN_ITEMS:
            return 1
        want = -(-MIN_ITEMS // self.blocks)
        return next(g for g in range(want, panels + 1) if panels % g == 0) \
            if want <= panels else panels

    @property
    def items(self) -> int:
        return self.blocks * self.groups


def _i64(n: int) -> ir.Constant:
    return ir.Constant(I64, int(n))


def emit_item(b: ir.IRBuilder, s: WinogradShape, x_ptr, packed_ptr, bias_ptr, y_ptr, item,
              zeros, epilogue=None, post=None) -> None:
    """Work item `item`: tiles [item * rows, ...) for every output channel.

    `epilogue(b, vec, off, col)`, if given, maps an output vector (16 channels at element
    offset `off` of Y, channel `col`) to what is stored there; `post(b, pixel, col)`, if
    given, runs after that store (an in-place epilogue over those 16 elements)."""
    rows = s.rows
    with b.goto_entry_block():
        v_buf = b.alloca(F32, size=_i64(16 * rows * s.cin))
        m_buf = b.alloca(F32, size=_i64(16 * rows * NR))
    block, group = b.udiv(item, _i64(s.groups)), b.urem(item, _i64(s.groups))
    t0 = b.mul(block, _i64(rows))
    last = s.tiles - (s.blocks - 1) * rows  # tiles in the last block
    args = (t0, group, x_ptr, packed_ptr, bias_ptr, y_ptr, zeros, v_buf, m_buf,
            (epilogue, post))
    if last == rows:
        _tiles(b, s, rows, *args)
        return
    with b.if_else(b.icmp_unsigned("==", block, _i64(s.blocks - 1))) as (then, otherwise):
        with then:
            _tiles(b, s, last, *args)
        with otherwise:
            _tiles(b, s, rows, *args)


def _tiles(b, s: WinogradShape, rows: int, t0, group, x_ptr, packed_ptr, bias_ptr, y_ptr,
           zeros, v_buf, m_buf, hooks) -> None:
    # loops over the block's tiles, not unrolled: the transforms' code stays one copy
    gemm.for_range(b, rows, lambda b, r: _input_transform(
        b, s, x_ptr, zeros, v_buf, rows, r, *_tile_origin(b, s, b.add(t0, r))))
    panels = s.cout // NR
    per_group = panels // s.groups

    def panel_body(b, q):
        p = b.add(b.mul(group, _i64(per_group)), q)

        def gemm_k(b, k):  # a loop, not unrolled: one micro-kernel's code per conv
            def row_ptrs(b, kk):
                return [b.gep(v_buf, [b.mul(b.add(b.mul(k, _i64(rows)), _i64(r)),
                                            _i64(s.cin))], source_etype=F32, inbounds=True)
                        for r in range(rows)]
            accs = gemm.accumulate(b, rows, packed_ptr,
                                   b.mul(b.add(b.mul(k, _i64(panels)), p), _i64(s.cin)), 1,
                                   s.cin, row_ptrs)
            for i, acc in enumerate(accs):
                off = b.add(b.mul(b.add(b.mul(k, _i64(rows)), _i64(i // NV)), _i64(NR)),
                            _i64((i % NV) * VEC))
                ptr = b.gep(m_buf, [off], source_etype=F32, inbounds=True)
                b.store(acc, _as_vector_ptr(b, ptr), align=4)

        gemm.for_range(b, 16, gemm_k)
        col0 = b.mul(p, _i64(NR))
        gemm.for_range(b, rows, lambda b, r: _output_transform(
            b, s, m_buf, rows, r, *_tile_origin(b, s, b.add(t0, r)), col0, bias_ptr, y_ptr,
            hooks))

    gemm.for_range(b, per_group, panel_body)


def _as_vector_ptr(b: ir.IRBuilder, ptr):
    """A scratch (alloca) element pointer as a vector pointer, for llvmlite's store check
    (its allocas are typed; in the module's IR this is a no-op cast)."""
    return b.bitcast(ptr, V16.as_pointer())


def _tile_origin(b, s: WinogradShape, t) -> tuple:
    """Tile t -> (n, top, left) of its output block (the input patch starts pads earlier)."""
    tx = b.urem(t, _i64(s.tw))
    rest = b.udiv(t, _i64(s.tw))
    ty = b.urem(rest, _i64(s.th))
    n = b.udiv(rest, _i64(s.th))
    return n, b.mul(ty, _i64(2)), b.mul(tx, _i64(2))


def _input_transform(b, s: WinogradShape, x_ptr, zeros, v_buf, rows: int, r, n, y0,
                     x0) -> None:
    """V[k, r, :] = (B^T d B)[k] for tile r's 4x4 input patch d, 16 channels at a time."""
    srcs = []
    for a in range(4):
        for c in range(4):
            iy = b.add(y0, _i64(a - s.pads[0]))
            ix = b.add(x0, _i64(c - s.pads[1]))
            inside = b.and_(b.icmp_unsigned("<", iy, _i64(s.h)),
                            b.icmp_unsigned("<", ix, _i64(s.w)))
            off = b.mul(b.add(b.mul(b.add(b.mul(n, _i64(s.h)), iy), _i64(s.w)), ix),
                        _i64(s.cin))
            off = b.select(inside, off, _i64(0))
            row = b.gep(x_ptr, [off], source_etype=F32, inbounds=True)
            srcs.append(b.select(inside, row, zeros))

    def body(b, j):
        c = b.mul(j, _i64(VEC))
        d = [b.load(b.gep(p, [c], source_etype=F32, inbounds=True), typ=V16, align=4)
             for p in srcs]
        for k, v in enumerate(_btdb(b, d)):
            ptr = b.gep(v_buf, [b.add(b.mul(b.add(_i64(k * rows), r), _i64(s.cin)), c)],
                        source_etype=F32, inbounds=True)
            b.store(v, _as_vector_ptr(b, ptr), align=4)

    gemm.for_range(b, s.cin // VEC, body)


def _btdb(b, d: list) -> list:
    """B^T d B for a 4x4 grid d (row-major list of 16 vectors)."""
    def rows_t(x0, x1, x2, x3):  # B^T applied down a column: 4 values -> 4
        return [b.fsub(x0, x2), b.fadd(x1, x2), b.fsub(x2, x1), b.fsub(x1, x3)]

    cols = [rows_t(*(d[a * 4 + c] for a in range(4))) for c in range(4)]  # cols[c][i]
    out = [None] * 16
    for i in range(4):
        row = rows_t(*(cols[c][i] for c in range(4)))  # B applied along the row
        for j in range(4):
            out[i * 4 + j] = row[j]
    return out


def _output_transform(b, s: WinogradShape, m_buf, rows: int, r, n, y0, x0, col0,
                      bias_ptr, y_ptr, hooks) -> None:
    """Y's 2x2 block of tile r = A^T M A (+ bias, epilogue), for the panel's NR channels."""
    for v in range(NV):
        m = [b.load(b.gep(m_buf, [b.add(b.mul(b.add(_i64(k * rows), r), _i64(NR)),
                                        _i64(v * VEC))], source_etype=F32, inbounds=True),
                    typ=V16, align=4) for k in range(16)]

        def at(x0_, x1, x2, x3):  # A^T on 4 values -> 2
            return [b.fadd(b.fadd(x0_, x1), x2), b.fsub(b.fsub(x1, x2), x3)]

        cols = [at(*(m[a * 4 + c] for a in range(4))) for c in range(4)]  # cols[c][i]
        col = b.add(col0, _i64(v * VEC))
        bias = None
        if bias_ptr is not None:
            bias = b.load(b.gep(bias_ptr, [col], source_etype=F32, inbounds=True), typ=V16,
                          align=4)
        for i in range(2):
            out = at(*(cols[c][i] for c in range(4)))
            for j in range(2):
                _store_output(b, s, out[j], bias, n, b.add(y0, _i64(i)), b.add(x0, _i64(j)),
                              col, y_ptr, hooks, edge=(i and s.oh % 2) or (j and s.ow % 2))


def _store_output(b, s: WinogradShape, vec, bias, n, oy, ox, col, y_ptr, hooks,
                  edge: bool) -> None:
    epilogue, post = hooks
    pixel = b.add(b.mul(b.add(b.mul(n, _i64(s.oh)), oy), _i64(s.ow)), ox)
    off = b.add(b.mul(pixel, _i64(s.cout)), col)

    def store(b):
        x = vec if bias is None else b.fadd(vec, bias)
        if epilogue is not None:
            x = epilogue(b, x, off, col)
        b.store(x, b.gep(y_ptr, [off], source_etype=F32, inbounds=True), align=4)
        if post is not None:
            post(b, pixel, col)

    if not edge:  # an odd side's last tile has a row or column past the image
        return store(b)
    inside = b.and_(b.icmp_unsigned("<", oy, _i64(s.oh)), b.icmp_unsigned("<", ox, _i64(s.ow)))
    with b.if_then(inside):
        store(b)
