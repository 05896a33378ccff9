"""1-d and 3-d windows as 2-d ones: convolutions and pooling the CPU kernels run; conv
taps that only ever read padding dropped (`trim_taps`); and a dilated conv whose taps
mostly read padding split into one 1x1 conv per tap over the outputs it reads the
image for (`split_taps`).

braze's window kernels (compiler/kernels/conv.py, grouped.py, the pooling rows) are
written for 2-d images in channels-last layout. Other ranks become 2-d windows plus
movement, which the layout pass and the consumers' index arithmetic then absorb:

1-d (N,C,W), a convolution with one group (grouped 1-d convs have their own kernel)
or a max or average pool:
  conv1d(x, w)  = reshape(conv2d(reshape(x, N,C,1,W), reshape(w, O,C,1,K)), N,O,Wo)
  (a 1 x K window over a 1-row image: the same products in the same order; a pool's
  1 x K window counts the same elements, padding included or not)

3-d (N,C,D,H,W), depth folded into the batch and the depth taps into the channels:
  xp   = x padded in depth only (zeros for a conv, -inf for max pooling)
  x_k  = slice(xp, depth k*dd, step sd, Do of them)         for each depth tap k < KD
  conv3d(x, w)[n,o,d] = sum_k conv2d(x_k[n,:,d], w[:,:,k])  (depth window k, in order)
                      = conv2d(concat_k x_k[n,:,d], w')     (one contraction over k and c)
  with w' = w transposed to O,KD,C/g,KH,KW and flattened to O,KD*C/g,KH,KW. With g
  groups the taps are concatenated inside each group (x_k seen as N,g,C/g,...), so
  group j's input channels are still the ones w' expects: tap-major, then channel.
  The 2-d conv runs on N*Do images: transpose N,C',Do,H,W -> N,Do,C',H,W, reshape;
  its output N*Do,O,Ho,Wo is reshaped and transposed back to N,O,Do,Ho,Wo.
  max_pool3d(x)[n,c,d] = max_k max_pool2d(x_k[n,c,d]) (one 2-d pool per depth tap);
  avg_pool3d(x)[n,c,d] = (1/KD) sum_k avg_pool2d(x_k[n,c,d]) where every tap counts
  the same elements: no depth padding, or padding counted (count_include_pad); a
  depth-padded average that leaves the padding out is the padding-counted one times
  (window size) / (its elements in the image), a constant per output position.
The concatenation holds KD copies of the (strided) input: a video model's 3x3x3
convs read 3x their input once, then run on the register-blocked GEMM as any conv. A
KD x 1 x 1 conv with no height or width stride or padding (R(2+1)D's temporal convs)
is instead a 2-d KD x 1 conv over N, C, D, H*W: its depth taps are index arithmetic
in the direct kernel, no copy (r2plus1d_18 at 2 threads: 201-213 -> 192-196 ms).

The rewrite is exact: every output is the same sum of the same products; only the
order in which the K = KD*C*KH*KW products are added may differ (as between any two
conv kernels). Target pass (compiler/driver.py, TARGET_PASSES): CPU targets only,
since the lowered 2-d windows are worth it only where they compile.
"""

from __future__ import annotations

import math

import numpy as np

from compiler.target import kind as target_kind
from compiler.ir import Graph, Node, Value
from compiler.passes.layout import to_first, to_last
from compiler.passes.rules import new_const

FLOATS = ("f32",)  # the dtype the 2-d window kernels compile (README: not float64)


def lower_windows(graph: Graph, target: str = "cpu") -> bool:
    """Rewrite every 1-d single-group conv and 3-d conv or max pool of `graph` into 2-d
    ones (module doc), in place; whether any changed."""
    if target_kind(target) != "cpu":
        return False
    changed = False
    for node in list(graph.nodes):
        changed |= trim_taps(graph, node)
        if split_taps(graph, node) or dilated_phases(graph, node):
            changed = True
        elif _refusal(node) is None:
            lowered = _LOWER[(node.op, node.inputs[0].type.rank)](graph, node)
            graph.replace_all_uses(node.output, lowered)
            graph.remove_node(node)
            changed = True
    if changed:
        graph.remove_dead()  # the untrimmed weights
    return changed


