"""The packed float32 GEMM (compiler/kernels/gemm.py): which matmuls take it, packing,
and its numbers against numpy at float64 for tile-aligned and ragged shapes."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.codegen import compile_graph
from compiler.codegen.compiled import PACKED
from compiler.kernels import gemm
from compiler.target import host
from compiler.target import parse as parse_target
from compiler.text import parse_graph
from runtime.cpu import CpuStep

TILE = gemm.Tile.of(host())  # the register tile compile_graph uses on this machine


def _matmul(a_shape, w_shape, w: np.ndarray | None = None):
    out = a_shape[:-1] + (w_shape[-1],)
    dims = lambda s: ",".join(map(str, s))  # noqa: E731
    w_line = (f"  %w = const() {{value=@w}} : f32[{dims(w_shape)}]" if w is not None else "")
    w_arg = "" if w is not None else f", %w: f32[{dims(w_shape)}]"
    text = f"""
graph mm(%a: f32[{dims(a_shape)}]{w_arg}) -> (%y) {{
{w_line}
  %y = matmul(%a, %w) : f32[{dims(out)}]
}}
"""
    return parse_graph(text, {"w": w} if w is not None else None)


def test_pack_b_panels_are_contiguous_and_zero_padded():
    w = np.arange(3 * 40, dtype=np.float32).reshape(3, 40)
    tile = gemm.Tile(vec=16, nv=2, mr=12)  # NR = 32
    p = gemm.pack_b(w, tile)
    assert p.shape == (2, 3, tile.nr) and p.flags.c_contiguous
    np.testing.assert_array_equal(p[0], w[:, :tile.nr])
    np.testing.assert_array_equal(p[1, :, :40 - tile.nr], w[:, tile.nr:])
    assert not p[1, :, 40 - tile.nr:].any()


def test_constant_weight_takes_the_packed_gemm_and_only_the_packed_copy_is_kept():
    w = np.ones((8, 16), np.float32)
    cg = CpuStep(compile_graph(_matmul((4, 8), (8, 16), w)))
    assert [k.kind for k in cg.kernels] == ["contraction"]
    assert any(isinstance(s, tuple) and s[0] == PACKED for s in cg.slots)
    assert not any(getattr(s, "name", None) == "w" for s in cg.slots)  # no unpacked copy
    assert "llvm.fma.v16f32" in cg.llvm_ir


def test_constants_start_on_cache_lines():
    """Packed weights and small unpacked constants start on a cache line (numpy gives 16
    bytes), whatever the array compile started from; the kernels read the same numbers."""
    from compiler.codegen import memory

    rng = np.random.default_rng(3)
    w = rng.standard_normal((64, 48)).astype(np.float32)
    bias = rng.standard_normal(48).astype(np.float32)
    raw = np.empty(w.nbytes + 64, np.uint8)  # w at 16 bytes past a line: misaligned
    start = (-raw.ctypes.data % 64) + 16
    w16 = raw[start:start + w.nbytes].view(np.float32).reshape(w.shape)
    w16[...] = w
    g = parse_graph("""
