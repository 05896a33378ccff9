"""Fused attention: the fuse_attention pass (compiler/passes/attention.py) on decomposed
graphs, and the kernel (compiler/kernels/attention.py) against torch's
scaled_dot_product_attention: head dims 32/64/80, lengths 1/7/128/300, causal or not,
additive and boolean masks, and no T x T buffer in the memory plan."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from compiler.codegen import compile_graph
from runtime.cpu import CpuStep
from compiler.passes.attention import check, fuse_attention
from compiler.passes.pipeline import run_passes
from compiler.passes.rules import Context
from compiler.text import parse_graph


def _dims(s) -> str:
    return ",".join(map(str, s))


def _decomposed(b, h, t, d, *, scale_on_q=False, mask=False, weights_out=False):
    """The importers' form: q @ transpose(k), * scale, + mask, softmax as max/sub/exp/sum/
    div, @ v."""
    x, st, kt, sc = (b, h, t, d), (b, h, t, t), (b, h, d, t), (b, h, t, 1)
    q_line = (f"  %qs = mul(%q, %c) : f32[{_dims(x)}]\n  %s = matmul(%qs, %kt) : f32[{_dims(st)}]\n"
              f"  %s1 = add(%s, %zero) : f32[{_dims(st)}]" if scale_on_q else
              f"  %s0 = matmul(%q, %kt) : f32[{_dims(st)}]\n  %s1 = mul(%s0, %c) : f32[{_dims(st)}]")
    mask_line = f"  %s2 = add(%s1, %m) : f32[{_dims(st)}]" if mask else \
        f"  %s2 = add(%s1, %zero) : f32[{_dims(st)}]"
    outs = "%o, %p" if weights_out else "%o"
    return parse_graph(f"""
graph attn(%q: f32[{_dims(x)}], %k: f32[{_dims(x)}], %v: f32[{_dims(x)}], %m: f32[{t},{t}]) -> ({outs}) {{
  %c = const() {{value=dense<f32[]: [0.125]>}} : f32[]
  %zero = const() {{value=dense<f32[]: [0.0]>}} : f32[]
  %kt = transpose(%k) {{perm=[0,1,3,2]}} : f32[{_dims(kt)}]
{q_line}
{mask_line}
  %mx = reduce_max(%s2) {{axes=[3], keepdims=true}} : f32[{_dims(sc)}]
  %z = sub(%s2, %mx) : f32[{_dims(st)}]
  %e = exp(%z) : f32[{_dims(st)}]
  %sum = reduce_sum(%e) {{axes=[3], keepdims=true}} : f32[{_dims(sc)}]
  %p = div(%e, %sum) : f32[{_dims(st)}]
  %o = matmul(%p, %v) : f32[{_dims(x)}]
}}
""")


def _ops(g) -> list[str]:
    return [n.op for n in g.nodes if n.op != "const"]


@pytest.mark.parametrize("scale_on_q", [False, True])
def test_decomposed_attention_becomes_one_node(scale_on_q):
    g = _decomposed(1, 2, 7, 32, scale_on_q=scale_on_q, mask=True)
    run_passes(g, verify_each=True)
    assert _ops(g) == ["attention"]
    node = g.nodes[-1]
    assert node.attrs["scale"] == pytest.approx(0.125) and len(node.inputs) == 4


def test_weights_read_elsewhere_stay_decomposed():
    g = _decomposed(1, 2, 7, 32, weights_out=True)
    root = next(n for n in reversed(g.nodes) if n.op == "matmul")
    assert "read outside" in check(root, Context(g))
    assert not fuse_attention(g)


def test_boolean_select_mask_is_recognized():
    g = parse_graph("""
