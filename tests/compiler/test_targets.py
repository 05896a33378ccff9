"""Kernels shaped by the target (compiler/target.py, gemm.Tile): parsing targets, register
tiles that fit, no spills in any kernel's inner loop on AVX-512, AVX2, SSE4.2 and AArch64
NEON, AVX2 and SSE4.2 builds running here and matching the host build and torch, and
AArch64 object code with NEON fmla in the GEMM's inner loop."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from compiler import target as targets
from compiler.codegen import asm, compile_graph, llvm_cpu
from compiler.codegen.compiled import cache_key
from compiler.errors import CompileError, TargetError
from compiler.kernels import gemm
from compiler.text import parse_graph
from runtime.cpu import CpuStep

# x86-64-v3: AVX2 and FMA, and only what every such CPU has (znver3 adds AMD's SSE4A,
# which Intel CPUs lack: its code need not run on an AVX2 machine)
AVX2, SSE42, NEON = "cpu:x86-64-v3", "cpu:x86-64-v2", "cpu:neoverse-n1"
X86_TARGETS = ["cpu", AVX2, SSE42]  # all run on this machine (x86-64 with AVX-512)
ALL_TARGETS = X86_TARGETS + [NEON]
pytestmark = pytest.mark.skipif(targets.host().arch != "x86_64" or
                                "avx512f" not in targets.host().isa,
                                reason="the cross-target checks assume an AVX-512 x86 host")


def test_targets_parse_to_their_vector_shape():
    want = {AVX2: (256, 16, True, "x86_64"), SSE42: (128, 16, False, "x86_64"),
            NEON: (128, 32, True, "aarch64"), "cpu:skylake-avx512": (512, 32, True, "x86_64"),
            "cpu:znver4,-avx512f": (256, 16, True, "x86_64")}
    for spec, shape in want.items():
        t = targets.parse(spec)
        assert (t.vector_bits, t.vector_registers, t.fma, t.arch) == shape, spec
    assert targets.parse("cpu") is targets.host()
    assert targets.parse(NEON).triple.startswith("aarch64")
    assert targets.parse(AVX2).requires == ("avx", "avx2", "fma", "sse4.2")
    assert targets.parse(AVX2).missing_here() == []
    assert "aarch64" in targets.parse(NEON).missing_here()[0]
    znver3 = targets.parse("cpu:znver3")
    assert (znver3.vector_bits, znver3.vector_registers, znver3.fma) == (256, 16, True)
    assert znver3.requires == ("avx", "avx2", "fma", "sse4.2", "sse4a")
    assert targets.parse("cpu:haswell").requires == ("avx", "avx2", "fma", "sse4.2")


def test_code_for_a_cpu_with_features_this_one_lacks_is_refused_not_run():
    """znver3's code may use AMD's SSE4A (LLVM lowers some byte shuffles to extrq and
    insertq: a znver3 ResNet-50 at batch 8 stopped on insertq, SIGILL, on an Intel Xeon).
    Where this machine lacks it, running that code is refused, naming the feature;
    where it has it, the code runs."""
    g = _gemm_graph()
    step = CpuStep(compile_graph(g, target="cpu:znver3"))
    a = np.ones((64, 256), np.float32)
    if "sse4a" in targets.host().requires:
        assert step.run([a])[0].shape == (64, 128)
        return
    assert step.missing == ["sse4a"]
    with pytest.raises(CompileError, match="sse4a"):
        step.run([a])


@pytest.mark.parametrize("spec,why", [("cpu:haswel", "no CPU 'haswel'"),
                                      ("cpu:znver3,+nosuchfeature", "nosuchfeature"),
                                      ("cpu:znver3,avx2,-fma", "must start with"),
                                      ("cpu:", "names no CPU"), ("gpu", "unknown target"),
                                      ("cpu:haswell@sparc-sun-solaris", "sparc")])
def test_bad_targets_say_why(spec, why):
    with pytest.raises(TargetError, match=why):
        targets.parse(spec)


@pytest.mark.parametrize("spec,tile", [("cpu", (16, 2, 12)), (AVX2, (8, 2, 6)),
                                       (SSE42, (4, 4, 2)), (NEON, (4, 4, 6))])
def test_register_tiles_fit_the_registers(spec, tile):
    t = targets.parse(spec)
    g = gemm.Tile.of(t)
    assert (g.vec, g.nv, g.mr) == tile and g.registers <= t.vector_registers
    assert g.fma == t.fma


def _gemm_graph(m=64, k=256, n=128, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    return parse_graph(f"""
graph mm(%a: f32[{m},{k}]) -> (%y) {{
  %w = const() {{value=@w}} : f32[{k},{n}]
  %b = const() {{value=@b}} : f32[{n}]
  %zero = const() {{value=dense<f32[]: [0.0]>}} : f32[]
  %c = matmul(%a, %w) : f32[{m},{n}]
  %d = add(%c, %b) : f32[{m},{n}]
  %y = max(%d, %zero) : f32[{m},{n}]
}}
""", {"w": w, "b": b})


def _conv_graph(x_shape, cout, k, stride, pad, seed=1):
    rng = np.random.default_rng(seed)
    n, h, wd, cin = x_shape
    w = rng.standard_normal((cout, cin, k, k)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    oh, ow = (h + 2 * pad - k) // stride + 1, (wd + 2 * pad - k) // stride + 1
    g = parse_graph(f"""