graph mm(%a: f32[5,64]) -> (%y) {
  %w = const() {value=@w} : f32[64,48]
  %b = const() {value=@b} : f32[1,48]
  %m = matmul(%a, %w) : f32[5,48]
  %y = add(%m, %b) : f32[5,48]
}
""", {"w": w16, "b": bias[None]})
    program = compile_graph(g)
    assert program.memory.constants
    assert all(a.ctypes.data % memory.ALIGN == 0 for _, a in program.memory.constants)
    a = rng.standard_normal((5, 64)).astype(np.float32)
    y, = CpuStep(program).run([a])
    np.testing.assert_allclose(y, a @ w + bias, rtol=1e-5, atol=1e-5)
    big = np.empty(memory.REALIGN_MAX_UNPACKED_BYTES // 4 + 4, np.float32)[1:]
    assert big.ctypes.data % 64 and not memory._realign("unpacked", big)  # kept, not copied
    assert memory._realign((PACKED, None), big)


def test_refusals_name_the_reason():
    g = _matmul((4, 8), (8, 16))  # weight is an input: nothing to pack
    node = next(n for n in g.nodes if n.op == "matmul")
    assert "not a constant" in gemm.refusal(node)
    # the run-time-packed GEMM (kernels/batched.py, tests/compiler/test_batched.py) takes it
    assert compile_graph(g).slots and not any(
        isinstance(s, tuple) and s[0] == PACKED for s in compile_graph(g).slots)


@pytest.mark.parametrize("a_shape,n", [
    ((32, 768), 768),  # the MLP benchmark's Linear: whole tiles
    ((5, 7), 9),  # smaller than one tile both ways
    ((13, 33), 50),  # a row tail (13 % 12) and a column tail (50 % 32)
    ((25, 64), 100),
    ((1, 1), 1),
    ((2, 3, 17), 40),  # batch dims fold into the rows
    ((30, 1024), 64),  # rows 4 KiB apart: copied to a padded scratch (a row tail too)
])
@pytest.mark.parametrize("spec", ["cpu", "cpu:x86-64-v3"])
def test_numbers_match_numpy(a_shape, n, spec):
    """On the host's tile and on AVX2's 6 x 16 (uneven row blocks: M = 32 is 6, 6, 5, 5,
    5, 5 there), two threads."""
    rng = np.random.default_rng(0)
    k = a_shape[-1]
    w = rng.standard_normal((k, n)).astype(np.float32)
    a = rng.standard_normal(a_shape).astype(np.float32)
    y, = CpuStep(compile_graph(_matmul(a_shape, (k, n), w), target=spec), threads=2).run([a])
    want = a.astype(np.float64) @ w
    # float32 products summed over k: error grows like sqrt(k) ulps of the row's scale
    scale = np.sqrt(k) * np.abs(a).max() * np.abs(w).max()
    np.testing.assert_allclose(y, want, rtol=0, atol=4e-7 * scale)


def test_two_threads_match_one():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((96, 200)).astype(np.float32)
    a = rng.standard_normal((70, 96)).astype(np.float32)
    cg = CpuStep(compile_graph(_matmul((70, 96), (96, 200), w)), threads=1)
    one, = cg.run([a])
    cg.set_threads(2)
    two, = cg.run([a])
    np.testing.assert_array_equal(one, two)


def test_row_blocks_are_as_even_as_can_be():
    """(tallest rows, blocks, blocks that tall): the rest are one row shorter, so no
    block is left with a lone row or two (half the FMA rate: too few accumulators)."""
    assert gemm.row_split(32, 6) == (6, 6, 2)  # 6, 6, 5, 5, 5, 5
    assert gemm.row_split(49, 12) == (10, 5, 4)  # 10, 10, 10, 10, 9
    assert gemm.row_split(48, 12) == (12, 4, 4) and gemm.row_split(1, 6) == (1, 1, 1)
    for m in range(1, 80):
        for mr in (2, 6, 12):
            rows, blocks, big = gemm.row_split(m, mr)
            assert rows <= mr and 1 <= big <= blocks
            assert big * rows + (blocks - big) * (rows - 1) == m


def test_taller_row_blocks_are_spread_evenly():
    """block_start: the row_split blocks in order cover M, and the taller ones are spread
    among the others, so the first half of the blocks holds about half of the rows."""
    starts = [gemm.block_start(49, 6, rb) for rb in range(10)]
    assert [b - a for a, b in zip(starts, starts[1:])] == [5, 5, 6, 5, 6, 5, 6, 5, 6]
    for m in range(1, 120):
        for mr in (2, 6, 12):
            rows, blocks, _ = gemm.row_split(m, mr)
            sizes = [gemm.block_start(m, mr, rb + 1) - gemm.block_start(m, mr, rb)
                     for rb in range(blocks)]
            assert sum(sizes) == m and set(sizes) <= {rows, rows - 1}
            half = gemm.block_start(m, mr, blocks // 2)
            assert abs(half - m * (blocks // 2) / blocks) <= 1


def test_tile_rows_use_the_fewest_blocks_then_the_shortest():
    assert gemm.tile_rows(49, 12) == 10  # 5 blocks of 10 (the last 9), not 4 of 12 and 1
    assert gemm.tile_rows(3136, 12) == 12 and gemm.tile_rows(32, 12) == 11
    assert gemm.tile_rows(5, 12) == 5 and gemm.tile_rows(13, 6) == 5


# x86-64-v4: AVX-512's 12-row tile, on the default 32 KiB (8-way) L1D of a named CPU
V4 = "cpu:x86-64-v4"


def test_rows_4k_apart_are_copied_once_per_row_block():
    """K = 1024 floats: A's rows alias in L1, and AVX-512's 12 rows outnumber an 8-way
    L1's ways, so tiles read a padded copy, made in an alloca of MR rows of K + ROW_PAD,
    and the tiles go row-block-major. On a 12-way L1 (48 KiB) the 12 rows fit, and they
    are read in place; so are AVX2's 6 rows anywhere."""
    import dataclasses

    assert gemm.aliasing(1024 * 4) and gemm.aliasing(2048 * 4) and not gemm.aliasing(512 * 4)
    t8 = gemm.Tile(vec=16, nv=2, mr=12, l1d_bytes=32 << 10)
    assert gemm.l1_ways(t8) == 8 and gemm.copies_rows(t8, 1024 * 4, 1024)
    assert not gemm.copies_rows(dataclasses.replace(t8, l1d_bytes=48 << 10), 1024 * 4, 1024)
    assert not gemm.copies_rows(gemm.Tile(vec=8, nv=2, mr=6), 1024 * 4, 1024)
    w = np.ones((1024, 64), np.float32)
    ir_text = compile_graph(_matmul((24, 1024), (1024, 64), w), target=V4).llvm_ir
    assert f"alloca float, i64 {t8.mr * (1024 + gemm.ROW_PAD)}" in ir_text
    ir_text = compile_graph(_matmul((24, 512), (512, 64), w[:512]), target=V4).llvm_ir
    assert f"alloca float, i64 {t8.mr * (512 + gemm.ROW_PAD)}" not in ir_text
    wide = CpuStep(compile_graph(_matmul((24, 1024), (1024, 64), w),
                                 target=dataclasses.replace(parse_target(V4),
                                                            l1d_bytes=48 << 10)))
    assert "alloca float" not in wide.llvm_ir
    a = np.random.default_rng(6).standard_normal((24, 1024)).astype(np.float32)
    np.testing.assert_allclose(wide.run([a])[0], a @ w, rtol=1e-5, atol=1e-4)


