"""Accuracy of braze's vectorizable float32 math (compiler/codegen/mathlib.py), in ulps.

The reference is numpy/math in float64 rounded to float32 (correctly rounded
but for rare double-rounding ties), so an error of N ulps here is at most N+0.5
ulps from the exact value. Inputs: a sweep of every binade from denormals to
the largest floats, both signs, plus inf, -inf, nan, +-0 and the bounds where
each function saturates.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from compiler.codegen import compile_graph, mathlib
from compiler.ir import Graph, TensorType
from runtime.cpu import CpuStep

FAST = ("exp", "log", "tanh", "sigmoid", "erf")
# the bounds the docstring of compiler/codegen/mathlib.py states, in ulps
ULPS = {"exp": 2, "log": 2, "tanh": 4, "sigmoid": 4, "erf": 6}


def _sweep(n_per_binade: int = 64, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    exps = np.arange(-149, 128)
    mant = rng.random((len(exps), n_per_binade)) + 1.0
    pos = (mant * np.exp2(exps.astype(np.float64))[:, None]).ravel()
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, mathlib.EXP_HI, mathlib.EXP_LO,
                88.72284, 88.7229, -87.33655, -103.97, -103.98, -104.0, 0.25, 1.0, 4.0,
                3.999, 9.0, 10.0, 20.0, 0.5, -0.5, 89.0, -1.0]
    x = np.concatenate([pos, -pos, specials, rng.uniform(-110, 110, 20000)])
    return x.astype(np.float32)


def _reference(op: str, x: np.ndarray) -> np.ndarray:
    d = x.astype(np.float64)
    with np.errstate(all="ignore"):
        if op == "exp":
            r = np.exp(d)
        elif op == "log":
            r = np.log(d)
        elif op == "tanh":
            r = np.tanh(d)
        elif op == "sigmoid":
            r = np.where(d >= 0, 1 / (1 + np.exp(-d)), np.exp(d) / (1 + np.exp(d)))
        else:
            r = np.array([math.erf(v) if not math.isnan(v) else math.nan for v in d])
        return r.astype(np.float32)


def _ordered(a: np.ndarray) -> np.ndarray:
    i = a.view(np.int32).astype(np.int64)
    return np.where(i < 0, -(i & 0x7FFFFFFF), i)


def ulp_error(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Distance in float32 steps (0 where both are NaN; huge where only one is)."""
    both_nan = np.isnan(got) & np.isnan(want)
    one_nan = np.isnan(got) ^ np.isnan(want)
    d = np.abs(_ordered(got) - _ordered(want))
    return np.where(both_nan, 0, np.where(one_nan, 1 << 40, d))


def _fastmath_graph(shape) -> Graph:
    g = Graph("fastmath")
    v = g.add_input("x", TensorType("f32", shape))
    g.outputs = [g.op(op, v) for op in FAST]
    return g


# exp's p * 2^n: llvm.ldexp (one vscalefps) on an AVX-512 target, the integer-add form on
# others; the fixture runs both where this machine can (a target it lacks is skipped)
TARGETS = ("cpu", "cpu:x86-64-v3")


@pytest.fixture(scope="module", params=TARGETS)
def results(request):
    from compiler import target as targets
    x = _sweep()
    program = compile_graph(_fastmath_graph(x.shape), target=request.param)
    if targets.parse(request.param).missing_here():
        pytest.skip(f"{request.param} does not run on this machine")
    outs = CpuStep(program).run([x])
    return x, dict(zip(FAST, outs))


@pytest.mark.parametrize("spec,scale", [("cpu:skylake-avx512", True), ("cpu:x86-64-v3", False)])
def test_exp_scales_by_ldexp_only_with_avx512(spec, scale):
    text = compile_graph(_fastmath_graph((64,)), target=spec).llvm_ir
    assert ("llvm.ldexp." in text) == scale


def test_sigmoid_divides_once():
    g = Graph("sigmoid")
    g.outputs = [g.op("sigmoid", g.add_input("x", TensorType("f32", (64,))))]
    text = compile_graph(g).llvm_ir
    assert text.count(" fdiv ") == 1, "sigmoid selects its numerator: one division"


@pytest.mark.parametrize("op", FAST)
def test_ulps_within_stated_bound(op, results):
    x, outs = results
    err = ulp_error(outs[op], _reference(op, x))
    worst = int(np.argmax(err))
    print(f"{op}: max {err.max()} ulp (x={x[worst]!r}), mean {err.mean():.3f}")
    assert err.max() <= ULPS[op], f"{op}({x[worst]!r}) = {outs[op][worst]!r}: {err[worst]} ulp"


@pytest.mark.parametrize("op,x,want", [
    ("exp", np.inf, np.inf), ("exp", -np.inf, 0.0), ("exp", 89.0, np.inf),
    ("exp", -104.0, 0.0), ("log", 0.0, -np.inf), ("log", -1.0, np.nan),
    ("log", np.inf, np.inf), ("log", 1.0, 0.0), ("tanh", np.inf, 1.0), ("tanh", -np.inf, -1.0),
    ("sigmoid", np.inf, 1.0), ("sigmoid", -np.inf, 0.0), ("erf", np.inf, 1.0),
    ("erf", -np.inf, -1.0), ("erf", 0.0, 0.0), ("tanh", -0.0, -0.0),
])
def test_special_values(op, x, want, results):
    xs, outs = results
    same = xs.view(np.int32) == np.float32(x).view(np.int32)  # bitwise: -0.0 is not 0.0
    got = outs[op][np.flatnonzero(same | (np.isnan(xs) & np.isnan(x)))[0]]
    np.testing.assert_array_equal(np.float32(got), np.float32(want))
    assert np.signbit(got) == np.signbit(np.float32(want))


