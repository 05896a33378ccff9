"""compiler/codegen/parallel.py and runtime/pool.py: `braze_parallel` runs every item of
a kernel once, on braze's pool (and on its OpenMP and serial definitions), whatever
the thread count, the callers and a fork; clusters call it for their big kernels."""

from __future__ import annotations

import ctypes
import os
import threading

import numpy as np
import pytest
from llvmlite import ir

from compiler import target as targets
from compiler.codegen import compile_graph, llvm_cpu, parallel
from compiler.text import parse_graph
from runtime import pool
from runtime.cpu import CpuStep, JitModule

I64 = ir.IntType(64)
PTR = ir.PointerType()
_PARALLEL = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                             ctypes.c_int32)
HOST = targets.host().triple
pool_only = pytest.mark.skipif(pool.install() != "pool", reason="braze's pool is opt-in "
                               "(BRAZE_THREAD_POOL=pool; `make test` runs this file so) and "
                               "needs Linux on x86_64 or AArch64")


def _counting_nest() -> tuple[JitModule, int]:
    """(code, address of) nest(table, lo, hi): table[i] += 1 (atomically) for i in
    [lo, hi), table an i64 count per item: a repeated or missed item shows."""
    m = ir.Module("count")
    fn = ir.Function(m, ir.FunctionType(ir.VoidType(), [PTR, I64, I64]), "nest")
    table, lo, hi = fn.args
    entry, loop, done = (fn.append_basic_block(n) for n in ("entry", "loop", "done"))
    b = ir.IRBuilder(entry)
    b.cbranch(b.icmp_unsigned("<", lo, hi), loop, done)
    b.position_at_end(loop)
    i = b.phi(I64)
    i.add_incoming(lo, entry)
    b.atomic_rmw("add", b.gep(table, [i], source_etype=I64), ir.Constant(I64, 1), "monotonic")
    nxt = b.add(i, ir.Constant(I64, 1))
    i.add_incoming(nxt, loop)
    b.cbranch(b.icmp_unsigned("<", nxt, hi), loop, done)
    b.position_at_end(done)
    b.ret_void()
    jit = JitModule(object_code=llvm_cpu.compile_ir(str(m)), own_symbols=True)
    return jit, jit.address("nest")


def _check_exactly_once(run, nest: int, outers=(0, 1, 2, 3, 7, 64, 1000, 4097),
                        threads=(1, 2, 3, 8), repeats: int = 20) -> None:
    for outer in outers:
        for n in threads:
            for _ in range(repeats):
                counts = np.zeros(max(outer, 1), np.int64)
                run(nest, counts.ctypes.data, outer, n)
                assert (counts[:outer] == 1).all(), (outer, n, np.flatnonzero(counts != 1))


# -- structure ------------------------------------------------------------------------

def test_modules_define_what_they_promise():
    pool_ir = parallel.pool_module("x86_64-unknown-linux-gnu")
    for name in (parallel.PARALLEL, parallel.WORKER, parallel.RESET):
        assert f'define void @"{name}"' in pool_ir
    assert "cmpxchg" in pool_ir and "GOMP" not in pool_ir
    assert "GOMP_parallel" in parallel.gomp_module(HOST)
    assert "GOMP_parallel" not in parallel.serial_module(HOST)
    assert parallel.has_pool("aarch64-unknown-linux-gnu")
    assert not parallel.has_pool("x86_64-pc-windows-msvc")
    for triple in ("x86_64-unknown-linux-gnu", "aarch64-unknown-linux-gnu"):
        llvm_cpu.optimize(parallel.pool_module(triple), targets.parse(f"cpu:generic@{triple}"))


def test_a_cluster_shares_big_kernels_through_braze_parallel():
    g = parse_graph("""
graph g(%x: f32[256,512]) -> (%y) {
  %y = tanh(%x) : f32[256,512]
}
""")
    text = compile_graph(g).llvm_ir
    assert f'call void @"{parallel.PARALLEL}"' in text and "GOMP_parallel" not in text


# -- numbers --------------------------------------------------------------------------

@pool_only
def test_the_pool_runs_every_item_once():
    pool.ensure_workers(3)
    jit, nest = _counting_nest()
    _check_exactly_once(_PARALLEL(pool.address()), nest)


@pool_only
def test_more_items_than_grains_run_once_each():
    pool.ensure_workers(2)
    jit, nest = _counting_nest()
    outers = (parallel.GRAIN_MASK + 1, 3 * parallel.GRAIN_MASK + 7)
    _check_exactly_once(_PARALLEL(pool.address()), nest, outers, threads=(2, 3), repeats=3)


@pool_only
def test_concurrent_callers_each_get_all_their_items():
    pool.ensure_workers(2)
    jit, nest = _counting_nest()
    run = _PARALLEL(pool.address())
    errors = []

    def caller() -> None:
        try:
            _check_exactly_once(run, nest, outers=(5, 300), threads=(2,), repeats=200)
        except AssertionError as e:
            errors.append(e)

    callers = [threading.Thread(target=caller) for _ in range(3)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert not errors


@pytest.mark.parametrize("make", [parallel.gomp_module, parallel.serial_module])
def test_the_fallbacks_run_every_item_once(make):
    if make is parallel.gomp_module and not llvm_cpu.libgomp():
        pytest.skip("no libgomp")
    code = JitModule(object_code=llvm_cpu.compile_ir(make(HOST)), own_symbols=True)
    jit, nest = _counting_nest()
    _check_exactly_once(_PARALLEL(code.address(parallel.PARALLEL)), nest, repeats=3)


@pool_only
@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_forked_child_runs_clusters_on_workers_of_its_own():
    g = parse_graph("""
graph g(%x: f32[300,700]) -> (%y) {
  %y = tanh(%x) : f32[300,700]
}
""")
    step = CpuStep(compile_graph(g), threads=2)
    x = np.random.default_rng(0).standard_normal((300, 700)).astype(np.float32)
    want = step.run([x])[0]
    pid = os.fork()
    if pid == 0:
        ok = all(np.array_equal(step.run([x])[0], want) for _ in range(50))
        os._exit(0 if ok and pool.workers() >= 1 else 1)
    _, status = os.waitpid(pid, 0)
    assert status == 0


@pool_only
def test_clusters_match_one_thread_with_more_threads_than_cores():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((96, 130)).astype(np.float32)
    g = parse_graph("""
graph g(%x: f32[77,96]) -> (%y) {
  %w = const() {value=@w} : f32[96,130]
  %m = matmul(%x, %w) : f32[77,130]
  %y = tanh(%m) : f32[77,130]
}
""", {"w": w})
    x = rng.standard_normal((77, 96)).astype(np.float32)
    step = CpuStep(compile_graph(g), threads=1)
    one = step.run([x])[0]
    np.testing.assert_allclose(one, np.tanh(x.astype(np.float64) @ w), rtol=1e-5, atol=1e-5)
    for n in (2, 5, 16):  # 16 threads on this machine's cores: oversubscribed
        step.set_threads(n)
        for _ in range(20):
            np.testing.assert_array_equal(step.run([x])[0], one)