def test_copied_rows_of_a_weight_past_l2_walk_panel_groups(monkeypatch):
    """Copied rows (K = 1024) go row-block-major only where the weight fits L2; a larger
    one walks groups of panels filling half of L2, so it is read from memory once, not
    once per row block (ResNet-50's 1x1 convs from 1024 or 2048 channels at 7 x 7). The
    copy, keyed by the row block, is then made once per row block and group: a small L2
    forces groups of 2 panels over 5 on AVX-512 (the last group ragged), 2 threads, and the
    product is numpy's."""
    import dataclasses

    big = dataclasses.replace(TILE, l2_bytes=2 << 20, l1d_bytes=32 << 10)
    assert gemm.tile_order(big, 1024, 256, 49, 49 * 1024 * 4, True) == (True, 1)  # 1 MiB
    assert gemm.tile_order(big, 2048, 512, 49, 49 * 2048 * 4, True) == (False, 4)  # 4 MiB
    assert gemm.tile_order(big, 2048, 512, 49, 49 * 2048 * 4, False) == (False, 1)
    assert gemm.tile_order(big, 16, 64, 36, 36 * 16 * 4, True) == (True, 1)
    of = gemm.Tile.of
    small = classmethod(lambda cls, t: dataclasses.replace(of(t), l2_bytes=560 << 10,
                                                           l1d_bytes=32 << 10))
    monkeypatch.setattr(gemm.Tile, "of", small)
    m, k, n = 30, 1024, 150
    tile = gemm.Tile.of(host())
    assert gemm.copies_rows(tile, k * 4, k)
    group = (280 << 10) // (k * tile.nr * 4)  # 2 on 32-column panels, 4 on 16
    assert gemm.tile_order(tile, k, n, m, m * k * 4, True) == (False, group) and group > 1
    rng = np.random.default_rng(4)
    w = rng.standard_normal((k, n)).astype(np.float32)
    a = rng.standard_normal((m, k)).astype(np.float32)
    cg = CpuStep(compile_graph(_matmul((m, k), (k, n), w)), threads=2)
    assert f"alloca float, i64 {tile.mr * (k + gemm.ROW_PAD)}" in cg.llvm_ir
    y, = cg.run([a])
    scale = np.sqrt(k) * np.abs(a).max() * np.abs(w).max()
    np.testing.assert_allclose(y, a.astype(np.float64) @ w, rtol=0, atol=4e-7 * scale)


