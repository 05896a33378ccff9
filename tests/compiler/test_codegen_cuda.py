"""CUDA codegen (compiler/codegen/cuda.py, nvptx.py): PTX that ptxas accepts for sm_80 and
sm_90, its structure (one .entry per kernel, block reductions with warp shuffles), and
the kernels' numbers, checked without a GPU by the CPU emulator (tests/compiler/simt.py)
against the interpreter. Runs on real GPUs: tests/runtime/test_cuda.py (marked gpu)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from compiler import dtypes
from compiler.codegen import compile_graph, cuda, nvptx, supports
from compiler.errors import CompileError
from compiler.interp import evaluate
from compiler.ir import Graph, TensorType, verify
from compiler.text import parse_graph
from compiler.ops.elementwise import BINARY, UNARY
from tests.compiler.simt import Emulator
from tests.compiler.test_codegen_ops import CODEGEN_DTYPES, _ops_for, data
from tests.compiler.test_fuse import LAYER_NORM, MOVEMENT_CHAIN, SOFTMAX

ARCHS = ("sm_80", "sm_90")
needs_ptxas = pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas not on PATH")
needs_libdevice = pytest.mark.skipif(nvptx.libdevice() is None, reason="no CUDA libdevice")

ELEMENTWISE = """
graph elementwise(%a: f32[4,1,33], %b: f32[5,33], %c: f32[]) -> (%y, %gt, %n) {
  %ab = add(%a, %b) : f32[4,5,33]
  %s = mul(%ab, %c) : f32[4,5,33]
  %t = tanh(%s) : f32[4,5,33]
  %e = exp(%t) : f32[4,5,33]
  %l = log(%e) : f32[4,5,33]
  %sg = sigmoid(%l) : f32[4,5,33]
  %er = erf(%sg) : f32[4,5,33]
  %zero = const() {value=dense<f32[]: [0.0]>} : f32[]
  %gt = gt(%ab, %zero) : bool[4,5,33]
  %y = select(%gt, %er, %ab) : f32[4,5,33]
  %n = cast(%y) {to="i32"} : i32[4,5,33]
}
"""

# the fusion benchmark's softmax, from primitives: exp, sum, divide (no max subtracted)
# (rows longer than the largest block: threads stride over them)
SOFTMAX_SUM = """
graph softmax_sum(%x: f32[3,300]) -> (%y) {
  %e = exp(%x) : f32[3,300]
  %s = reduce_sum(%e) {axes=[1], keepdims=true} : f32[3,1]
  %y = div(%e, %s) : f32[3,300]
}
"""

_BIAS = ", ".join(f"{0.05 * (i - 20):.2f}" for i in range(40))
# a batched matmul (partial tiles: 20 x 40 over 16 x 16) with a constant bias, then ReLU
MATMUL_BIAS_RELU = f"""
graph mlp(%x: f32[2,20,24], %w: f32[24,40]) -> (%y) {{
  %bias = const() {{value=dense<f32[40]: [{_BIAS}]>}} : f32[40]
  %xt = neg(%x) : f32[2,20,24]
  %h = matmul(%xt, %w) : f32[2,20,40]
  %hb = add(%h, %bias) : f32[2,20,40]
  %zero = const() {{value=dense<f32[]: [0.0]>}} : f32[]
  %y = max(%hb, %zero) : f32[2,20,40]
}}
"""

INT_REDUCTIONS = """
graph ints(%x: i32[3,50], %y: i8[3,50]) -> (%s, %m, %am, %al) {
  %s = reduce_sum(%x) {axes=[1], keepdims=false} : i32[3]
  %m = reduce_max(%y) {axes=[0, 1], keepdims=true} : i8[1,1]
  %am = argmax(%x) {axis=1, keepdims=false, select_last=false} : i64[3]
  %al = argmin(%y) {axis=1, keepdims=true, select_last=true} : i64[3,1]
}
"""

# libm calls: libdevice on CUDA (float64 everything; float32 sin, pow, fmod)
LIBM = """
graph libm(%x: f64[70], %y: f32[70]) -> (%a, %b) {
  %s = sin(%x) : f64[70]
  %e = exp(%s) : f64[70]
  %p = pow(%e, %x) : f64[70]
  %a = log1p(%p) : f64[70]
  %c = cos(%y) : f32[70]
  %two = const() {value=dense<f32[]: [2.0]>} : f32[]
  %q = pow(%c, %two) : f32[70]
  %b = fmod(%y, %q) : f32[70]
}
"""

GRAPHS = {
    "elementwise": ELEMENTWISE,
    "softmax_sum": SOFTMAX_SUM,
    "softmax": SOFTMAX,
    "layer_norm": LAYER_NORM,
    "movement": MOVEMENT_CHAIN,
    "matmul_bias_relu": MATMUL_BIAS_RELU,
    "int_reductions": INT_REDUCTIONS,
    "libm": LIBM,
}


def _graph(name: str) -> Graph:
    g = parse_graph(GRAPHS[name])
    g.toposort()
    verify(g)
    return g


def _program(name: str, arch: str = "sm_80"):
    if name == "libm" and nvptx.libdevice() is None:
        pytest.skip("no CUDA libdevice")
    return compile_graph(_graph(name), target="cuda", arch=arch)


def _inputs(g: Graph, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    out = []
    for v in g.inputs:
        if v.name == "i":  # the movement chain's gather indices (negative ones included)
            out.append(np.array([0, -1, 3, 6, 2]))
        elif v.dtype in dtypes.FLOATS:
            out.append(rng.standard_normal(v.shape).astype(dtypes.to_numpy(v.dtype)))
        else:
            out.append(rng.integers(-3, 3, v.shape).astype(dtypes.to_numpy(v.dtype)))
    return out


# float tolerance of the GPU kernels against the interpreter: test_fuse.py's for fused CPU
# kernels (sums reassociate: here a partial per thread, then a tree across the block)
RTOL, ATOL = 2e-5, 2e-6


def _check_emulated(program, inputs: list) -> None:
    got = Emulator(program).run(inputs)
    want = evaluate(program.graph, inputs)
    for v, a, b in zip(program.graph.outputs, got, want):
        a = np.asarray(a)
        assert a.shape == b.shape and a.dtype == b.dtype, v.name
        if a.dtype.kind == "f":
            np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=v.name)
        else:
            np.testing.assert_array_equal(a, b, err_msg=v.name)


# -- PTX checked by ptxas ---------------------------------------------------------

@needs_ptxas
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_ptxas_accepts(name, arch):
    p = _program(name, arch)
    assert f".target {arch}" in p.ptx
    report = nvptx.run_ptxas(p.ptx, arch)
    assert "spill" not in report or "0 bytes spill stores" in report


def _every_op(dtype: str) -> Graph:
    """Every elementwise op, cast, reduction and matmul braze compiles for `dtype`."""
    g = Graph(f"ops_{dtype}")
    x = g.add_input("x", TensorType(dtype, (3, 67)))
    y = g.add_input("y", TensorType(dtype, (3, 1)))
    nodes = [g.add_node(op, [x]) for op in _ops_for(UNARY, dtype)]
    nodes += [g.add_node(op, [x, y]) for op in _ops_for(BINARY, dtype)]
    nodes += [g.add_node("cast", [x], dict(to=to)) for to in CODEGEN_DTYPES]
    if dtype != "bool":
        nodes += [g.add_node(op, [x], dict(axes=(1,), keepdims=True))
                  for op in ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod")]
        nodes += [g.add_node(op, [x], dict(axis=1, keepdims=True, select_last=last))
                  for op in ("argmax", "argmin") for last in (False, True)]
        nodes.append(g.add_node("matmul", [x, g.op("transpose", x, perm=(1, 0))]))
    for n in nodes:
        if supports(n, "cuda") is not None:  # integer pow: not compiled on any target
            g.nodes.remove(n)
    g.outputs = [n.outputs[0] for n in g.nodes if n.op != "transpose"]
    return g


@needs_ptxas
@needs_libdevice
@pytest.mark.parametrize("dtype", CODEGEN_DTYPES)
def test_every_op_and_dtype_lowers_for_nvptx(dtype):
    """NVPTX lowers all of the shared lowering (no op left to a libcall it lacks)."""
    g = _every_op(dtype)
    nvptx.run_ptxas(compile_graph(g, target="cuda").ptx, "sm_80")


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_one_entry_per_kernel(name):
    p = _program(name)
    assert p.ptx.count(".entry") == len(p.plan.kernels) == len(p.launches)
    assert [lc.name for lc in p.launches] == [f"k{i}" for i in range(len(p.launches))]
    for lc, k in zip(p.launches, p.plan.kernels):
        assert lc.kind == k.kind and lc.args[-1] == p.slots[k.root]
        assert lc.block % nvptx.WARP == 0 and 1 <= lc.grid <= cuda.MAX_GRID


@pytest.mark.parametrize("name", ["softmax", "softmax_sum", "layer_norm"])
def test_row_kernels_reduce_with_warp_shuffles(name):
    p = _program(name)
    assert [k.kind for k in p.plan.kernels] == ["row"]  # softmax and layer norm: one kernel
    assert "shfl.sync.bfly" in p.ptx and "bar.sync" in p.ptx and ".shared" in p.ptx
    assert "libdevice" not in p.ptx and "__nv_" not in p.ptx  # braze's own exp


def test_loop_kernel_is_a_grid_stride_loop():
    p = _program("elementwise")
    assert [k.kind for k in p.plan.kernels] == ["loop"] * 3  # one per output
    assert "%ctaid.x" in p.ptx and "%nctaid.x" in p.ptx and "shfl" not in p.ptx


def test_matmul_tiles_through_shared_memory():
    p = _program("matmul_bias_relu")
    kinds = [lc.kind for lc in p.launches]
    assert "contraction" in kinds
    tiles = 2 * -(-20 // cuda.TILE) * -(-40 // cuda.TILE)
    assert [lc.grid for lc in p.launches if lc.kind == "contraction"] == [tiles]
    assert ".shared" in p.ptx and "bar.sync" in p.ptx


def test_libm_calls_link_libdevice():
    p = _program("libm")
    assert "__nv_sin" in p.llvm_ir and "__nv_fmodf" in p.llvm_ir
    assert ".extern" not in p.ptx  # linked in, not left to a linker


def test_ptx_version_and_arch_checks():
    g = _graph("elementwise")
    assert ".version 8.0" in compile_graph(g, target="cuda").ptx
    assert nvptx.ptx_version("sm_100") == "8.6"
    with pytest.raises(CompileError, match="unknown CUDA architecture 'sm_1'"):
        compile_graph(g, target="cuda", arch="sm_1")
    with pytest.raises(CompileError, match="sm_100 needs PTX ISA 8.6"):
        nvptx.ptx_version("sm_100", "8.0")
    assert nvptx.best_arch(9, 0) == "sm_90" and nvptx.best_arch(8, 9) == "sm_89"
    assert nvptx.best_arch(12, 9) == "sm_121"


def test_ptx_is_cached_by_key():
    class Cache(dict):
        def get(self, key):
            return super().get(key)

        def put(self, key, data):
            self[key] = data

    cache, g = Cache(), _graph("softmax")
    first = compile_graph(g, target="cuda", cache=cache)
    assert len(cache) == 1
    assert compile_graph(g, target="cuda", cache=cache).ptx == first.ptx
    compile_graph(g, target="cuda", cache=cache, arch="sm_90")
    assert len(cache) == 2


# -- what CUDA does not compile ---------------------------------------------------

def test_supports_cuda_gives_reasons(monkeypatch):
    g = Graph("s")
    x = g.add_input("x", TensorType("f32", (1, 3, 8, 8)))
    w = g.add_input("w", TensorType("f32", (4, 3, 3, 3)))
    d = g.add_input("d", TensorType("f64", (5,)))
    conv = g.add_node("conv", [x, w], dict(strides=(1, 1), pads=(0, 0, 0, 0),
                                           dilations=(1, 1), group=1))
    assert "library-class op conv: not compiled by braze for CUDA" in supports(conv, "cuda")
    sin64 = g.add_node("sin", [d])
    exp32 = g.add_node("exp", [x])
    monkeypatch.setattr(nvptx, "libdevice", lambda: None)
    assert "sin on f64 needs CUDA's libdevice" in supports(sin64, "cuda")
    assert supports(sin64, "cpu") is None
    assert supports(exp32, "cuda") is None  # braze's own float32 exp needs no libdevice
    h = Graph("h")
    h.outputs = [h.op("sin", h.add_input("d", TensorType("f64", (5,))))]
    with pytest.raises(CompileError, match="cannot compile sin node for cuda: sin on f64"):
        compile_graph(h, target="cuda")


# -- numbers, on the CPU emulator ---------------------------------------------------

@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_emulated_numbers(name):
    p = _program(name)
    _check_emulated(p, _inputs(p.graph))


def test_emulated_argmax_ties_and_nans():
    """numpy's choice among equal extremes (first, or last with select_last) and NaNs,
    across the threads of a block (rows longer than one warp)."""
    g = Graph("arg")
    x = g.add_input("x", TensorType("f32", (2, 70)))
    g.outputs = [g.op(op, x, axis=1, keepdims=False, select_last=last)
                 for op in ("argmax", "argmin") for last in (False, True)]
    a = np.random.default_rng(5).integers(0, 4, (2, 70)).astype(np.float32)
    a[1, 40] = a[1, 65] = np.nan
    _check_emulated(compile_graph(g, target="cuda"), [a])


def test_emulated_reductions_of_special_values():
    g = Graph("red")
    x = g.add_input("x", TensorType("f32", (4, 45)))
    g.outputs = [g.op(op, x, axes=(1,), keepdims=True)
                 for op in ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod")]
    a = data("f32", (4, 45), np.random.default_rng(2))
    a[2] = np.abs(a[2]) * 0 + 1.0001  # one row with a finite product
    p = compile_graph(g, target="cuda")
    with np.errstate(all="ignore"):  # inf - inf, overflowing products: as numpy's
        got, want = Emulator(p).run([a]), evaluate(g, [a])
        for v, o, w in zip(g.outputs, got, want):  # sums reassociate across threads
            scale = np.sum(np.abs(np.nan_to_num(a)), axis=1, keepdims=True)
            tol = 64 * np.finfo(np.float32).eps * scale
            ok = (np.abs(o - w) <= tol) | (np.isnan(o) & np.isnan(w)) | (o == w)
            assert ok.all(), f"{v.producer.op}: {o[~ok]} vs {w[~ok]}"
