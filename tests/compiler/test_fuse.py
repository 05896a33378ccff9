"""Kernel formation (compiler/passes/fuse.py): kernel counts, what each kernel computes,
why values get buffers; and the fused kernels' numbers against the interpreter."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from compiler.codegen import compile_graph
from compiler.interp import evaluate
from compiler.ir import Graph, TensorType, verify
from compiler.ops import Family
from compiler.passes import fuse
from compiler.passes.fuse import plan
from compiler.text import parse_graph
from runtime.cpu import CpuStep
from tests.compiler.test_codegen_ops import assert_matches

ADD3 = """
graph add3(%a: f32[8,16], %b: f32[16], %c: f32[8,1]) -> (%y) {
  %ab = add(%a, %b) : f32[8,16]
  %y = add(%ab, %c) : f32[8,16]
}
"""

SOFTMAX = """
graph softmax(%x: f32[6,100]) -> (%y) {
  %m = reduce_max(%x) {axes=[1], keepdims=true} : f32[6,1]
  %d = sub(%x, %m) : f32[6,100]
  %e = exp(%d) : f32[6,100]
  %s = reduce_sum(%e) {axes=[1], keepdims=true} : f32[6,1]
  %y = div(%e, %s) : f32[6,100]
}
"""

LOG_SOFTMAX = """
graph log_softmax(%x: f32[3,5,40]) -> (%y) {
  %m = reduce_max(%x) {axes=[2], keepdims=true} : f32[3,5,1]
  %d = sub(%x, %m) : f32[3,5,40]
  %e = exp(%d) : f32[3,5,40]
  %s = reduce_sum(%e) {axes=[2], keepdims=true} : f32[3,5,1]
  %l = log(%s) : f32[3,5,1]
  %y = sub(%d, %l) : f32[3,5,40]
}
"""

LAYER_NORM = """
graph layer_norm(%x: f32[10,64], %gamma: f32[64], %beta: f32[64]) -> (%y) {
  %inv_n = const() {value=dense<f32[]: [0.015625]>} : f32[]
  %eps = const() {value=dense<f32[]: [1e-05]>} : f32[]
  %s = reduce_sum(%x) {axes=[1], keepdims=true} : f32[10,1]
  %mean = mul(%s, %inv_n) : f32[10,1]
  %d = sub(%x, %mean) : f32[10,64]
  %sq = mul(%d, %d) : f32[10,64]
  %ss = reduce_sum(%sq) {axes=[1], keepdims=true} : f32[10,1]
  %var = mul(%ss, %inv_n) : f32[10,1]
  %ve = add(%var, %eps) : f32[10,1]
  %sd = sqrt(%ve) : f32[10,1]
  %n = div(%d, %sd) : f32[10,64]
  %sc = mul(%n, %gamma) : f32[10,64]
  %y = add(%sc, %beta) : f32[10,64]
}
"""

MEAN_VAR = """
graph mean_var(%x: f32[7,33]) -> (%mean, %var) {
  %inv_n = const() {value=dense<f32[]: [0.030303030303]>} : f32[]
  %s = reduce_sum(%x) {axes=[1], keepdims=false} : f32[7]
  %mean = mul(%s, %inv_n) : f32[7]
  %x2 = mul(%x, %x) : f32[7,33]
  %s2 = reduce_sum(%x2) {axes=[1], keepdims=false} : f32[7]
  %m2 = mul(%s2, %inv_n) : f32[7]
  %mm = mul(%mean, %mean) : f32[7]
  %var = sub(%m2, %mm) : f32[7]
}
"""

TRANSPOSE_ADD = """
graph transpose_add(%x: f32[16,8], %y: f32[8,16]) -> (%z) {
  %t = transpose(%x) {perm=[1, 0]} : f32[8,16]
  %z = add(%t, %y) : f32[8,16]
}
"""

MOVEMENT_CHAIN = """
graph moves(%x: f32[4,6], %y: f32[3,4], %i: i64[5]) -> (%z) {
  %t = transpose(%x) {perm=[1, 0]} : f32[6,4]
  %r = reshape(%t) {shape=[2, 3, 4]} : f32[2,3,4]
  %s = slice(%r) {starts=[1, 0, 0], steps=[1, 1, 1], sizes=[1, 3, 4]} : f32[1,3,4]
  %q = reshape(%s) {shape=[3, 4]} : f32[3,4]
  %c = concat(%q, %y) {axis=0} : f32[6,4]
  %p = pad(%c) {pads=[1, 0, 0, 2], mode="constant", value=0.0} : f32[7,6]
  %g = gather(%p, %i) {axis=0} : f32[5,6]
  %b = broadcast(%g) {shape=[2, 5, 6]} : f32[2,5,6]
  %zero = const() {value=dense<f32[]: [0.0]>} : f32[]
  %gt = gt(%b, %zero) : bool[2,5,6]
  %nb = neg(%b) : f32[2,5,6]
  %z = select(%gt, %b, %nb) : f32[2,5,6]
}
"""


def _graph(text: str):
    g = parse_graph(text)
    g.toposort()
    verify(g)
    return g


def _inputs(g, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    out = []
    for v in g.inputs:
        if v.dtype == "i64":
            out.append(rng.integers(-3, 3, v.shape))
        else:
            out.append(rng.standard_normal(v.shape).astype(np.float32))
    return out


# float32 tolerance of fused kernels: row sums reassociate (a partial sum per vector
# lane), and layer norm's x - mean amplifies that difference
RTOL, ATOL = 2e-5, 2e-6


def _check_numbers(g) -> None:
    inputs = _inputs(g)
    got = CpuStep(compile_graph(g)).run(inputs)
    for v, a, b in zip(g.outputs, got, evaluate(g, inputs)):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=v.name)


def test_a_plus_b_plus_c_is_one_kernel():
    g = _graph(ADD3)
    p = plan(g)
    assert len(p.kernels) == 1 and p.kernels[0].kind == "loop"
    assert [n.op for n in p.kernels[0].nodes] == ["add", "add"]
    assert p.reasons == {g.outputs[0]: "cluster output"}
    _check_numbers(g)


def test_softmax_is_one_kernel_of_three_passes():
    g = _graph(SOFTMAX)
    p = plan(g)
    assert len(p.kernels) == 1
    k = p.kernels[0]
    assert k.kind == "row" and k.domain == (6, 100) and k.axes == (1,)
    # max; then sum of exp; then the normalizing pass that writes the row
    assert [[n.op for n in level] for level in k.levels] == [["reduce_max"], ["reduce_sum"]]
    assert sorted(n.op for n in k.nodes) == sorted(
        ["reduce_max", "sub", "exp", "reduce_sum", "div"])
    _check_numbers(g)


def test_log_softmax_is_one_kernel():
    g = _graph(LOG_SOFTMAX)
    assert len(plan(g).kernels) == 1
    _check_numbers(g)


def test_layer_norm_is_one_kernel():
    g = _graph(LAYER_NORM)
    p = plan(g)
    assert len(p.kernels) == 1
    k = p.kernels[0]
    assert [[n.outputs[0].name for n in level] for level in k.levels] == [["s"], ["ss"]]
    assert len(k.nodes) == len([n for n in g.nodes if n.op != "const"])
    _check_numbers(g)


def test_mean_and_variance_outputs():
    g = _graph(MEAN_VAR)
    p = plan(g)
    # one row kernel per output; %var's reads %mean from the first kernel's output
    assert [k.root.name for k in p.kernels] == ["mean", "var"]
    assert [[n.outputs[0].name for n in lv] for lv in p.kernels[1].levels] == [["s2"]]
    _check_numbers(g)


def test_transpose_add_is_one_kernel():
    g = _graph(TRANSPOSE_ADD)
    p = plan(g)
    assert len(p.kernels) == 1
    assert [n.op for n in p.kernels[0].nodes] == ["transpose", "add"]
    _check_numbers(g)


def test_movement_chain_is_index_arithmetic():
    g = _graph(MOVEMENT_CHAIN)
    p = plan(g)
    assert len(p.kernels) == 1
    assert p.reasons == {g.outputs[0]: "cluster output"}
    g_in = _inputs(g)
    g_in[2] = np.array([0, -1, 3, 6, 2])
    got = CpuStep(compile_graph(g)).run(g_in)
    assert_matches(got[0], evaluate(g, g_in)[0], "z")


def test_reductions_over_other_axes_split_with_a_reason():
    g = _graph("""