def test_panel_major_tiles_spread_the_next_panels_prefetch_over_their_row_blocks():
    """M = 49 in 5 row blocks over a 768 x 3072 weight (panel-major, one panel at a
    time): each row block asks for a fifth of the next panel into L2 (prefetch locality
    2, ceil(NR / 5) floats on each K step, no division in the K loop); over the 5 blocks
    every line of the next panel is asked for, and past it no more than the shares
    overlap; and the product is numpy's."""
    m, k, n = 49, 768, 3072
    assert not gemm.row_major(TILE, k, n, m) and not gemm.copies_rows(TILE, k * 4, k)
    blocks = -(-m // gemm.tile_rows(m, TILE.mr))
    rng = np.random.default_rng(5)
    w = rng.standard_normal((k, n)).astype(np.float32)
    a = rng.standard_normal((m, k)).astype(np.float32)
    cg = CpuStep(compile_graph(_matmul((m, k), (k, n), w)), threads=2)
    assert ", i32 0, i32 2, i32 1)" in cg.llvm_ir
    # spread's address for K row j of part rb: target * size + rb * share + j * step
    nr, panel = TILE.nr, 3
    size, share, step = gemm.spread_terms(k, nr, blocks)
    assert step * blocks >= nr and share * blocks <= size
    asked = set()
    for rb in range(blocks):
        for j in range(k):
            at = (panel + 1) * size + rb * share + j * step
            asked.update((at + off) // 16 for off in range(0, step, 16))
    lines = set(range((panel + 1) * size // 16, (panel + 2) * size // 16))
    over = k * (step * blocks - nr) // 16 + 1  # the shares' overlap, in lines
    assert lines <= asked and max(asked) < (panel + 2) * size // 16 + over
    y, = cg.run([a])
    scale = np.sqrt(k) * np.abs(a).max() * np.abs(w).max()
    np.testing.assert_allclose(y, a.astype(np.float64) @ w, rtol=0, atol=4e-7 * scale)


def test_rows_too_long_for_a_stack_copy_are_read_in_place():
    """K = 2^18 floats aliases in L1 too, but MR rows of it are 12 MiB: the copy, on the
    thread's stack, overflowed it (SIGSEGV). Rows past COPY_SCRATCH_BYTES are read in
    place, and the product is still right."""
    k = 1 << 18
    t8 = gemm.Tile(vec=16, nv=2, mr=12, l1d_bytes=32 << 10)
    assert gemm.copies_rows(t8, 4096 * 4, 4096) and not gemm.copies_rows(t8, k * 4, k)
    rng = np.random.default_rng(2)
    w = rng.standard_normal((k, 16)).astype(np.float32)
    a = rng.standard_normal((12, k)).astype(np.float32)
    cg = CpuStep(compile_graph(_matmul((12, k), (k, 16), w)), threads=2)
    assert "alloca float" not in cg.llvm_ir
    y, = cg.run([a])
    # a float32 running sum of k unit-scale products: each of k roundings is ~eps * sqrt(k)
    # (the partial sum's scale), and they random-walk to ~eps * k (measured: 0.023)
    np.testing.assert_allclose(y, a.astype(np.float64) @ w, rtol=0, atol=2 * 6e-8 * k)


def test_an_empty_batch_has_no_work_items():
    """M = 0 (an empty batch): no row blocks, no tiles, an empty kernel function (tile_rows
    divided by zero), and an empty result."""
    assert gemm.tile_rows(0, TILE.mr) == 1 and gemm.GemmShape(0, 8, 40, TILE).items == 0
    cg = CpuStep(compile_graph(_matmul((0, 8), (8, 40), np.ones((8, 40), np.float32))))
    assert "gemm.loop" not in cg.llvm_ir
    y, = cg.run([np.zeros((0, 8), np.float32)])
    assert y.shape == (0, 40)


def test_an_empty_contraction_is_zeros_without_the_gemm():
    """K = 0: the result is zeros (the packed GEMM ran its K loop once on an empty panel:
    NaN); the kernel is a loop storing the epilogue of zero, here zero itself."""
    cg = CpuStep(compile_graph(_matmul((5, 0), (0, 40), np.zeros((0, 40), np.float32))))
    assert "gemm.loop" not in cg.llvm_ir and cg.kernels[0].contraction is not None
    y, = cg.run([np.zeros((5, 0), np.float32)])
    np.testing.assert_array_equal(y, np.zeros((5, 40), np.float32))


def test_panel_groups_are_sized_from_l2_and_match_numpy(monkeypatch):
    """Where A outgrows L2, a panel-major product walks groups of panels (half of L2) per
    row block: ResNet-50's batch-8 3x3 stride-2 conv on AVX2 takes groups of 3 panels, none
    where A fits L2 or tiles go by rows. A small L2 forces groups of 3 over 22 panels (the
    last group a single ragged panel) on AVX2's 6 x 16 tile, two threads."""
    import dataclasses

    from compiler import target as targets

    avx2 = gemm.Tile.of(targets.parse("cpu:x86-64-v3"))
    assert gemm.panel_group(avx2, 2304, 256, 8 * 28 * 28 * 256 * 4, False) == 3
    assert gemm.panel_group(avx2, 2304, 256, 1 << 19, False) == 1
    assert gemm.panel_group(avx2, 2304, 256, 8 << 20, True) == 1
    of = gemm.Tile.of
    small = classmethod(lambda cls, t: dataclasses.replace(of(t), l2_bytes=96 << 10))
    monkeypatch.setattr(gemm.Tile, "of", small)
    m, k, n = 100, 256, 347
    tile = gemm.Tile.of(targets.parse("cpu:x86-64-v3"))
    assert not gemm.row_major(tile, k, n, m)
    assert gemm.panel_group(tile, k, n, m * k * 4, False) == 3 and -(-n // tile.nr) == 22
    rng = np.random.default_rng(2)
    w = rng.standard_normal((k, n)).astype(np.float32)
    a = rng.standard_normal((m, k)).astype(np.float32)
    y, = CpuStep(compile_graph(_matmul((m, k), (k, n), w), target="cpu:x86-64-v3"),
                 threads=2).run([a])
    want = a.astype(np.float64) @ w
    scale = np.sqrt(k) * np.abs(a).max() * np.abs(w).max()
    np.testing.assert_allclose(y, want, rtol=0, atol=4e-7 * scale)


@pytest.mark.parametrize("n,nv", [(104, 1), (208, 1), (48, 1), (40, 1), (440, None), (96, None),
                                  (8, 1), (16, 1)])
def test_the_last_panel_runs_a_narrowed_tile(n, nv):
    """On 32-column panels (16 lanes) a last panel holding up to 16 columns runs a tile of
    one vector per row, reading the panel at its packed width; a full or 3/4 one does not."""
    tile = gemm.Tile(vec=16, nv=2, mr=12)
    narrow = tile.narrowed(n)
    assert (narrow.nv if narrow else None) == nv
    if narrow:
        assert narrow.panel == tile.nr and narrow.mr == tile.mr


@pytest.mark.parametrize("k,n", [(104, 104), (48, 40), (33, 208)])
@pytest.mark.parametrize("spec", ["cpu", "cpu:x86-64-v3"])
def test_narrowed_last_panel_matches_numpy(k, n, spec):
    """Products whose last panel runs the narrowed tile (N % NR <= NR / 2 on AVX-512; on
    AVX2's 16-column panels N = 40 and 104 end in 8 columns: one vector of 8), with a
    ReLU epilogue on the registers or in place after the store."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((k, n)).astype(np.float32)
    a = rng.standard_normal((29, k)).astype(np.float32)
    g = parse_graph(f"""
graph mm(%a: f32[29,{k}]) -> (%y) {{
  %w = const() {{value=@w}} : f32[{k},{n}]
  %zero = const() {{value=dense<f32[]: [0.0]>}} : f32[]
  %m = matmul(%a, %w) : f32[29,{n}]
  %y = max(%m, %zero) : f32[29,{n}]
}}
""", {"w": w})
    cg = compile_graph(g, target=spec)
    y, = CpuStep(cg, threads=2).run([a])
    want = np.maximum(a.astype(np.float64) @ w, 0)
    np.testing.assert_allclose(y, want, rtol=0, atol=4e-7 * np.sqrt(k) * 16)