graph attn(%q: f32[2,5,16], %k: f32[2,5,16], %v: f32[2,5,16], %keep: bool[5,5]) -> (%o) {
  %fill = const() {value=dense<f32[]: [-inf]>} : f32[]
  %kt = transpose(%k) {perm=[0,2,1]} : f32[2,16,5]
  %s = matmul(%q, %kt) : f32[2,5,5]
  %s2 = select(%keep, %s, %fill) : f32[2,5,5]
  %mx = reduce_max(%s2) {axes=[2], keepdims=true} : f32[2,5,1]
  %z = sub(%s2, %mx) : f32[2,5,5]
  %e = exp(%z) : f32[2,5,5]
  %sum = reduce_sum(%e) {axes=[2], keepdims=true} : f32[2,5,1]
  %p = div(%e, %sum) : f32[2,5,5]
  %o = matmul(%p, %v) : f32[2,5,16]
}
""")
    rng = np.random.default_rng(0)
    ins = [rng.standard_normal((2, 5, 16)).astype(np.float32) for _ in range(3)]
    keep = np.tril(np.ones((5, 5), bool))
    want, = CpuStep(compile_graph(parse_graph(str(g)))).run(ins + [keep])
    assert fuse_attention(g)
    g.remove_dead()
    assert "attention" in _ops(g) and "exp" not in _ops(g)
    got, = CpuStep(compile_graph(g)).run(ins + [keep])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)




def _einsum_form(rows: int = 7) -> str:
    """aten's einsum attention (torchvision's MaxViT): the products and the bias on 3-d
    batches, the softmax on the model's (1, 2, 3, T, T) (rows = 7) between reshapes; with
    rows = 49 the softmax runs over another grouping of the scores."""
    t = 7
    cols = t * t // rows
    five = f"1,2,3,{rows},{cols}"
    return f"""