def trim_taps(graph: Graph, node: Node) -> bool:
    """Drop a conv's kernel taps that read only padding at every output position (a
    dilated conv wider than its image: DeepLab's ASPP at dilation 24 and 36 on a 14 x 14
    map reads nothing but its centre tap); in place, whether it changed. Tap k of a
    spatial dim reads input o*s - p + k*d for output o: those in [0, H) for some o are a
    contiguous run [k0, k1]; the kept taps start k0*d later, so the leading pad shrinks
    by that, and the trailing pad keeps the output size."""
    if node.op != "conv" or node.attrs.get("layout", "NCHW") != "NCHW" \
            or not node.inputs[1].is_const or not node.inputs[0].type.static:
        return False
    x, w = node.inputs[:2]
    a = node.attrs
    n = len(x.shape) - 2
    keep, pads = [], [0] * (2 * n)
    for i in range(n):
        size, k = x.shape[2 + i], w.shape[2 + i]
        s, d, p = a["strides"][i], a["dilations"][i], a["pads"][i]
        outs = node.output.shape[2 + i]
        valid = [t for t, (lo, hi) in enumerate(_tap_outputs(size, outs, k, d, p, s)) if hi > lo]
        if not valid:
            return False  # an all-padding window: leave it to the kernel
        k0, k1 = valid[0], valid[-1]
        keep.append((k0, k1))
        pads[i] = p - k0 * d
        pads[n + i] = (outs - 1) * s + d * (k1 - k0) + 1 - size - pads[i]
    if all(k0 == 0 and k1 == w.shape[2 + i] - 1 for i, (k0, k1) in enumerate(keep)) \
            or any(q < 0 for q in pads):
        return False
    kept = w.const_value[(slice(None), slice(None)) + tuple(slice(k0, k1 + 1) for k0, k1 in keep)]
    graph.set_input(node, 1, new_const(graph, node, kept, f"{w.name}.trimmed"))
    node.attrs["pads"] = tuple(pads)
    return True


# A dilated conv is split into one 1x1 conv per tap (`split_taps`) when at most this
# share of its taps' products read the image (the rest read padding).
SPLIT_MAX_USEFUL = 0.6


def _plain_conv2d(node: Node) -> bool:
    """Whether `node` is a 2-d float conv, channels-first, of static shape with a
    constant weight (what split_taps and dilated_phases rewrite)."""
    return node.op == "conv" and node.attrs.get("layout", "NCHW") == "NCHW" \
        and node.inputs[0].type.rank == 4 and node.inputs[1].is_const \
        and node.inputs[0].type.static and node.inputs[0].dtype in FLOATS