def test_nan_in_nan_out(results):
    xs, outs = results
    for op in FAST:
        assert np.isnan(outs[op][np.isnan(xs)]).all(), op


def test_float64_uses_exact_libm():
    x = _sweep(8).astype(np.float64)
    g = Graph("f64math")
    v = g.add_input("x", TensorType("f64", x.shape))
    g.outputs = [g.op(op, v) for op in ("exp", "log", "tanh")]
    for got, fn in zip(CpuStep(compile_graph(g)).run([x]), (np.exp, np.log, np.tanh)):
        with np.errstate(all="ignore"):
            np.testing.assert_allclose(got, fn(x), rtol=5e-16, atol=1e-300)  # 2 ulp


def _run_exp_nonpositive(x: np.ndarray, lanes: int, fn=None, target=None) -> np.ndarray:
    """mathlib.exp_nonpositive_f32 (or `fn`) on x (a multiple of `lanes` long), as
    <lanes x float>, in a module marked for `target` (mathlib.for_target) if given."""
    import ctypes

    from llvmlite import ir

    from compiler.codegen import llvm_cpu
    from compiler.kernels.gemm import for_range
    from runtime.cpu import JitModule

    f32 = ir.FloatType()
    vt = ir.VectorType(f32, lanes) if lanes > 1 else f32
    module = ir.Module("expneg")
    if target is not None:
        mathlib.for_target(module, target)
    math_fn = fn or mathlib.exp_nonpositive_f32
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ir.PointerType()] * 2), "run")
    b = ir.IRBuilder(fn.append_basic_block("entry"))

    def body(b, i):
        off = b.mul(i, ir.Constant(ir.IntType(64), lanes))
        src = b.gep(fn.args[0], [off], source_etype=f32)
        dst = b.gep(fn.args[1], [off], source_etype=f32)
        b.store(math_fn(b, b.load(src, typ=vt, align=4)), dst, align=4)

    for_range(b, len(x) // lanes, body)
    b.ret_void()
    jit = JitModule(object_code=llvm_cpu.compile_ir(str(module)))
    out = np.empty_like(x)
    ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(jit.address("run"))(
        x.ctypes.data, out.ctypes.data)
    return out


@pytest.mark.parametrize("lanes", [1, 16])
def test_exp_nonpositive_matches_exp_on_its_domain(lanes):
    """The softmax exp (attention's kernel): exp's 2-ulp bound on [EXP_NONPOSITIVE_MIN, 0],
    NaN in NaN out, exactly 1 at 0."""
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.uniform(mathlib.EXP_NONPOSITIVE_MIN, 0, 40000),
                        -np.exp2(rng.uniform(-30, 6, 8000)),
                        [0.0, -0.0, mathlib.EXP_NONPOSITIVE_MIN, -1e-30, -0.5, np.nan]])
    x = np.concatenate([x, np.zeros(-len(x) % 16)]).astype(np.float32)
    got = _run_exp_nonpositive(x, lanes)
    err = ulp_error(got, _reference("exp", x))
    assert err.max() <= ULPS["exp"], x[int(np.argmax(err))]
    assert np.isnan(got[np.isnan(x)]).all()
    assert got[x == 0].tolist() == [1.0] * int((x == 0).sum())


@pytest.mark.parametrize("op", ["exp", "sigmoid"])
def test_avx512_register_vectors_scale_by_float_exponents(op):
    """A register epilogue's 16-float vectors on AVX-512 scale exp's 2^n with vscalefps
    on n as a float (mathlib._scalef: no conversions) and sigmoid lets a NaN flow
    through instead of selecting it back: the same bounds, specials and NaNs."""
    from compiler import target as targets

    host = targets.parse("cpu")
    if "avx512f" not in host.isa:
        pytest.skip("this CPU has no AVX-512")
    x = _sweep(16)
    x = np.concatenate([x, np.zeros(-len(x) % 16, np.float32)])
    got = _run_exp_nonpositive(x, 16, fn=mathlib.FAST_F32[op], target=host)
    finite = ~np.isnan(x) if op == "sigmoid" else (~np.isnan(x)) & (x <= mathlib.EXP_HI)
    if op == "sigmoid":
        finite &= x > -87
    err = ulp_error(got[finite], _reference(op, x[finite]))
    assert err.max() <= ULPS[op], x[finite][int(np.argmax(err))]
    assert np.isnan(got[np.isnan(x)]).all()
    ref = {"exp": {np.inf: np.inf, -np.inf: 0.0, 89.0: np.inf, -104.0: 0.0},
           "sigmoid": {np.inf: 1.0, -np.inf: 0.0, 0.0: 0.5}}[op]
    for v, want in ref.items():
        assert got[x == np.float32(v)][0] == want, v