graph c(%x: f32[{n},{h},{wd},{cin}]) -> (%y) {{
  %w = const() {{value=@w}} : f32[{cout},{cin},{k},{k}]
  %b = const() {{value=@b}} : f32[{cout}]
  %zero = const() {{value=dense<f32[]: [0.0]>}} : f32[]
  %c = conv(%x, %w, %b) {{strides=[{stride}, {stride}], pads=[{pad}, {pad}, {pad}, {pad}], dilations=[1, 1], group=1, layout="NHWC"}} : f32[{n},{oh},{ow},{cout}]
  %y = max(%c, %zero) : f32[{n},{oh},{ow},{cout}]
}}
""", {"w": w, "b": b})
    return g, w, b


def _elementwise_graph():
    return parse_graph("""
graph e(%x: f32[64,100]) -> (%y, %s) {
  %e = exp(%x) : f32[64,100]
  %t = tanh(%x) : f32[64,100]
  %r = erf(%x) : f32[64,100]
  %a = abs(%x) : f32[64,100]
  %l = log(%a) : f32[64,100]
  %u = add(%e, %t) : f32[64,100]
  %v = add(%u, %r) : f32[64,100]
  %y = add(%v, %l) : f32[64,100]
  %m = reduce_max(%x) {axes=[1], keepdims=true} : f32[64,1]
  %z = sub(%x, %m) : f32[64,100]
  %s = exp(%z) : f32[64,100]
}
""")


# (name, graph) of every contraction kernel: the GEMM, a direct 3x3 conv with padding
# (row pointers into a zero row), a 1x1 conv, a stride-2 conv, Winograd F(4x4) and F(2x2)
KERNELS = {
    "gemm": lambda: _gemm_graph(),
    "conv3x3": lambda: _conv_graph((1, 9, 9, 24), 32, 3, 1, 1)[0],
    "conv1x1": lambda: _conv_graph((1, 8, 8, 64), 64, 1, 1, 0)[0],
    "conv3x3s2": lambda: _conv_graph((1, 15, 15, 32), 64, 3, 2, 1)[0],
    "winograd": lambda: _conv_graph((1, 28, 28, 64), 64, 3, 1, 1)[0],
    "winograd_f2": lambda: _conv_graph((1, 7, 7, 256), 256, 3, 1, 1)[0],
}


def _assembly(graph, spec: str) -> str:
    cg = compile_graph(graph, target=spec)
    return llvm_cpu.emit_assembly(cg.llvm_ir, targets.parse(spec))


@pytest.mark.parametrize("spec", ALL_TARGETS)
@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_no_spills_in_kernel_inner_loops(spec, kernel):
    """The micro-kernel's K loop keeps its accumulators, panel vectors and broadcast in
    registers: zero stack spills and reloads, in every kernel built on it."""
    loops = asm.loop_spills(_assembly(KERNELS[kernel](), spec), gemm.K_LOOP)
    assert loops, "no micro-kernel loop found"
    assert {name: s for name, (_, s) in loops.items() if s} == {}


def test_spill_counter_sees_spills():
    """The counter is not blind: a 14x2 AVX-512-shaped tile on AVX2's 16 registers (28
    accumulators) spills in its K loop."""
    import compiler.kernels.gemm as g

    wide = g.Tile(vec=8, nv=2, mr=12)
    of = g.Tile.of
    try:
        g.Tile.of = classmethod(lambda cls, t: wide)
        loops = asm.loop_spills(_assembly(_gemm_graph(m=48), AVX2), gemm.K_LOOP)
    finally:
        g.Tile.of = of
    assert sum(s for _, s in loops.values()) > 0


def _torch_reference(kernel, graph, x):
    consts = {v.name: v.producer.attrs["value"] for v in (n.outputs[0] for n in graph.nodes)
              if v.producer.op == "const"}
    if kernel == "gemm":
        return np.maximum(x.astype(np.float64) @ consts["w"] + consts["b"], 0)
    w, b = (torch.from_numpy(consts[k]).double() for k in ("w", "b"))
    conv = next(n for n in graph.nodes if n.op == "conv")
    xt = torch.from_numpy(x).permute(0, 3, 1, 2).double()
    y = torch.nn.functional.conv2d(xt, w, b, stride=conv.attrs["strides"],
                                   padding=conv.attrs["pads"][:2])
    return torch.relu(y).permute(0, 2, 3, 1).numpy()


@pytest.mark.parametrize("spec", [AVX2, SSE42])
@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_other_x86_targets_run_here_and_match(spec, kernel):
    """AVX2 and SSE4.2 code runs on this machine and matches the host build and torch."""
    graph = KERNELS[kernel]()
    x = np.random.default_rng(3).standard_normal(graph.inputs[0].shape).astype(np.float32)
    built = CpuStep(compile_graph(graph, target=spec))
    assert built.tile == gemm.Tile.of(targets.parse(spec)) and not built.missing
    got, = built.run([x])
    host, = CpuStep(compile_graph(graph)).run([x])
    want = _torch_reference(kernel, graph, x)
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * scale)
    np.testing.assert_allclose(got, host, rtol=0, atol=2e-5 * scale)


@pytest.mark.parametrize("spec", [AVX2, SSE42])
def test_math_library_vectorizes_for_the_target_and_matches(spec):
    """exp, tanh, erf, log and softmax: the loop vectorizer widens them to the target's
    vectors (ymm on AVX2, xmm on SSE4.2, never zmm) and the results match the host's."""
    graph = _elementwise_graph()
    text = _assembly(graph, spec)
    width = {AVX2: "%ymm", SSE42: "%xmm"}[spec]
    assert width in text and "%zmm" not in text
    if spec == SSE42:
        assert "%ymm" not in text and "vfmadd" not in text
    x = np.random.default_rng(4).standard_normal((64, 100)).astype(np.float32) * 3
    got = CpuStep(compile_graph(graph, target=spec)).run([x])
    host = CpuStep(compile_graph(graph)).run([x])
    for a, b in zip(got, host):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    xt = torch.from_numpy(x).double()
    want = (xt.exp() + xt.tanh() + torch.erf(xt) + xt.abs().log()).numpy()
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)