graph attn(%q: f32[6,7,16], %k: f32[6,7,16], %v: f32[6,7,16], %bias: f32[6,7,7]) -> (%o) {{
  %kt = transpose(%k) {{perm=[0,2,1]}} : f32[6,16,7]
  %s3 = matmul(%q, %kt) : f32[6,7,7]
  %sb = add(%s3, %bias) : f32[6,7,7]
  %s = reshape(%sb) {{shape=[{five}]}} : f32[{five}]
  %mx = reduce_max(%s) {{axes=[4], keepdims=true}} : f32[1,2,3,{rows},1]
  %z = sub(%s, %mx) : f32[{five}]
  %e = exp(%z) : f32[{five}]
  %sum = reduce_sum(%e) {{axes=[4], keepdims=true}} : f32[1,2,3,{rows},1]
  %p5 = div(%e, %sum) : f32[{five}]
  %p = reshape(%p5) {{shape=[6,7,7]}} : f32[6,7,7]
  %o = matmul(%p, %v) : f32[6,7,16]
}}
"""


def test_softmax_between_batch_reshapes_is_recognized():
    """A softmax between reshapes that only regroup batch dims is the same softmax of the
    same rows: one attention node, the same numbers. Reshapes that regroup the rows
    themselves (a softmax over 49 rows of 1) keep it decomposed."""
    text = _einsum_form()
    g = parse_graph(text)
    rng = np.random.default_rng(0)
    ins = [rng.standard_normal((6, 7, 16)).astype(np.float32) for _ in range(3)]
    ins.append(rng.standard_normal((6, 7, 7)).astype(np.float32))
    want, = CpuStep(compile_graph(parse_graph(text))).run(ins)
    assert fuse_attention(g)
    g.remove_dead()
    assert _ops(g).count("attention") == 1 and "exp" not in _ops(g)
    got, = CpuStep(compile_graph(g)).run(ins)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert not fuse_attention(parse_graph(_einsum_form(rows=49)))



def test_values_times_transposed_weights_is_recognized():
    """O^T = X P^T (a diffusion UNet's attention over pixels, V @ A^T) is the attention
    of V = X^T, transposed: one attention node, the same numbers. P^T read elsewhere too
    keeps it decomposed."""
    def graph(extra_out: bool) -> str:
        outs = "%o, %pt" if extra_out else "%o"
        return f"""
graph a(%q: f32[2,40,16], %kt: f32[2,16,40], %x: f32[2,24,40]) -> ({outs}) {{
  %c = const() {{value=dense<f32[]: [0.25]>}} : f32[]
  %s0 = matmul(%q, %kt) : f32[2,40,40]
  %s = mul(%s0, %c) : f32[2,40,40]
  %mx = reduce_max(%s) {{axes=[2], keepdims=true}} : f32[2,40,1]
  %z = sub(%s, %mx) : f32[2,40,40]
  %e = exp(%z) : f32[2,40,40]
  %sum = reduce_sum(%e) {{axes=[2], keepdims=true}} : f32[2,40,1]
  %p = div(%e, %sum) : f32[2,40,40]
  %pt = transpose(%p) {{perm=[0,2,1]}} : f32[2,40,40]
  %o = matmul(%x, %pt) : f32[2,24,40]
}}
"""
    rng = np.random.default_rng(0)
    ins = [rng.standard_normal(shape).astype(np.float32)
           for shape in ((2, 40, 16), (2, 16, 40), (2, 24, 40))]
    g = parse_graph(graph(False))
    want, = CpuStep(compile_graph(parse_graph(graph(False)))).run(ins)
    assert fuse_attention(g)
    g.remove_dead()
    assert _ops(g).count("attention") == 1 and "exp" not in _ops(g)
    got, = CpuStep(compile_graph(g)).run(ins)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    q, kt, x = (a.astype(np.float64) for a in ins)
    sc = q @ kt * 0.25
    pr = np.exp(sc - sc.max(-1, keepdims=True))
    pr /= pr.sum(-1, keepdims=True)
    np.testing.assert_allclose(got, x @ pr.transpose(0, 2, 1), rtol=1e-5, atol=1e-6)
    assert not fuse_attention(parse_graph(graph(True)))


def _attention_graph(b, h, t, d, causal, mask):
    x = _dims((b, h, t, d))
    m_in = f", %m: {mask}[{t},{t}]" if mask else ""
    if mask == "bool":
        body = (f"  %zero = const() {{value=dense<f32[]: [0.0]>}} : f32[]\n"
                f"  %ninf = const() {{value=dense<f32[]: [-inf]>}} : f32[]\n"
                f"  %am = select(%m, %zero, %ninf) : f32[{t},{t}]\n")
        args = ", %am"
    else:
        body, args = "", ", %m" if mask else ""
    return parse_graph(f"""
graph a(%q: f32[{x}], %k: f32[{x}], %v: f32[{x}]{m_in}) -> (%o) {{
{body}  %o = attention(%q, %k, %v{args}) {{scale={float(1 / np.sqrt(d))!r}, causal={str(causal).lower()}}} : f32[{x}]
}}
""")


def _cases():
    """Every mask kind at head dim 64; causal or not at 32 and 80; length 300 is slow."""
    out = []
    for d in (32, 64, 80):
        kinds = [(False, None), (True, None)] + ([(False, "f32"), (False, "bool"),
                                                  (True, "f32")] if d == 64 else [])
        for t in (1, 7, 128, 300):
            marks = [pytest.mark.slow] if t == 300 else []
            out += [pytest.param(d, t, c, m, marks=marks) for c, m in kinds]
    return out


@pytest.mark.parametrize("d,t,causal,mask", _cases())
def test_kernel_matches_torch_sdpa(d, t, causal, mask):
    _check_against_sdpa(d, t, causal, mask)


@pytest.mark.parametrize("d,t,causal,mask", [
    (256, 40, False, None), (256, 70, False, "bool"),  # two passes: any value depth
    (192, 70, True, None), (256, 40, True, "bool"),    # online, the output row spilled
    (64, 40, True, "bool")])
def test_value_depth_past_max_dv_matches_torch_sdpa(d, t, causal, mask):
    """Value depths past MAX_DV (a diffusion UNet's 256 channels) are fused up to
    WHOLE_ROW_MAX_KEYS keys; past that they stay decomposed."""
    from compiler.kernels import attention

    _check_against_sdpa(d, t, causal, mask)
    q = _attention_graph(1, 1, t, d, False, None).inputs[0]
    assert attention.refusal_for(q, q.shape, attention.WHOLE_ROW_MAX_KEYS) is None
    past = attention.refusal_for(q, q.shape, attention.WHOLE_ROW_MAX_KEYS + 1)
    assert (past is not None and "MAX_DV" in past) == (d > attention.MAX_DV)


@pytest.mark.parametrize("mask", [None, "f32"])
def test_long_rows_take_two_passes_with_heap_score_rows(mask):
    """Past STACK_SCORE_BYTES of score rows (here 520 keys) and up to WHOLE_ROW_MAX_KEYS,
    the two-pass softmax keeps its score rows in the thread's heap scratch; the same
    numbers as torch's SDPA."""
    from compiler.kernels import attention
    from compiler.kernels.gemm import Tile
    from compiler.target import host

    t = 520
    shape = attention.AttentionShape((1, 2), t, t, 64, 64, 0.125, False, False, Tile.of(host()))
    assert shape.whole_rows and shape.heap_scores
    _check_against_sdpa(64, t, False, mask)


@pytest.mark.parametrize("d,t,causal,mask", [
    (64, 40, False, None), (64, 40, True, "f32"), (80, 50, False, "f32"),
    (80, 50, True, None), (64, 197, False, None), (32, 197, True, "f32"),
    (32, 197, False, "bool")])
def test_partial_last_key_tile(d, t, causal, mask):
    """Lengths past a whole number of key tiles (32 keys on AVX-512): the last tile runs
    narrower (<= 16 keys: one vector) and its P x V product shorter; value depth 80 fills
    two and a half panels of V."""
    _check_against_sdpa(d, t, causal, mask)


def test_scores_and_values_run_on_the_micro_kernel_without_spills():
    """Per key tile both products (Q K^T, then P V per V panel and row group) are the
    GEMM micro-kernel's K loop, none of them spilling on the host's AVX-512 or on AVX2."""
    from compiler import target as targets
    from compiler.codegen import asm, llvm_cpu
    from compiler.kernels import gemm

    for spec in ("cpu", "cpu:x86-64-v3"):
        cg = compile_graph(_attention_graph(1, 2, 197, 64, False, "f32"), target=spec)
        loops = asm.loop_spills(llvm_cpu.emit_assembly(cg.llvm_ir, targets.parse(spec)),
                                gemm.K_LOOP)
        # per block height (two: 197 rows are not a whole number of blocks): Q K^T on the
        # full and on the partial key tile (4 loops), and P V on the 2 panels of V of the
        # full key tile (4 loops at least; the partial tile's 5-step ones may be unrolled)
        assert len(loops) >= 8, (spec, loops)
        assert {name: s for name, (_, s) in loops.items() if s} == {}, spec


def _check_against_sdpa(d, t, causal, mask):
    rng = np.random.default_rng(t * d)
    b, h = 1, 2
    q, k, v = (rng.standard_normal((b, h, t, d)).astype(np.float32) for _ in range(3))
    ins = [q, k, v]
    tm = None
    if mask == "f32":
        ins.append(rng.standard_normal((t, t)).astype(np.float32))
        tm = torch.from_numpy(ins[-1])
    elif mask == "bool":
        keep = rng.random((t, t)) < 0.7
        keep[:, 0] = True  # no fully masked row (torch gives NaN there, as braze does)
        ins.append(keep)
        tm = torch.from_numpy(keep)
    y, = CpuStep(compile_graph(_attention_graph(b, h, t, d, causal, mask))).run(ins)
    if causal and tm is not None:  # torch takes a mask or is_causal, not both
        additive = torch.where(tm, 0.0, -np.inf) if tm.dtype == torch.bool else tm
        tm = additive.double().masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(),
                                           -np.inf)
    elif tm is not None and tm.dtype != torch.bool:
        tm = tm.double()
    want = torch.nn.functional.scaled_dot_product_attention(
        *(torch.from_numpy(a).double() for a in (q, k, v)), attn_mask=tm,
        is_causal=causal and tm is None).numpy()
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=2e-6)


