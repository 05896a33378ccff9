"""An inverted residual block's expand and depthwise convs as one kernel.

MobileNet-v2/v3's and EfficientNet's blocks expand Cin channels to Cexp = 4-6 x Cin with
a 1x1 conv (its folded batch norm and ReLU6, SiLU or hard-swish as its epilogue), then
run a 3x3 or 5x5 depthwise conv over the expanded tensor E, which nothing else reads:

    E[n, y, x, :] = epi1(X[n, y, x, :] @ W1 + b1)               (a GEMM per image row)
    Y[n, oh, ow, c] = epi2(b2[c] + sum over (kh, kw) of E[n, oh*s - p + kh, ...] * W2)

E is the block's largest tensor (112 x 112 x 96 floats, 4.8 MB, in MobileNet-v2's
second block), so as two kernels it goes out to L3 and back and the depthwise conv runs
memory-bound. Here each work item is one output row of the depthwise conv: it first
computes the rows of E that its window needs and that are not yet in a per-thread
ring of KH rows (row iy lives in slot iy mod KH), one 1x1-conv GEMM per row on the
micro-kernel (conv.emit_item on a one-row image: M = W pixels, K = Cin, N = Cexp, the
epilogue on its registers), then runs the grouped kernel over the ring's rows
(grouped.emit_item reading its input rows through `rows`). A thread's items are a
contiguous range of rows, so after its first row it computes S new rows of E per output
row (S the stride), and E never reaches memory.

`fusions` decides which pairs run so (legality: a 1x1 stride-1 unpadded float32 conv on
the micro-kernel whose result, after an epilogue of register ops over scalar or per-channel
operands, only a depthwise conv of multiplier 1 reads; its ring fits RING_BYTES; speed: E
of at least the target's L2, MIN_EXPANDED_L2_FRACTION).

Measured (AMD EPYC, AVX-512, 1 MiB L2 per core; 1 thread, min of 81 calls, the two
kernels' profiled times against the fused one's, same process), MobileNet-v2's blocks:
112x112 16->96 s2 (E 4.8 MB) 493 -> 483 us; 56x56 24->144 s1 (1.8 MB) 302-309 -> 292-295;
s2 252 -> 239-242; EfficientNet's 56x56 24->144 5x5 s2 SiLU 437-439 -> 428-429. Below L2
the pair gained 0-2%, within noise: 28x28 32->192 s1 (602 KB) 123 -> 121-122, s2 105 ->
103-105; 14x14 64->384 103-104 -> 103-104, 96->576 214 -> 215; 7x7 160->960 147 -> 148;
28x28 40->240 5x5 SiLU 336-337 -> 332-334; so those stay two kernels. The gain is small
because here the expand GEMM (K = Cin = 16 to 32) is most of the time and runs near the
FMA peak either way (the 112x112 one: 393 of the pair's 493 us); what fusion removes is the
depthwise conv's wait on E from L3 (its 100 us -> ~90) and E's store. Whole torchvision
mobilenet_v2 (3 pairs fused), 1 thread, sum of kernel times: 6389-6420 -> 6200-6275 us,
outputs equal to the unfused build's bit for bit (the same sums in the same order).
efficientnet_b0 (3 pairs, SiLU), pairs in the model: 112x112 16->96 s2 1044-1126 ->
898-903 us, 56x56 24->144 s1 585 -> 584-586, 5x5 s2 448 -> 440-443; the model 10094-10421
-> 10165-10244 us (two runs each, noisy), outputs again bit-equal.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from llvmlite import ir

from compiler.codegen.lowering import counted_loop
from compiler.codegen.register_ops import REGISTER_OPS
from compiler.kernels import choice, conv, grouped
from compiler.kernels.gemm import F32, I64
from compiler.ops import Family

# The ring of KH rows of E lives on each thread's stack (as gemm.packed_rows's copy and
# the row kernels' scratch rows do): at most this many bytes, well inside an 8 MiB stack
# and about half of a 1 MiB L2 (EfficientNet's 5x5 at 56 x 240: 5 x 54 KB).
RING_BYTES = 1 << 19
# The fused kernel only pays where E outgrows one core's L2 (the target's, gemm.Tile's
# l2_bytes) times this: smaller, the two kernels pass E through L2 and fusion measured
# within noise of them (see the module docstring).
MIN_EXPANDED_L2_FRACTION = 1.0


def _i64(n: int) -> ir.Constant:
    return ir.Constant(I64, int(n))


def fusions(graph, reasons: dict, users: dict, target) -> dict:
    """Depthwise conv node -> the value E it reads, for every pair this kernel runs; E's
    buffer is dropped from `reasons` (it is computed into the ring instead). A depthwise
    conv that reads a conv's result but is refused adds why to that result's reason (what
    `braze explain --kernels` prints)."""
    out = {}
    for n in graph.nodes:
        e = n.inputs[0] if n.op == "conv" else None
        if e is None or e not in reasons or n.attrs["group"] == 1:
            continue
        why = refusal(graph, n, e, reasons, users, target)
        if why is None:
            del reasons[e]
            out[n] = e
        elif any(m.op == "conv" for m in expand_nodes(e, reasons)):
            reasons[e] += f"; not computed inside depthwise %{n.outputs[0].name}: {why}"
    return out


def expand_nodes(e, reasons: dict) -> list:
    """The nodes that compute E from buffers and constants (the expand conv and its
    epilogue), in graph order."""
    seen, stack, nodes = set(), [e], []
    while stack:
        v = stack.pop()
        p = v.producer
        if p is None or p.op == "const" or p in seen or (v in reasons and v is not e):
            continue
        seen.add(p)
        nodes.append(p)
        stack.extend(p.inputs)
    return nodes


def refusal(graph, dw, e, reasons: dict, users: dict, target) -> str | None:
    """None if depthwise conv `dw` and the expand conv behind its input `e` run as one
    kernel, else why not."""
    x, w = dw.inputs[:2]
    a = dw.attrs
    if len(x.shape) != 4 or a["group"] == 1 or a["group"] != x.shape[3] or \
            w.shape[0] != x.shape[3]:
        return "not a 2-d depthwise conv of multiplier 1"
    impl = choice.choose(dw, target)
    if impl.name != choice.GROUPED or tuple(a["dilations"]) != (1, 1):
        return "not on the grouped kernel, or dilated"
    if e in graph.outputs or users.get(e, []) != [dw]:
        return f"%{e.name} has other readers: it needs its buffer"
    nodes = expand_nodes(e, reasons)
    convs = [n for n in nodes if n.opdef.family is Family.CONTRACTION]
    if len(convs) != 1 or convs[0].op != "conv":
        return f"%{e.name} is not one conv's result after an elementwise epilogue"
    c = convs[0]
    ca, cw = c.attrs, c.inputs[1]
    if (ca["group"] != 1 or tuple(cw.shape[2:]) != (1, 1) or any(ca["pads"])
            or tuple(ca["strides"]) != (1, 1) or c.inputs[0].dtype != "f32"
            or choice.choose(c, target).name != choice.DIRECT_CONV):
        return "the producer is not a 1x1 stride-1 unpadded float32 conv on the micro-kernel"
    inside = {v for n in nodes for v in n.outputs}
    for n in nodes:
        if n is c:
            continue
        if n.op not in REGISTER_OPS or n.outputs[0].dtype != "f32":
            return f"epilogue op {n.op} does not run on registers"
        for u in n.inputs:
            if u in inside or (u.is_const and u.const_value.size == 1):
                continue
            if not (u.shape and u.shape[-1] == e.shape[-1] and
                    all(d == 1 for d in u.shape[:-1]) and u.dtype == "f32"):
                return f"epilogue operand %{u.name} is neither a scalar nor per channel"
    ring = w.shape[2] * e.shape[2] * e.shape[3] * 4
    if ring > RING_BYTES:
        return f"a ring of {ring} bytes (> RING_BYTES={RING_BYTES})"
    least = impl.tile.l2_bytes * MIN_EXPANDED_L2_FRACTION
    if e.type.size * 4 < least:
        return f"%{e.name} is {e.type.size * 4} bytes, under {least:.0f} " \
            "(MIN_EXPANDED_L2_FRACTION of L2): it stays in cache between two kernels"
    return None


@dataclass(frozen=True)
class InvertedShape:
    """The fused kernel's shapes: the expand conv on one row of the image, and the
    depthwise conv (grouped.GroupedShape) over the whole of E."""

    row: conv.ConvShape
    dw: grouped.GroupedShape

    @classmethod
    def of(cls, expand_node, dw_node, tile) -> InvertedShape:
        x, w = expand_node.inputs[:2]
        _, _, wd, cin = x.shape
        row = conv.ConvShape(1, 1, wd, cin, 1, wd, w.shape[0], 1, 1, (1, 1), (0, 0),
                             (1, 1), (0, 0), tile)
        # emit_item below numbers the depthwise's items row by row
        return cls(row, dataclasses.replace(grouped.plan(dw_node, tile), chunk_major=False))

    @property
    def ring_floats(self) -> int:
        return self.dw.kh * self.dw.w * self.dw.cin

    @property
    def items(self) -> int:
        return self.dw.n * self.dw.oh

    @property
    def macs(self) -> int:
        d = self.dw
        return d.n * d.h * self.row.macs + d.macs


def emit_item(b: ir.IRBuilder, s: InvertedShape, x_ptr, w1, b1, w2, b2, y_ptr, item,
              ring, ready, transform, apply, after) -> None:
    """Output row `item` = (n, oh): the rows of E its window needs that the ring lacks
    (`ready`: an i64 slot, one past the last row computed, as n * H + iy), then its
    depthwise row for every channel vector. `transform`: the expand's register epilogue;
    `apply`, `after`: the depthwise's (grouped.emit_item)."""
    d, r = s.dw, s.row
    n, oh = b.udiv(item, _i64(d.oh)), b.urem(item, _i64(d.oh))
    y0 = b.sub(b.mul(oh, _i64(d.strides[0])), _i64(d.pads[0]))
    lo = b.select(b.icmp_signed("<", y0, _i64(0)), _i64(0), y0)
    hi = b.add(y0, _i64(d.kh))
    hi = b.select(b.icmp_signed(">", hi, _i64(d.h)), _i64(d.h), hi)
    base = b.mul(n, _i64(d.h))
    start = b.load(ready, typ=I64)
    first = b.add(base, lo)
    start = b.select(b.icmp_signed(">", start, first), start, first)
    end = b.add(base, hi)

    def slot(b, iy):  # pointer to E's row iy in the ring
        return b.gep(ring, [b.mul(b.urem(iy, _i64(d.kh)), _i64(d.w * d.cin))],
                     source_etype=F32, inbounds=True)

    def expand_row(b, g):  # g = n * H + iy
        src = b.gep(x_ptr, [b.mul(g, _i64(r.w * r.cin))], source_etype=F32, inbounds=True)
        dst = slot(b, b.sub(g, base))
        counted_loop(b, _i64(0), _i64(r.items), lambda b, t: conv.emit_item(
            b, r, src, w1, b1, dst, t, None, None, transform))

    counted_loop(b, start, end, expand_row)
    b.store(b.select(b.icmp_signed(">", end, start), end, start), ready)
    counted_loop(b, _i64(0), _i64(d.chunks), lambda b, c: grouped.emit_item(
        b, d, None, w2, b2, y_ptr, b.add(b.mul(item, _i64(d.chunks)), c), apply, after,
        rows=lambda b, n_, iy: slot(b, iy)))