def test_aarch64_object_code_and_neon_fmla_in_the_gemm_loop():
    graph = _gemm_graph()
    cg = compile_graph(graph, target=NEON)
    obj = llvm_cpu.split_objects(cg.object_code)[0]
    assert obj[:4] == b"\x7fELF" and int.from_bytes(obj[18:20], "little") == 183  # EM_AARCH64
    text = llvm_cpu.emit_assembly(cg.llvm_ir, targets.parse(NEON))
    loops = inner_loops_with_most_multiplies(text)
    assert any("fmla" in line and ".4s" in line for line in loops)
    with pytest.raises(CompileError, match="aarch64"):
        CpuStep(cg).run([np.zeros((64, 256), np.float32)])


def inner_loops_with_most_multiplies(text: str) -> list[str]:
    loops = asm.inner_loops(text)
    return [line for name in asm.loop_spills(text, gemm.K_LOOP) for line in loops[name]]


def test_cache_key_holds_the_target():
    graph = _gemm_graph()
    keys = {cache_key(graph, targets.parse(s)) for s in ALL_TARGETS}
    assert len(keys) == len(ALL_TARGETS)


def _latency_graph(ops: list[str], n: int = 4096):
    lines, prev = [], "%x"
    for i, op in enumerate(ops):
        out = "%y" if i == len(ops) - 1 else f"%t{i}"
        lines.append(f"  {out} = {op}({prev}) : f32[{n}]")
        prev = out
    return parse_graph(f"graph l(%x: f32[{n}]) -> (%y) {{\n" + "\n".join(lines) + "\n}\n")


def _vector_stores(text: str) -> int:
    """Vector stores, spills aside, in the innermost loop with the most of them (the
    vectorized body)."""
    pattern = re.compile(r"^\s+v?mov[au]ps\s+%[xyz]mm\d+, -?\w*\(")
    return max(sum(bool(pattern.match(line)) and "Spill" not in line for line in lines)
               for lines in asm.inner_loops(text).values())