def test_no_score_buffer_and_one_kernel():
    t = 300
    cg = compile_graph(_attention_graph(1, 2, t, 64, True, None))
    assert [k.contraction.op for k in cg.kernels] == ["attention"]
    assert all(t * t > 0 and (len(v.shape) < 2 or v.shape[-2:] != (t, t))
               for v in cg.plan.materialized)
    assert cg.arena_bytes < 4 * t * t  # not even one head's scores


def test_two_threads_match_one():
    rng = np.random.default_rng(5)
    ins = [rng.standard_normal((1, 3, 70, 64)).astype(np.float32) for _ in range(3)]
    g = _attention_graph(1, 3, 70, 64, True, None)
    one, = CpuStep(compile_graph(g), threads=1).run(ins)
    two, = CpuStep(compile_graph(g), threads=2).run(ins)
    np.testing.assert_array_equal(one, two)


def test_constant_causal_mask_becomes_the_causal_flag():
    t = 7
    g = _decomposed(1, 2, t, 32, mask=True)
    causal = np.where(np.tril(np.ones((t, t), bool)), 0.0, -np.inf).astype(np.float32)
    m = next(v for v in g.inputs if v.name == "m")
    c = g.add_node("const", [], {"value": causal}, out_names=["causal"], index=0).output
    g.replace_all_uses(m, c)
    g.inputs.remove(m)
    rng = np.random.default_rng(3)
    ins = [rng.standard_normal((1, 2, t, 32)).astype(np.float32) for _ in range(3)]
    want, = CpuStep(compile_graph(parse_graph(str(g), {"causal": causal}))).run(ins)
    run_passes(g, verify_each=True)
    assert _ops(g) == ["attention"]
    assert g.nodes[-1].attrs["causal"] and len(g.nodes[-1].inputs) == 3
    got, = CpuStep(compile_graph(g)).run(ins)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)