def _tap_outputs(size: int, outs: int, k: int, d: int, p: int,
                 s: int = 1) -> list[tuple[int, int]]:
    """For each tap t < k of a window dim: the outputs [lo, hi) whose input o*s - p + t*d
    lies in [0, size) (hi <= lo: none); a run, since the input grows with o."""
    return [(max(0, -(-(p - t * d) // s)), min(outs, (size - 1 + p - t * d) // s + 1))
            for t in range(k)]


def split_taps(graph: Graph, node: Node) -> bool:
    """A dilated stride-1 conv whose taps mostly read padding (DeepLab's ASPP at
    dilation 12 on a 14 x 14 map: 324 of its 9 x 196 tap-pixel products read the image)
    as a sum of one 1x1 conv per tap over just the outputs that tap reads the image
    for, each padded back to the output's size:

        y = bias + sum over taps (i, j) of pad(conv1x1(x[rows_i, cols_j], w[:, :, i, j]))

    in place (the conv's uses are re-pointed); whether it changed. Taken when at most
    SPLIT_MAX_USEFUL of the products read the image: the kernel computes every product,
    padding included (5.4x the work in that ASPP branch); the taps' weights are read
    once either way. Exact up to the order the products are added in."""
    if not _plain_conv2d(node):
        return False
    a = node.attrs
    x, w = node.inputs[:2]
    o, c, kh, kw = w.shape
    if a["group"] != 1 or tuple(a["strides"]) != (1, 1) or max(a["dilations"]) == 1 \
            or kh * kw == 1:
        return False
    (_, _, ho, wo), (_, _, h, wd) = node.output.shape, x.shape
    rows = _tap_outputs(h, ho, kh, a["dilations"][0], a["pads"][0])
    cols = _tap_outputs(wd, wo, kw, a["dilations"][1], a["pads"][1])
    useful = sum(max(0, r1 - r0) * max(0, c1 - c0) for r0, r1 in rows for c0, c1 in cols)
    if useful == 0 or useful > SPLIT_MAX_USEFUL * kh * kw * ho * wo:
        return False
    at = _At(graph, node)
    weights = w.const_value
    y = None
    for i, (r0, r1) in enumerate(rows):
        for j, (c0, c1) in enumerate(cols):
            if r1 <= r0 or c1 <= c0:
                continue
            starts = (0, 0, r0 - a["pads"][0] + i * a["dilations"][0],
                      c0 - a["pads"][1] + j * a["dilations"][1])
            part = at.op("slice", x, starts=starts, steps=(1, 1, 1, 1),
                         sizes=(x.shape[0], c, r1 - r0, c1 - c0))
            tap = at.const(np.ascontiguousarray(weights[:, :, i:i + 1, j:j + 1]))
            part = at.op("conv", part, tap, strides=(1, 1), pads=(0, 0, 0, 0),
                         dilations=(1, 1), group=1)
            if (r0, c0, r1, c1) != (0, 0, ho, wo):
                part = at.op("pad", part, pads=(0, 0, r0, c0, 0, 0, ho - r1, wo - c1))
            y = part if y is None else at.op("add", y, part)
    if len(node.inputs) > 2:
        y = at.op("add", y, at.reshape(node.inputs[2], (1, o, 1, 1)))
    graph.replace_all_uses(node.output, y)
    graph.remove_node(node)
    return True


def dilated_phases(graph: Graph, node: Node) -> bool:
    """A dilated 3x3 stride-1 conv that keeps its image's size (DeepLab's and FCN's
    dilated ResNet stages) as an undilated one over the image's dy x dx phases, stacked
    in the batch (TensorFlow's space-to-batch for atrous convs): output row dy*a + r
    reads input rows dy*(a + k - p/dy) + r, row a + k - p/dy of phase r. The undilated
    conv runs on Winograd's kernel (a dilated one cannot): 512 -> 512 at dilation 4 on
    28x28, 2 threads, 17.3 -> 9.3 ms; 256 -> 256 at dilation 2, 5.1 -> 2.0 ms. In place
    (the conv's uses re-pointed); whether it changed. Taken where each pad is a whole
    number of dilations, the phases are big enough for Winograd's tiles and the channels
    are whole vectors; the image is zero-padded to whole phases (rows the conv's own
    padding reads as zeros too)."""
    from compiler.kernels.winograd import MIN_SIDE

    if not _plain_conv2d(node):
        return False
    a = node.attrs
    x, w = node.inputs[:2]
    n, c, h, wd = x.shape
    o = w.shape[0]
    dy, dx = a["dilations"]
    pt, pl, pb, pr = a["pads"]
    if a["group"] != 1 or tuple(a["strides"]) != (1, 1) or w.shape[2:] != (3, 3) \
            or max(dy, dx) == 1 or node.output.shape[2:] != (h, wd) or c % 16 or o % 32 \
            or pt % dy or pb % dy or pl % dx or pr % dx:
        return False
    ph, pw = -(-h // dy), -(-wd // dx)  # a phase's rows and columns
    if min(ph, pw) < MIN_SIDE:
        return False
    at = _At(graph, node)
    if (ph * dy, pw * dx) != (h, wd):
        x = at.op("pad", x, pads=(0, 0, 0, 0, 0, 0, ph * dy - h, pw * dx - wd))
    x = at.reshape(x, (n, c, ph, dy, pw, dx))
    x = at.op("transpose", x, perm=(0, 3, 5, 1, 2, 4))  # N, dy, dx, C, ph, pw
    x = at.reshape(x, (n * dy * dx, c, ph, pw))
    y = at.op("conv", x, *node.inputs[1:], strides=(1, 1), dilations=(1, 1), group=1,
              pads=(pt // dy, pl // dx, pb // dy, pr // dx))
    y = at.reshape(y, (n, dy, dx, o, ph, pw))
    y = at.op("transpose", y, perm=(0, 3, 4, 1, 5, 2))  # N, O, ph, dy, pw, dx
    y = at.reshape(y, (n, o, ph * dy, pw * dx))
    if (ph * dy, pw * dx) != (h, wd):
        y = at.op("slice", y, starts=(0, 0, 0, 0), steps=(1, 1, 1, 1), sizes=(n, o, h, wd))
    graph.replace_all_uses(node.output, y)
    graph.remove_node(node)
    return True


def _refusal(node: Node) -> str | None:
    """None if `node` is a window this pass lowers, else why not."""
    x = node.inputs[0] if node.inputs else None
    if x is None or (node.op, x.type.rank) not in _LOWER:
        return "not a 1-d or 3-d window this pass lowers"
    if node.op == "conv" and x.type.rank == 3 and node.attrs["group"] != 1:
        return "grouped 1-d convs have their own kernel"
    if node.attrs.get("layout", "NCHW") != "NCHW" or not x.type.static:
        return "not a static channels-first window"
    if x.dtype not in FLOATS or any(not v.type.static for v in node.inputs):
        return f"dtype {x.dtype} or a dynamic operand"
    return None


class _At:
    """Inserts nodes before a given node, in order."""

    def __init__(self, graph: Graph, node: Node):
        self.graph = graph
        self.index = graph.nodes.index(node)
        self.name = node.name

    def op(self, op: str, *inputs: Value, **attrs) -> Value:
        """A new node's value; movement of a constant (the weight's) is folded here, since
        this pass runs after the pipeline's constant folding."""
        node = self.graph.add_node(op, inputs, attrs, name=self.name, index=self.index)
        self.index += 1
        if op in ("reshape", "transpose") and inputs[0].is_const:
            array = node.opdef.eval_fn(node, inputs[0].const_value)[0]
            self.index -= 1
            self.graph.remove_node(node)
            return self.const(array)
        return node.output

    def const(self, array) -> Value:
        v = new_const(self.graph, self.graph.nodes[self.index], array, f"{self.name}.w")
        self.index += 1
        return v

    def reshape(self, x: Value, shape) -> Value:
        return self.op("reshape", x, shape=tuple(int(d) for d in shape))


# -- 1-d ------------------------------------------------------------------

def _conv1d(graph: Graph, node: Node) -> Value:
    at = _At(graph, node)
    x, w = node.inputs[:2]
    a = node.attrs
    n, c, width = x.shape
    x4 = at.reshape(x, (n, c, 1, width))
    w4 = at.reshape(w, (w.shape[0], w.shape[1], 1, w.shape[2]))
    y = at.op("conv", x4, w4, *node.inputs[2:], strides=(1, a["strides"][0]),
              pads=(0, a["pads"][0], 0, a["pads"][1]), dilations=(1, a["dilations"][0]),
              group=1)
    return at.reshape(y, node.output.shape)


def _pool1d(graph: Graph, node: Node) -> Value:
    at = _At(graph, node)
    x = node.inputs[0]
    a = node.attrs
    n, c, width = x.shape
    extra = {"count_include_pad": a["count_include_pad"]} if node.op == "avg_pool" else {}
    y = at.op(node.op, at.reshape(x, (n, c, 1, width)), kernel=(1, a["kernel"][0]),
              strides=(1, a["strides"][0]), pads=(0, a["pads"][0], 0, a["pads"][1]),
              dilations=(1, a["dilations"][0]), **extra)
    return at.reshape(y, node.output.shape)


# -- 3-d ------------------------------------------------------------------
# Volumes are handled channels-last (N,D,H,W,C) from the start: the transposes this
# writes around each window cancel against the layout pass's (compiler/passes/layout.py
# sinks the rank-5 ones through the elementwise ops between windows), so a video
# model's activations stay channels-last from one window to the next.

def _volume_last(at: _At, node: Node, fill: float) -> Value:
    """The window's input as N,D,H,W,C, padded in depth."""
    x = at.op("transpose", node.inputs[0], perm=to_last(5))
    before, after = node.attrs["pads"][0], node.attrs["pads"][3]
    if before or after:
        pads = (0, before, 0, 0, 0, 0, after, 0, 0, 0)
        x = at.op("pad", x, pads=pads, mode="constant", value=fill)
    return x


def _depth_taps(at: _At, node: Node, x: Value, taps: int) -> list[Value]:
    """x_k for each depth tap k (module doc): Do planes of the padded N,D,H,W,C input
    `x`, read with the window's depth stride."""
    a = node.attrs
    stride, dilation = a["strides"][0], a["dilations"][0]
    n, _, h, w, c = x.shape
    sizes = (n, node.output.shape[2], h, w, c)
    return [at.op("slice", x, starts=(0, k * dilation, 0, 0, 0), steps=(1, stride, 1, 1, 1),
                  sizes=sizes) for k in range(taps)]


def _images(at: _At, x: Value) -> Value:
    """N,Do,H,W,C -> N*Do,C,H,W (each depth plane an image, seen channels-first)."""
    n, d, h, w, c = x.shape
    return at.op("transpose", at.reshape(x, (n * d, h, w, c)), perm=to_first(4))


def _volume_first(at: _At, y: Value, out_shape) -> Value:
    """N*Do,O,Ho,Wo -> N,O,Do,Ho,Wo (through N,Do,Ho,Wo,O)."""
    n, o, d, h, w = out_shape
    y = at.reshape(at.op("transpose", y, perm=to_last(4)), (n, d, h, w, o))
    return at.op("transpose", y, perm=to_first(5))


def _plane_attrs(a: dict) -> dict:
    """The 2-d window attributes of a 3-d window (height and width)."""
    pads = a["pads"]
    return {"strides": tuple(a["strides"][1:]), "dilations": tuple(a["dilations"][1:]),
            "pads": (pads[1], pads[2], pads[4], pads[5])}


def _stack_taps(at: _At, taps: list[Value], groups: int) -> Value:
    """The taps' channels side by side within each group: channel j*KD*C/g + k*C/g + c
    is channel c of group j of tap k."""
    if len(taps) == 1:
        return taps[0]
    n, d, h, w, c = taps[0].shape
    split = [at.reshape(t, (n, d, h, w, groups, c // groups)) for t in taps]
    return at.reshape(at.op("concat", *split, axis=5), (n, d, h, w, c * len(taps)))


def _conv3d(graph: Graph, node: Node) -> Value:
    at = _At(graph, node)
    w = node.inputs[1]
    g = node.attrs["group"]
    o, cg, kd, kh, kw = w.shape
    if kd > 1 and _temporal(node):
        return _conv3d_temporal(at, node)
    taps = _depth_taps(at, node, _volume_last(at, node, 0.0), kd)
    w2 = at.reshape(at.op("transpose", w, perm=(0, 2, 1, 3, 4)), (o, kd * cg, kh, kw))
    y = at.op("conv", _images(at, _stack_taps(at, taps, g)), w2, *node.inputs[2:], group=g,
              **_plane_attrs(node.attrs))
    return _volume_first(at, y, node.output.shape)


def _temporal(node: Node) -> bool:
    """Whether a 3-d conv's window is KD x 1 x 1 with no stride or padding in height and
    width (R(2+1)D's temporal convs)."""
    a = node.attrs
    pads = a["pads"]
    return node.inputs[1].shape[3:] == (1, 1) and tuple(a["strides"][1:]) == (1, 1) \
        and not any(pads[i] for i in (1, 2, 4, 5))


def _conv3d_temporal(at: _At, node: Node) -> Value:
    """A KD x 1 x 1 conv as a 2-d KD x 1 conv over the volume seen as N, C, D, H*W
    (built channels-last, as the other 3-d windows are, so the transposes cancel): its
    taps are index arithmetic in the direct kernel, where stacking KD depth-shifted
    copies in the channels wrote KD times the input (R(2+1)D-18's layer 1: 43 MB a
    conv)."""
    w = node.inputs[1]
    a = node.attrs
    o, cg, kd = w.shape[:3]
    x = _volume_last(at, node, 0.0)  # N, D (padded), H, W, C
    n, d, h, wd, c = x.shape
    img = at.op("transpose", at.reshape(x, (n, d, h * wd, c)), perm=to_first(4))
    y = at.op("conv", img, at.reshape(w, (o, cg, kd, 1)), *node.inputs[2:],
              group=a["group"], strides=(a["strides"][0], 1), pads=(0, 0, 0, 0),
              dilations=(a["dilations"][0], 1))
    do = node.output.shape[2]
    y = at.reshape(at.op("transpose", y, perm=to_last(4)), (n, do, h, wd, o))
    return at.op("transpose", y, perm=to_first(5))


def count_ratio(in_dims, out_dims, kernel, attrs: dict, region) -> np.ndarray:
    """The factor that turns a whole-window average into one over the elements in the
    image grown by `region` (begin..end pads per dim; zeros: the image alone): per
    output position of a window op (`attrs`: strides, pads, dilations), (window size) /
    (its elements there), float32 shaped 1, 1, *out_dims to multiply an N, C, ... output."""
    n = len(in_dims)
    counts = np.ones((), np.float64)
    for i in range(n):
        start = np.arange(out_dims[i]) * attrs["strides"][i] - attrs["pads"][i]
        taps = start[:, None] + np.arange(kernel[i]) * attrs["dilations"][i]
        inside = (taps >= -region[i]) & (taps < in_dims[i] + region[n + i])
        counts = np.multiply.outer(counts, inside.sum(axis=1))
    ratio = float(np.prod(kernel)) / counts
    return ratio.reshape((1, 1) + ratio.shape).astype(np.float32)


def _pool3d(graph: Graph, node: Node) -> Value:
    """max: the largest of the taps' 2-d maxima. avg: the mean of the taps' 2-d means,
    exact when every tap has the same count (no depth padding, or padding counted); a
    depth-padded average that leaves the padding out is the padding-counted one times
    (window size) / (its elements in the image) per output position, a constant."""
    at = _At(graph, node)
    a = node.attrs
    kd, kh, kw = a["kernel"]
    average = node.op == "avg_pool"
    rescale = average and not a["count_include_pad"] and (a["pads"][0] or a["pads"][3])
    extra = {"count_include_pad": a["count_include_pad"] or rescale} if average else {}
    taps = _depth_taps(at, node, _volume_last(at, node, 0.0 if average else -math.inf), kd)
    pooled = [at.op(node.op, _images(at, t), kernel=(kh, kw), **_plane_attrs(a), **extra)
              for t in taps]
    y = pooled[0]
    for p in pooled[1:]:
        y = at.op("add" if average else "max", y, p)
    if average and kd > 1:
        y = at.op("mul", y, at.const(np.array(1.0 / kd, np.float32)))
    y = _volume_first(at, y, node.output.shape)
    if rescale:
        y = at.op("mul", y, at.const(count_ratio(node.inputs[0].shape[2:],
                                                 node.output.shape[2:], a["kernel"], a,
                                                 [0] * 6)))
    return y


_LOWER = {("conv", 3): _conv1d, ("max_pool", 3): _pool1d, ("avg_pool", 3): _pool1d,
          ("conv", 5): _conv3d, ("max_pool", 5): _pool3d, ("avg_pool", 5): _pool3d}