@pytest.mark.parametrize("spec", ["cpu", AVX2, SSE42])
def test_latency_bound_loops_interleave(spec):
    """An elementwise loop of mathlib calls asks LLVM for kernel_facts.INTERLEAVE copies of
    its vector body (LONG_INTERLEAVE from LONG_CHAIN such ops): the vectorized loop stores
    that many vectors per iteration on every x86 width; a memory-bound loop gets no hint.
    The results match numpy."""
    from compiler.codegen import kernel_facts as kf

    short, long = ["exp"], ["tanh", "sigmoid", "sqrt", "exp", "log"]
    assert len(long) >= kf.LONG_CHAIN > len(short)
    for ops, copies in ((short, kf.INTERLEAVE), (long, kf.LONG_INTERLEAVE)):
        cg = compile_graph(_latency_graph(ops), target=spec)
        assert f'!"llvm.loop.interleave.count", i32 {copies}' in cg.llvm_ir
        assert _vector_stores(_assembly(_latency_graph(ops), spec)) == copies
        x = np.random.default_rng(5).uniform(0.5, 2.0, 4096).astype(np.float32)
        want = x.astype(np.float64)
        for op in ops:
            want = {"exp": np.exp, "tanh": np.tanh, "sqrt": np.sqrt, "log": np.log,
                    "sigmoid": lambda v: 1 / (1 + np.exp(-v))}[op](want)
        np.testing.assert_allclose(CpuStep(cg).run([x])[0], want, rtol=1e-5)
    plain = compile_graph(parse_graph("graph a(%x: f32[4096]) -> (%y) {\n"
                                      "  %y = add(%x, %x) : f32[4096]\n}\n"), target=spec)
    assert "llvm.loop" not in plain.llvm_ir


def test_loop_ids_are_distinct_nodes_to_llvm():
    """lowering.LoopID (a node naming itself, as llvmlite makes no distinct plain node)
    reaches LLVM as one distinct node per loop."""
    import llvmlite.binding as llvm

    cg = compile_graph(_latency_graph(["exp", "tanh"]))
    text = str(llvm.parse_assembly(cg.llvm_ir))
    assert re.search(r"^!\d+ = distinct !\{!\d+, !\d+\}$", text, re.MULTILINE)


@pytest.mark.parametrize("spec,row,copies", [("cpu", 100, 2), (AVX2, 100, 4), (SSE42, 100, 4),
                                             ("cpu", 12, None), (AVX2, 12, None)])
def test_interleaving_leaves_two_trips_of_a_row(spec, row, copies):
    """A row-of-loop kernel (tanh(x + bias)) asks for no more copies than leave
    kernel_facts.MIN_MAIN_TRIPS iterations of its row (AVX-512's 4 x 16 floats over rows
    of 100 ran one iteration and a 36-float remainder: slower than 2 copies), and none
    where a row holds fewer; the result matches numpy."""
    g = parse_graph(f"""
graph r(%x: f32[64,{row}], %b: f32[{row}]) -> (%y) {{
  %a = add(%x, %b) : f32[64,{row}]
  %y = tanh(%a) : f32[64,{row}]
}}
""")
    cg = compile_graph(g, target=spec)
    counts = re.findall(r'!"llvm\.loop\.interleave\.count", i32 (\d+)', cg.llvm_ir)
    assert counts == ([str(copies)] if copies else [])
    rng = np.random.default_rng(6)
    x = rng.standard_normal((64, row)).astype(np.float32)
    b = rng.standard_normal(row).astype(np.float32)
    np.testing.assert_allclose(CpuStep(cg).run([x, b])[0], np.tanh(x.astype(np.float64) + b),
                               rtol=1e-5, atol=1e-6)


def test_host_caches_read_from_sysfs_where_sysconf_is_silent(tmp_path, monkeypatch):
    for i, (level, kind, size) in enumerate([(1, "Data", "48K"), (1, "Instruction", "64K"),
                                             (2, "Unified", "2048K"), (3, "Unified", "480M")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    (tmp_path / "uevent").write_text("")  # not a cache directory: skipped
    found = targets._sysfs_caches(str(tmp_path))
    assert found == {(1, "Data"): 48 << 10, (1, "Instruction"): 64 << 10,
                     (2, "Unified"): 2 << 20, (3, "Unified"): 480 << 20}
    monkeypatch.setattr(targets, "_SYSFS_CACHES", str(tmp_path))

    def no_sysconf(name):
        raise ValueError(name)

    monkeypatch.setattr(targets.os, "sysconf", no_sysconf)
    assert targets._host_caches() == (48 << 10, 2 << 20)
    assert targets._sysfs_caches(str(tmp_path / "missing")) == {}