def test_causal_mask_computed_from_constants_becomes_the_causal_flag():
    """A mask the exporter computes from constants (left unfolded when it outgrows them)
    is evaluated to see that it is the causal one."""
    t = 6
    g = _decomposed(1, 2, t, 32, mask=True)
    m = next(v for v in g.inputs if v.name == "m")
    keep = g.add_node("const", [], {"value": np.tril(np.ones((t, t), bool))}, index=0).output
    zero = g.add_node("const", [], {"value": np.array(0.0, np.float32)}, index=0).output
    ninf = g.add_node("const", [], {"value": np.array(-np.inf, np.float32)}, index=0).output
    sel = g.add_node("select", [keep, zero, ninf], index=3).output
    g.replace_all_uses(m, sel)
    g.inputs.remove(m)
    assert fuse_attention(g)
    node = next(n for n in g.nodes if n.op == "attention")
    assert node.attrs["causal"] and len(node.inputs) == 3


def _window_attention_graph(windows: int, heads: int, t: int, d: int):
    """Swin's window attention after the passes: the QKV product's rows split into heads
    (reshape, transpose, a gather per q/k/v), a mask that is a per-head bias plus a
    per-window mask (kept as their sum: too large to fold)."""
    c = 3 * heads * d
    return parse_graph(f"""
graph w(%qkv: f32[{windows},{t},{c}], %bias: f32[1,{heads},{t},{t}], %win: f32[{windows},1,{t},{t}]) -> (%o) {{
  %r = reshape(%qkv) {{shape=[{windows}, {t}, 3, {heads}, {d}]}} : f32[{windows},{t},3,{heads},{d}]
  %p = transpose(%r) {{perm=[2, 0, 3, 1, 4]}} : f32[3,{windows},{heads},{t},{d}]
  %i0 = const() {{value=dense<i64[]: [0]>}} : i64[]
  %i1 = const() {{value=dense<i64[]: [1]>}} : i64[]
  %i2 = const() {{value=dense<i64[]: [2]>}} : i64[]
  %q = gather(%p, %i0) {{axis=0}} : f32[{windows},{heads},{t},{d}]
  %k = gather(%p, %i1) {{axis=0}} : f32[{windows},{heads},{t},{d}]
  %v = gather(%p, %i2) {{axis=0}} : f32[{windows},{heads},{t},{d}]
  %m = add(%win, %bias) : f32[{windows},{heads},{t},{t}]
  %o = attention(%q, %k, %v, %m) {{scale={float(1 / np.sqrt(d))!r}, causal=false}} : f32[{windows},{heads},{t},{d}]
}}
""")