graph two_axes(%x: f32[5,7]) -> (%y) {
  %r = reduce_sum(%x) {axes=[1], keepdims=true} : f32[5,1]
  %d = sub(%x, %r) : f32[5,7]
  %y = reduce_max(%d) {axes=[0], keepdims=true} : f32[1,7]
}
""")
    p = plan(g)
    assert len(p.kernels) == 2
    r = next(v for v in p.reasons if v.name == "r")
    assert "axes (1,)" in p.reasons[r] and "reduces axes (0,)" in p.reasons[r]
    _check_numbers(g)


def test_movement_after_a_reduction_ends_the_row_kernel():
    g = _graph(SOFTMAX.replace("-> (%y)", "-> (%t)").replace(
        "  %y = div(%e, %s) : f32[6,100]\n",
        "  %y = div(%e, %s) : f32[6,100]\n  %t = transpose(%y) {perm=[1, 0]} : f32[100,6]\n"))
    p = plan(g)
    assert len(p.kernels) == 2
    y = next(v for v in p.reasons if v.name == "y")
    assert "transpose of a value derived from a reduction" in p.reasons[y]
    _check_numbers(g)


def test_shared_costly_value_is_materialized_cheap_one_recomputed():
    g = _graph("""
graph shared(%x: f32[4,9], %y: f32[4,9]) -> (%o1, %o2, %o3, %o4) {
  %e = exp(%x) : f32[4,9]
  %a = add(%x, %y) : f32[4,9]
  %o1 = mul(%e, %a) : f32[4,9]
  %o2 = sub(%e, %a) : f32[4,9]
  %o3 = add(%o1, %a) : f32[4,9]
  %o4 = neg(%a) : f32[4,9]
}
""")
    p = plan(g)
    names = {v.name: r for v, r in p.reasons.items()}
    assert "costly to recompute" in names["e"] and "a" not in names
    assert "cheaper to recompute" in {v.name: r for v, r in p.notes.items()}["a"]
    assert len(p.kernels) == 5
    assert "kernel 0 (loop) -> %e: exp" in p.explain()
    _check_numbers(g)


@pytest.mark.parametrize("window, shared", [(3, True), (2, False)])
def test_shared_pool_costs_its_window(window, shared):
    """A pool read by two kernels costs its window's taps to recompute: a 3x3 max pool
    (9 taps, DenseNet's stem pool read by each layer of its first block) gets a buffer,
    a 2x2 one (4 taps) is still recomputed by each kernel."""
    out = 8 // window if window == 2 else 3
    g = _graph(f"""
graph pool(%x: f32[1,8,8,16], %y: f32[1,{out},{out},16]) -> (%o1, %o2) {{
  %p = max_pool(%x) {{kernel=[{window}, {window}], strides=[2, 2], pads=[0, 0, 0, 0], dilations=[1, 1], layout="NHWC"}} : f32[1,{out},{out},16]
  %o1 = add(%p, %y) : f32[1,{out},{out},16]
  %o2 = mul(%p, %y) : f32[1,{out},{out},16]
}}
""")
    p = plan(g)
    reasons = {v.name: r for v, r in p.reasons.items()}
    assert ("p" in reasons) == shared
    if shared:
        assert f"{window * window} ops (> INLINE_COST" in reasons["p"]
    _check_numbers(g)


def test_reduction_read_by_two_kernels_is_computed_once():
    g = _graph("""
graph shared_red(%x: f32[4,9]) -> (%a, %b) {
  %s = reduce_sum(%x) {axes=[1], keepdims=true} : f32[4,1]
  %a = div(%x, %s) : f32[4,9]
  %b = mul(%x, %s) : f32[4,9]
}
""")
    p = plan(g)
    assert [v.name for v in p.materialized if v.name == "s"] == ["s"]
    assert len(p.kernels) == 3
    _check_numbers(g)


@pytest.mark.parametrize("keepdims", [True, False])
def test_plain_reduction_output(keepdims):
    shape = "f32[5,1]" if keepdims else "f32[5]"
    g = _graph(f"""
graph red(%x: f32[5,300], %y: f32[5,300]) -> (%r) {{
  %m = mul(%x, %y) : f32[5,300]
  %r = reduce_sum(%m) {{axes=[1], keepdims={str(keepdims).lower()}}} : {shape}
}}
""")
    assert len(plan(g).kernels) == 1
    _check_numbers(g)


def test_matmul_is_its_own_kernel_with_materialized_operands():
    g = _graph("""
graph mlp(%x: f32[4,8], %w: f32[8,16], %bias: f32[16]) -> (%y) {
  %xt = neg(%x) : f32[4,8]
  %h = matmul(%xt, %w) : f32[4,16]
  %hb = add(%h, %bias) : f32[4,16]
  %zero = const() {value=dense<f32[]: [0.0]>} : f32[]
  %y = max(%hb, %zero) : f32[4,16]
}
""")
    p = plan(g)
    # the bias add and the ReLU are the matmul's epilogue: applied to each tile in cache
    assert [k.kind for k in p.kernels] == ["loop", "contraction"]
    names = {v.name: r for v, r in p.reasons.items()}
    assert "operand" in names["xt"] and "h" not in names
    assert [n.op for n in p.kernels[1].nodes] == ["matmul", "add", "max"]
    _check_numbers(g)


def test_epilogue_stops_where_the_result_is_read_twice():
    g = _graph("""
graph two(%x: f32[4,8], %w: f32[8,16]) -> (%y, %z) {
  %h = matmul(%x, %w) : f32[4,16]
  %e = exp(%h) : f32[4,16]
  %y = neg(%e) : f32[4,16]
  %z = abs(%e) : f32[4,16]
}
""")
    p = plan(g)
    names = {v.name: r for v, r in p.reasons.items()}
    assert "epilogue (exp)" in names["e"] and "h" not in names
    assert [k.kind for k in p.kernels] == ["contraction", "loop", "loop"]
    _check_numbers(g)


def test_residual_stream_gets_one_buffer_per_block():
    """x1 = x + f(x) read by two later kernels: x1 is materialized, not each op
    inside it (latest shared value first)."""
    g = _graph("""
graph res(%x: f32[4,64]) -> (%a, %b) {
  %e = exp(%x) : f32[4,64]
  %t = tanh(%e) : f32[4,64]
  %x1 = add(%x, %t) : f32[4,64]
  %a = mul(%x1, %x1) : f32[4,64]
  %b = sub(%x1, %x) : f32[4,64]
}
""")
    p = plan(g)
    names = {v.name for v in p.materialized}
    assert "x1" in names and not {"e", "t"} & names
    _check_numbers(g)


def test_softmax_keeps_exp_per_row_and_divides_once_per_row():
    """exp is read by the sum's pass and the writing pass: the first stores it in a scratch
    row, the second loads it; the division by the row's sum is one reciprocal per row."""
    g = _graph(SOFTMAX)
    k = plan(g).kernels[0]
    assert [v.name for v in k.row_cached] == ["e"]
    assert "%e kept per row" in plan(g).explain()
    ir_text = compile_graph(g).llvm_ir
    assert ir_text.count("alloca float, i64 100") == 1
    assert ir_text.count("fdiv float 0x3ff0000000000000") == ir_text.count("fdiv") == 1
    _check_numbers(g)


def test_cheap_values_and_oversized_rows_are_not_kept():
    """Layer norm's x - mean is cheap: recomputed per pass. A row beyond ROW_CACHE_BYTES
    is recomputed too (the scratch lives on each thread's stack)."""
    assert plan(_graph(LAYER_NORM)).kernels[0].row_cached == []
    big = _graph(SOFTMAX.replace("100", "40000"))
    assert plan(big).kernels[0].row_cached == []


def test_epilogue_keeps_the_contraction_dtype():
    """A cast after a matmul ends its epilogue: the tile is stored in the root's buffer."""
    g = _graph("""
graph cast(%x: f32[4,8], %w: f32[8,16]) -> (%y) {
  %h = matmul(%x, %w) : f32[4,16]
  %r = neg(%h) : f32[4,16]
  %y = cast(%r) {to="f64"} : f64[4,16]
}
""")
    p = plan(g)
    assert [n.op for n in p.kernels[0].nodes] == ["matmul", "neg"]
    _check_numbers(g)


def test_gelu_and_residual_are_one_epilogue_dag():
    """h = x@w + b read twice by GELU (h * 0.5 * (1 + erf(h / sqrt 2))), then + skip: the
    whole DAG runs in the matmul's kernel; only its one value that leaves gets a buffer."""
    g = _graph("""
graph mlp(%x: f32[4,8], %w: f32[8,16], %b: f32[16], %skip: f32[4,16]) -> (%y, %z) {
  %h0 = matmul(%x, %w) : f32[4,16]
  %h = add(%h0, %b) : f32[4,16]
  %r2 = const() {value=dense<f32[]: [1.4142135]>} : f32[]
  %one = const() {value=dense<f32[]: [1.0]>} : f32[]
  %half = const() {value=dense<f32[]: [0.5]>} : f32[]
  %d = div(%h, %r2) : f32[4,16]
  %e = erf(%d) : f32[4,16]
  %a = add(%e, %one) : f32[4,16]
  %m = mul(%h, %a) : f32[4,16]
  %gl = mul(%m, %half) : f32[4,16]
  %y = add(%skip, %gl) : f32[4,16]
  %z = reduce_sum(%y) {axes=[1], keepdims=true} : f32[4,1]
}
""")
    p = plan(g)
    assert [n.op for n in p.kernels[0].nodes] == [
        "matmul", "add", "div", "erf", "add", "mul", "mul", "add"]
    assert not {"h0", "h", "e", "gl"} & {v.name for v in p.materialized}
    _check_numbers(g)


def test_ops_on_row_results_do_not_make_a_value_costly():
    """Layer norm's x - mean: mean = sum / n is one division per row, so the difference is
    cheap per element and recomputed, not kept in a scratch row."""
    k = plan(_graph(LAYER_NORM.replace("%mean = mul(%s, %inv_n)",
                                       "%mean = div(%s, %n_const)")
                    .replace("%eps = const()", "%n_const = const() {value=dense<f32[]: [64.0]>}"
                             " : f32[]\n  %eps = const()"))).kernels[0]
    assert k.row_cached == []


def _chain(n: int, head: str = "") -> Graph:
    """y = ops applied n times to x (sin, add s, mul s in turn): one long inline chain
    (after an optional matmul `head`, whose epilogue it then is)."""
    g = Graph("chain")
    x = g.add_input("x", TensorType("f32", (4, 8)))
    s = g.add_input("s", TensorType("f32", (4, 8)))
    v = g.op("matmul", x, g.add_input("w", TensorType("f32", (8, 8)))) if head else x
    for i in range(n):
        v = g.op("sin", v) if i % 3 == 0 else g.op("add" if i % 3 == 1 else "mul", v, s)
    g.outputs = [v]
    return g


def _inline_depth(k) -> int:
    """The longest path of ops inside kernel k (what the emitter recurses along)."""
    inside, depth = set(k.nodes), {}
    for n in k.nodes:
        d = 0 if n.opdef.family is Family.CONTRACTION else 1 + max(
            (depth.get(u, 0) for u in n.inputs if u.producer in inside), default=0)
        depth.update((v, d) for v in n.outputs)
    return max(depth.values())


@pytest.mark.parametrize("head", ["", "matmul"])
def test_a_long_chain_is_cut_every_max_inline_depth_ops(head):
    """400 elementwise ops (a valid model ran out of Python's stack: RecursionError in the
    fusion walk, then in the emitter): one kernel per MAX_INLINE_DEPTH ops, each cut
    with its reason, the last kernel's numbers equal to the interpreter's; a matmul's
    epilogue takes at most MAX_INLINE_DEPTH of them."""
    g = _chain(400, head)
    p = plan(g)
    assert len(p.kernels) == -(-(400 + bool(head)) // fuse.MAX_INLINE_DEPTH)
    assert all(_inline_depth(k) <= fuse.MAX_INLINE_DEPTH for k in p.kernels)
    cuts = [r for r in p.reasons.values() if "MAX_INLINE_DEPTH" in r]
    assert len(cuts) == len(p.kernels) - 1 - bool(head)  # the epilogue's root has its own
    if head:
        assert p.kernels[0].kind == "contraction"
        assert len(p.kernels[0].nodes) == 1 + fuse.MAX_INLINE_DEPTH
    _check_numbers(g)


def test_fused_nodes_walk_needs_no_stack():
    """Far more inlined ops than Python's recursion limit, in post-order (each node after
    the nodes it reads), as the recursive walk listed them."""
    g = _chain(3 * sys.getrecursionlimit())
    nodes = fuse._fused_nodes(g.outputs[0], set(g.outputs))
    assert nodes == [n for n in g.nodes if n.op != "const"]


def _channel_norm(t: int, c: int) -> str:
    """A per-channel norm (GroupNorm with a group per channel, as wav2vec2's first layer)
    over a channels-last (1, t, c) activation: transposed to (1, c, t), then mean,
    variance and the normalized row."""
    return f"""
graph norm(%x: f32[1,{t},{c}]) -> (%y) {{
  %n = const() {{value=dense<f32[]: [{float(t)}]>}} : f32[]
  %eps = const() {{value=dense<f32[]: [1e-5]>}} : f32[]
  %xt = transpose(%x) {{perm=[0,2,1]}} : f32[1,{c},{t}]
  %s = reduce_sum(%xt) {{axes=[2], keepdims=true}} : f32[1,{c},1]
  %m = div(%s, %n) : f32[1,{c},1]
  %d = sub(%xt, %m) : f32[1,{c},{t}]
  %d2 = mul(%d, %d) : f32[1,{c},{t}]
  %ss = reduce_sum(%d2) {{axes=[2], keepdims=true}} : f32[1,{c},1]
  %v = div(%ss, %n) : f32[1,{c},1]
  %ve = add(%v, %eps) : f32[1,{c},1]
  %r = sqrt(%ve) : f32[1,{c},1]
  %y = div(%d, %r) : f32[1,{c},{t}]
}}
"""


def test_large_strided_transpose_is_copied_before_a_row_kernel():
    """A row kernel reducing its last axis does not read a large transpose of a
    channels-last activation down its columns in every pass: the transpose gets a buffer
    (its own kernel, written in row groups), the norm reads rows in order; a small one
    stays inlined. Both compute the norm."""
    from compiler.codegen.kernel_facts import ROW_GROUP, row_group

    g = _graph(_channel_norm(600, 64))
    assert 600 * 64 >= fuse.STRIDED_ROW_ELEMENTS
    p = plan(g)
    xt = next(n.outputs[0] for n in g.nodes if n.op == "transpose")
    assert "transpose read down" in p.reasons[xt]
    assert [k.kind for k in p.kernels] == ["loop", "row"]
    groups = row_group(p.kernels[0])
    assert groups is not None and groups.group == ROW_GROUP and groups.dim == 1
    _check_numbers(g)
    small = _graph(_channel_norm(40, 8))
    assert [k.kind for k in plan(small).kernels] == ["row"]
    _check_numbers(small)


@pytest.mark.parametrize("shape,perm,dim", [
    ((1, 1, 3199, 512), (0, 3, 1, 2), 1),  # wav2vec2's: source rows 2 KiB apart
    ((700, 40), (1, 0), 0),                 # 40 rows: two whole groups and a short one
    ((3, 33, 257), (0, 2, 1), 1),           # batched, odd sizes
    ((2, 16, 12, 64), (0, 3, 1, 2), 1),     # NHWC -> NCHW: grouped rows 16 x 12 apart
    ((5, 40, 12, 24), (0, 3, 1, 2), 1),     # ... with 24 channels: a group and 8 more
    ((5, 8, 640), (2, 0, 1), 0),            # the source's last axis first
    ((640, 8, 5), (2, 0, 1), None),         # ... on a dim of 5: row by row
    ((64, 600), (1, 0), 0),
])
def test_transposes_written_in_row_groups_match_numpy(shape, perm, dim):
    """Transposes that move their source's last axis to a row dim of at least ROW_GROUP
    indices run in row groups (a root of at least ROW_GROUP_MIN_ELEMENTS), on one
    thread and two; the same numbers as numpy."""
    from compiler.codegen.kernel_facts import row_group

    out = tuple(shape[i] for i in perm)
    text = f"""
graph t(%x: f32[{",".join(map(str, shape))}]) -> (%y) {{
  %y = transpose(%x) {{perm=[{",".join(map(str, perm))}]}} : f32[{",".join(map(str, out))}]
}}
"""
    g = _graph(text)
    k, = plan(g).kernels
    groups = row_group(k)
    assert (groups.dim if groups is not None else None) == dim
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    program = compile_graph(g)
    for threads in (1, 2):
        y, = CpuStep(program, threads=threads).run([x])
        np.testing.assert_array_equal(y, np.transpose(x, perm))


def test_a_shared_reshape_stores_its_input():
    """A reshape to 1-d of a costly 2-d value read by two kernels: the 2-d value gets the
    buffer (its kernel runs over its own rows) and both readers read it through the
    reshape, at the same offsets; the reshape gets none."""
    g = _graph("""
graph shared_view(%x: f32[64,40], %y: f32[2560]) -> (%o1, %o2) {
  %e = exp(%x) : f32[64,40]
  %t = tanh(%e) : f32[64,40]
  %f = reshape(%t) {shape=[2560]} : f32[2560]
  %o1 = add(%f, %y) : f32[2560]
  %o2 = mul(%f, %y) : f32[2560]
}
""")
    p = plan(g)
    reasons = {v.name: r for v, r in p.reasons.items()}
    assert "costly to recompute" in reasons["t"] and "f" not in reasons
    assert next(k for k in p.kernels if k.root.name == "t").root.shape == (64, 40)
    _check_numbers(g)


def test_a_small_value_repeated_by_movement_is_stored_once():
    """Per-group values repeated over each group's channels (reshape, broadcast,
    reshape) and read by a loop over every pixel: stored once per channel, so the big
    loop reads a per-channel row instead of splitting each channel index per element."""
    g = _graph("""
graph per_channel(%x: f32[1,32,32,64], %s: f32[1,8,1]) -> (%y) {
  %e = exp(%s) : f32[1,8,1]
  %a = reshape(%e) {shape=[1, 1, 1, 8, 1]} : f32[1,1,1,8,1]
  %b = broadcast(%a) {shape=[1, 1, 1, 8, 8]} : f32[1,1,1,8,8]
  %c = reshape(%b) {shape=[1, 1, 1, 64]} : f32[1,1,1,64]
  %y = mul(%x, %c) : f32[1,32,32,64]
}
""")
    p = plan(g)
    reasons = {v.name: r for v, r in p.reasons.items()}
    assert "computed once" in reasons["c"] and "a" not in reasons and "b" not in reasons
    big = next(k for k in p.kernels if k.root.name == "y")
    assert [n.op for n in big.nodes] == ["mul"]
    _check_numbers(g)