def test_window_attention_reads_rows_as_vectors():
    """q's and v's rows behind the head split, and a mask made of two broadcast buffers,
    are read a vector at a time (row_vectors.py); K, packed transposed, is not asked."""
    from compiler.codegen import row_vectors

    g = _window_attention_graph(4, 3, 49, 32)
    bufs = {v: None for v in g.inputs}
    q, k, v, m = g.nodes[-1].inputs
    assert [row_vectors.refusal(x, bufs) for x in (q, v, m)] == [None] * 3
    moved = parse_graph("""
graph t(%x: f32[2,8,4]) -> (%y) {
  %y = transpose(%x) {perm=[0, 2, 1]} : f32[2,4,8]
}
""")
    assert "last axis" in row_vectors.refusal(moved.outputs[0], {moved.inputs[0]: None})
    strided = parse_graph("""
graph s(%x: f32[2,8]) -> (%y) {
  %y = slice(%x) {starts=[0, 0], sizes=[2, 4], steps=[1, 2]} : f32[2,4]
}
""")
    assert "strided" in row_vectors.refusal(strided.outputs[0], {strided.inputs[0]: None})


@pytest.mark.parametrize("t,d", [(49, 32), (20, 24)])
def test_window_attention_matches_reference(t, d):
    """The two-pass softmax (S <= WHOLE_ROW_MAX_KEYS) with vector reads of q, v and the
    mask against float64: 49 keys are a full and a partial tile of 32 (AVX-512), head dim
    24 leaves a vector's remainder to the scalar reads, 20 keys one partial tile."""
    from compiler.kernels import attention

    windows, heads = 4, 3
    g = _window_attention_graph(windows, heads, t, d)
    cg = compile_graph(g)
    k = cg.kernels[-1]  # after the mask's sum (an operand read many times: a buffer)
    assert k.contraction.op == "attention" and "two-pass softmax" in k.impl.reason
    assert attention.AttentionShape.of(g.nodes[-1], k.impl.tile).whole_rows
    rng = np.random.default_rng(t + d)
    qkv = rng.standard_normal((windows, t, 3 * heads * d)).astype(np.float32)
    bias = rng.standard_normal((1, heads, t, t)).astype(np.float32)
    win = np.where(rng.random((windows, 1, t, t)) < 0.2, -100.0, 0.0).astype(np.float32)
    y, = CpuStep(compile_graph(g), threads=2).run([qkv, bias, win])
    x = torch.from_numpy(qkv).double().reshape(windows, t, 3, heads, d).permute(2, 0, 3, 1, 4)
    want = torch.nn.functional.scaled_dot_product_attention(
        x[0], x[1], x[2], attn_mask=torch.from_numpy(bias + win).double()).numpy()
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=2e-6)
