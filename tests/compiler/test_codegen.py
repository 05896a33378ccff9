"""CpuStep (runtime/cpu.py) running compile_graph's CpuProgram: supports(), calling conventions, threads, memory
plan, vectorized code, and per-call overhead (printed, not asserted)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from compiler.codegen import compile_graph, cpu, llvm_cpu, supports
from compiler.codegen import cpu_rows, kernel_facts
from compiler.errors import CompileError, InputError
from compiler.interp import evaluate
from compiler.ir import Graph, TensorType
from compiler.text import parse_graph
from runtime.cpu import CpuStep


def _add_graph(shape, dtype="f32") -> Graph:
    g = Graph("add")
    x = g.add_input("x", TensorType(dtype, shape))
    y = g.add_input("y", TensorType(dtype, shape))
    g.outputs = [g.op("add", x, y)]
    return g


def _softmax_graph(rows: int, cols: int) -> Graph:
    g = Graph("softmax")
    x = g.add_input("x", TensorType("f32", (rows, cols)))
    e = g.op("exp", g.op("sub", x, g.op("reduce_max", x, axes=(1,))))
    g.outputs = [g.op("div", e, g.op("reduce_sum", e, axes=(1,)))]
    return g


# -- supports ----------------------------------------------------------------------

def test_supports_gives_reasons():
    g = Graph("s")
    x = g.add_input("x", TensorType("f32", (1, 3, 8, 8)))
    w = g.add_input("w", TensorType("f32", (4, 3, 3, 3)))
    h = g.add_input("h", TensorType("f16", (2,)))
    conv = g.add_node("conv", [x, w], dict(strides=(1, 1), pads=(0, 0, 0, 0),
                                           dilations=(1, 1), group=1))
    assert "library-class" in supports(conv)
    half = g.add_node("neg", [h])
    assert "dtype f16" in supports(half)
    host = g.add_node("host", [x], dict(framework="onnx", op_type="Foo", reason="no Foo"),
                      out_types=[TensorType("f32", (1,))])
    assert supports(host) == "no Foo"
    ok = g.add_node("exp", [x])
    assert supports(ok) is None
    assert "target" in supports(ok, target="tpu")
    g.outputs = [conv.outputs[0]]
    with pytest.raises(CompileError, match="cannot compile conv node for cpu: library-class"):
        compile_graph(g)


# -- calling conventions -------------------------------------------------------------

def test_outputs_are_fresh_arrays():
    g = _add_graph((4, 4))
    cg = CpuStep(compile_graph(g))
    a = np.ones((4, 4), np.float32)
    first = cg.run([a, a])[0]
    second = cg.run([a, a])[0]
    assert first is not second and not np.shares_memory(first, second)
    first[:] = 7
    np.testing.assert_array_equal(second, 2 * a)


def test_outputs_that_are_inputs_constants_or_repeated():
    g = parse_graph("""
graph passthrough(%x: f32[3]) -> (%x, %y, %y, %c) {
  %c = const() {value=dense<f32[3]: [1.0, 2.0, 3.0]>} : f32[3]
  %y = add(%x, %c) : f32[3]
}
""")
    x = np.zeros(3, np.float32)
    out = CpuStep(compile_graph(g)).run([x])
    assert len(out) == 4 and not np.shares_memory(out[0], x)
    assert not np.shares_memory(out[1], out[2])
    np.testing.assert_array_equal(out[3], [1, 2, 3])


def test_bad_calls_raise_input_error():
    cg = CpuStep(compile_graph(_add_graph((2, 3))))
    with pytest.raises(InputError, match="takes 2 inputs"):
        cg.run([np.ones((2, 3))])
    with pytest.raises(InputError, match="shape"):
        cg.run([np.ones((3, 2)), np.ones((3, 2))])
    with pytest.raises(CompileError, match="threads"):
        CpuStep(compile_graph(_add_graph((2,))), threads=0)


def test_non_contiguous_and_other_dtype_inputs_are_converted():
    cg = CpuStep(compile_graph(_add_graph((3, 4))))
    a = np.arange(12, dtype=np.float64).reshape(4, 3).T  # transposed view, float64
    np.testing.assert_array_equal(cg.run([a, a])[0], (2 * a).astype(np.float32))


def test_scalar_and_empty_shapes():
    for shape in [(), (0,), (3, 0, 2)]:
        g = _add_graph(shape)
        a = np.ones(shape, np.float32)
        np.testing.assert_array_equal(CpuStep(compile_graph(g)).run([a, a])[0], a + a)


# -- memory plan ---------------------------------------------------------------------

def test_arena_reuses_dead_buffers():
    g = Graph("chain")
    x = g.add_input("x", TensorType("f32", (64, 64)))
    v = x
    for _ in range(6):  # each step is a costly value read by two kernels
        e = g.op("exp", v)
        v = g.op("add", g.op("transpose", e, perm=(1, 0)), g.op("mul", e, e))
    g.outputs = [v]
    cg = CpuStep(compile_graph(g))
    inter = [k.root for k in cg.kernels if k.root not in g.outputs]
    assert len(inter) >= 6
    one = 64 * 64 * 4
    assert cg.arena_bytes < len(inter) * one  # buffers share the arena
    a = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32) * 0.01
    np.testing.assert_allclose(cg.run([a])[0], evaluate(g, [a])[0], rtol=1e-5)


# -- threads -------------------------------------------------------------------------

def test_threaded_kernels_match_single_threaded():
    g = _softmax_graph(257, 300)
    a = np.random.default_rng(1).standard_normal((257, 300)).astype(np.float32)
    cg = CpuStep(compile_graph(g), threads=1)
    one = cg.run([a])[0]
    for n in (2, 3, 8):
        cg.set_threads(n)
        np.testing.assert_array_equal(cg.run([a])[0], one)
    np.testing.assert_allclose(one, evaluate(g, [a])[0], rtol=2e-6, atol=1e-9)


def test_concurrent_python_threads():
    g = _softmax_graph(64, 1000)
    cg = CpuStep(compile_graph(g), threads=2)
    rng = np.random.default_rng(2)
    inputs = [rng.standard_normal((64, 1000)).astype(np.float32) for _ in range(4)]
    want = [cg.run([a])[0] for a in inputs]
    errors = []

    def worker(k: int) -> None:
        for _ in range(30):
            if not np.array_equal(cg.run([inputs[k]])[0], want[k]):
                errors.append(k)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


# -- code quality --------------------------------------------------------------------

def test_inner_loops_are_vectorized():
    cg = CpuStep(compile_graph(_softmax_graph(8, 512)))
    optimized = str(llvm_cpu.optimize(cg.llvm_ir))
    assert "x float>" in optimized  # the loop vectorizer widened the row passes
    assert "@llvm.exp" not in optimized  # exp is inlined polynomial code, no libm call
    assert len(cg.kernels) == 1 and "define void @\"run\"" in cg.llvm_ir


def test_object_code_round_trips_through_a_cache(memory_cache):
    g = _add_graph((5,))
    first = CpuStep(compile_graph(g, cache=memory_cache))
    second = CpuStep(compile_graph(g, cache=memory_cache))
    assert len(memory_cache.store) == 1 and first.object_code == second.object_code
    a = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(second.run([a, a])[0], 2 * a)


# -- overhead (printed) --------------------------------------------------------------

def _per_call(fn, n: int) -> float:
    for _ in range(n // 10):
        fn()
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t) / n)
    return best


def test_per_call_overhead_and_thread_launch(monkeypatch):
    cg = CpuStep(compile_graph(_add_graph((1, 1))))
    a = np.ones((1, 1), np.float32)
    call = _per_call(lambda: cg.run([a, a]), 5000)
    monkeypatch.setattr(kernel_facts, "PARALLEL_MIN_ELEMENTS", 1)  # a threaded tiny kernel
    g = Graph("t")
    x = g.add_input("x", TensorType("f32", (2, 2)))
    g.outputs = [g.op("transpose", x, perm=(1, 0))]
    tiny = CpuStep(compile_graph(g), threads=1)
    b = np.ones((2, 2), np.float32)
    one = _per_call(lambda: tiny.run([b]), 5000)
    tiny.set_threads(2)
    two = _per_call(lambda: tiny.run([b]), 5000)
    print(f"\nper call, 1x1 add: {call * 1e6:.2f} us; "
          f"OpenMP launch (2 threads): {(two - one) * 1e6:.2f} us")


def _twins_graph() -> Graph:
    """Three kernels: exp(x) * 2 and exp(y) * 2 are twins (same code, other buffers);
    exp(z) * 3 differs only in an inlined constant."""
    g = Graph("twins")
    outs = []
    for name, c in (("x", 2.0), ("y", 2.0), ("z", 3.0)):
        v = g.add_input(name, TensorType("f32", (4, 100)))
        outs.append(g.op("mul", g.op("exp", v), g.const(np.array(c, np.float32))))
    g.outputs = outs
    return g


def test_twin_kernels_are_rendered_once(monkeypatch):
    """A kernel whose signature matches an earlier one's reuses its function without
    being rendered; the results are still each kernel's own."""
    monkeypatch.setattr(cpu, "VERIFY_TWINS", False)
    rendered = []
    nest = cpu.Renderer._nest
    monkeypatch.setattr(cpu.Renderer, "_nest",
                        lambda self, m, name, k: rendered.append(name) or nest(self, m, name, k))
    cg = CpuStep(compile_graph(_twins_graph()))
    assert len(cg.kernels) == 3 and len(rendered) == 2
    assert cg.llvm_ir.count("define internal void @\"k") == 2
    xs = [np.random.default_rng(i).standard_normal((4, 100)).astype(np.float32) for i in range(3)]
    for got, x, c in zip(cg.run(xs), xs, (2, 2, 3)):
        np.testing.assert_allclose(got, np.exp(x) * c, rtol=1e-6)


def test_a_signature_that_misses_something_fails_loudly(monkeypatch):
    """With VERIFY_TWINS (set for the whole suite), twins are rendered anyway: a
    signature that calls two different kernels twins is an error, not wrong code."""
    monkeypatch.setattr(cpu, "VERIFY_TWINS", True)
    monkeypatch.setattr(cpu, "_signature", lambda k, local: ("same",))
    with pytest.raises(AssertionError, match="_signature misses something"):
        compile_graph(_twins_graph())


def _same_output_other_inputs() -> Graph:
    """Kernels whose outputs have one type but whose inputs differ: two matmuls of depth
    16 and 8 with weights that are inputs (a stack of Linear layers with unfrozen
    weights: issue 16, item 0), and two adds of which one broadcasts an operand."""
    g = Graph("not_twins")
    x = g.add_input("x", TensorType("f32", (4, 16)))
    w1 = g.add_input("w1", TensorType("f32", (16, 8)))
    w2 = g.add_input("w2", TensorType("f32", (8, 8)))
    h = g.op("max", g.op("matmul", x, w1), g.const(np.array(0, np.float32)))
    y = g.op("max", g.op("matmul", h, w2), g.const(np.array(0, np.float32)))
    row = g.add_input("row", TensorType("f32", (1, 8)))
    full = g.add_input("full", TensorType("f32", (4, 8)))
    g.outputs = [y, g.op("add", row, y), g.op("add", full, y)]
    return g


def _not_twins_inputs() -> list[np.ndarray]:
    shapes = [(4, 16), (16, 8), (8, 8), (1, 8), (4, 8)]
    return [np.random.default_rng(i).standard_normal(s).astype(np.float32)
            for i, s in enumerate(shapes)]


def test_kernels_reading_other_input_shapes_are_not_twins():
    """Structural: a signature names each buffer with its type, so these kernels are
    rendered each (VERIFY_TWINS, set for the suite, would raise if they were twinned
    and their code differed)."""
    cg = compile_graph(_same_output_other_inputs())
    matmuls = [k for k in cg.kernels if k.contraction is not None]
    assert len(matmuls) == 2
    assert len(cg.kernels) == 4
    assert cg.llvm_ir.count("define internal void @\"k") == 4


def test_kernels_reading_other_input_shapes_compute_their_own_results(monkeypatch):
    """Numeric, with twins trusted as in production (VERIFY_TWINS off): the deeper
    matmul's code run on the shallower one read past its rows (NaN, 1e12, crashes)."""
    monkeypatch.setattr(cpu, "VERIFY_TWINS", False)
    x, w1, w2, row, full = xs = _not_twins_inputs()
    y = np.maximum(np.maximum(x @ w1, 0) @ w2, 0)
    for threads in (1, 2):
        got = CpuStep(compile_graph(_same_output_other_inputs()), threads=threads).run(xs)
        for g_, want in zip(got, (y, row + y, full + y)):
            np.testing.assert_allclose(g_, want, rtol=1e-5, atol=1e-6)


def _chain_of_distinct_kernels(n: int) -> Graph:
    """n kernels of different shapes (no twins): a row softmax per width."""
    g = Graph("distinct")
    outs = []
    for i in range(n):
        x = g.add_input(f"x{i}", TensorType("f32", (3, 16 + 8 * i)))
        e = g.op("exp", x)
        outs.append(g.op("div", e, g.op("reduce_sum", e, axes=[1], keepdims=True)))
    g.outputs = outs
    return g


def test_objects_join_and_split():
    from compiler.codegen.llvm_cpu import join_objects, split_objects

    assert join_objects([b"\x7fELF one"]) == b"\x7fELF one"  # a single file as itself
    parts = [b"\x7fELF a", b"", b"\x7fELF ccc"]
    assert split_objects(join_objects(parts)) == parts
    with pytest.raises(ValueError):
        split_objects(join_objects(parts)[:-1])


def test_parallel_parts_compile_in_a_forked_child_and_match(monkeypatch):
    """Enough distinct kernels: two modules, part 1 rendered and compiled in a forked
    child, loaded together (the entry in part 0 calls part 1's exported functions)."""
    import os

    from compiler.codegen import compiled, llvm_cpu

    monkeypatch.setattr(compiled, "PARALLEL_MIN_GROUPS", 3)
    monkeypatch.setenv("BRAZE_COMPILE_JOBS", "2")
    g = _chain_of_distinct_kernels(4)
    xs = [np.random.default_rng(i).standard_normal(v.shape).astype(np.float32)
          for i, v in enumerate(g.inputs)]
    parent = os.getpid()
    pids = []
    compile_ir = llvm_cpu.compile_ir
    monkeypatch.setattr(llvm_cpu, "compile_ir",
                        lambda text, target=None: pids.append(os.getpid())
                        or compile_ir(text, target))
    cg = CpuStep(compile_graph(g))
    assert len(llvm_cpu.split_objects(cg.object_code)) == 2
    assert pids == [parent]  # part 0 here; the child's call is not seen in this process
    for got, want in zip(cg.run(xs), evaluate(g, xs)):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_failed_compile_child_leaves_its_part_to_the_parent(monkeypatch):
    import os

    from compiler.codegen import compiled, cpu as cpu_mod

    monkeypatch.setattr(compiled, "PARALLEL_MIN_GROUPS", 3)
    monkeypatch.setenv("BRAZE_COMPILE_JOBS", "2")
    parent = os.getpid()
    render = cpu_mod.SplitRender.render

    def child_fails(self, part):
        if os.getpid() != parent:
            raise RuntimeError("child broke")
        return render(self, part)

    monkeypatch.setattr(cpu_mod.SplitRender, "render", child_fails)
    g = _chain_of_distinct_kernels(4)
    xs = [np.ones(v.shape, np.float32) for v in g.inputs]
    cg = CpuStep(compile_graph(g))
    for got, want in zip(cg.run(xs), evaluate(g, xs)):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_compile_jobs_setting(monkeypatch):
    from compiler.codegen import compiled

    monkeypatch.setenv("BRAZE_COMPILE_JOBS", "1")
    assert compiled.parallel_parts() == 1
    monkeypatch.setenv("BRAZE_COMPILE_JOBS", "two")
    with pytest.raises(CompileError, match="BRAZE_COMPILE_JOBS"):
        compiled.parallel_parts()


def test_profile_times_each_kernel_and_leaves_run_alone():
    """profile(): one time per kernel, from a separately compiled copy that reads the
    cycle counter between kernels; results and later runs are unchanged."""
    g = _chain_of_distinct_kernels(3)
    xs = [np.random.default_rng(i).standard_normal(v.shape).astype(np.float32)
          for i, v in enumerate(g.inputs)]
    cg = CpuStep(compile_graph(g))
    before = cg.run(xs)
    times = cg.profile(xs, rounds=3)
    assert len(times) == len(cg.kernels) == 3 and all(t >= 0 for t in times)
    assert 0 < sum(times) < 1.0
    for a, b in zip(before, cg.run(xs)):
        np.testing.assert_array_equal(a, b)
    assert "run_profiled" not in cg.llvm_ir and "readcyclecounter" not in cg.llvm_ir


def _chain_of_twin_kernels(n: int, w: np.ndarray) -> Graph:
    """n matmuls by w, each with a ReLU, one after another: n twin kernels."""
    lines = [f"  %h{i + 1} = matmul(%h{i}, %w) : f32[3,16]\n"
             f"  %r{i + 1} = max(%h{i + 1}, %zero) : f32[3,16]".replace(f"(%h{i},", f"(%r{i},")
             for i in range(n)]
    text = "graph twins(%r0: f32[3,16]) -> (%r{n}) {{\n  %w = const() {{value=@w}} : " \
        "f32[16,16]\n  %zero = const() {{value=dense<f32[]: [0.0]>}} : f32[]\n{body}\n}}" \
        .format(n=n, body="\n".join(lines))
    return parse_graph(text, {"w": w})


def test_a_long_cluster_calls_its_kernels_from_pieces():
    """Past ENTRY_KERNELS kernels `run` calls never-inlined pieces of that many (LLVM's
    -O3 on one function of 4498 calls took 141 s); results, order and profiling hold."""
    n = 2 * cpu.ENTRY_KERNELS + 5
    rng = np.random.default_rng(0)
    w = (np.eye(16) + 0.05 * rng.standard_normal((16, 16))).astype(np.float32)
    x = rng.standard_normal((3, 16)).astype(np.float32)
    step = CpuStep(compile_graph(_chain_of_twin_kernels(n, w)))
    assert len(step.kernels) == n
    ir_text = step.llvm_ir
    assert all(f'@"run.{i}"' in ir_text for i in range(3)) and '@"run.3"' not in ir_text
    want = x.astype(np.float64)
    for _ in range(n):
        want = np.maximum(want @ w, 0)
    np.testing.assert_allclose(step.run([x])[0], want, rtol=1e-4, atol=1e-5 * abs(want).max())
    times = step.profile([x], rounds=2)
    assert len(times) == n and all(t >= 0 for t in times)
    short = CpuStep(compile_graph(_chain_of_twin_kernels(3, w)))
    assert '@"run.0"' not in short.llvm_ir  # a short cluster's calls stay in `run`


def test_cache_key_follows_the_graph_text():
    from compiler import target as targets
    from compiler.codegen.compiled import cache_key

    host = targets.host()
    assert cache_key(_add_graph((5,)), host) == cache_key(_add_graph((5,)), host)
    assert cache_key(_add_graph((5,)), host) != cache_key(_add_graph((6,)), host)


def test_the_lock_taken_around_fork_is_the_one_llvmlite_calls_take():
    """llvm_cpu.llvmlite_lock() (llvmlite's private lock, the one use of its private API)
    is what every llvmlite call takes: seen through the public lock callback, and a call
    from another thread waits while this thread holds it."""
    import llvmlite.binding as llvm

    lock = llvm_cpu.llvmlite_lock()
    assert lock is not None
    seen = []
    acquired = lambda: seen.append(threading.get_ident())  # noqa: E731
    released = lambda: None  # noqa: E731
    llvm.ffi.register_lock_callback(acquired, released)
    try:
        llvm.get_process_triple()
        assert threading.get_ident() in seen
        done = threading.Event()
        worker = threading.Thread(target=lambda: (llvm.get_process_triple(), done.set()))
        with lock:
            worker.start()
            assert not done.wait(0.3)  # the other thread's llvmlite call waits for us
        assert done.wait(10)
        worker.join()
    finally:
        llvm.ffi.unregister_lock_callback(acquired, released)


def test_without_llvmlites_lock_parts_compile_here_without_forking(monkeypatch):
    import os

    from compiler.codegen import compiled

    monkeypatch.setattr(compiled, "PARALLEL_MIN_GROUPS", 3)
    monkeypatch.setenv("BRAZE_COMPILE_JOBS", "2")
    monkeypatch.setattr(llvm_cpu, "llvmlite_lock", lambda: None)
    monkeypatch.setattr(os, "fork", lambda: (_ for _ in ()).throw(AssertionError("forked")))
    g = _chain_of_distinct_kernels(4)
    xs = [np.ones(v.shape, np.float32) for v in g.inputs]
    cg = CpuStep(compile_graph(g))
    assert len(llvm_cpu.split_objects(cg.object_code)) == 2
    for got, want in zip(cg.run(xs), evaluate(g, xs)):
        np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("before, after, want", [
    ((1, 56, 56, 96), (1, 8, 7, 8, 7, 96),
     [((0, 1), (0, 1)), ((1, 2), (1, 3)), ((2, 3), (3, 5)), ((3, 4), (5, 6))]),
    ((64, 49, 3, 3, 32), (1, 8, 8, 7, 7, 288), [((0, 1), (0, 3)), ((1, 2), (3, 5)),
                                               ((2, 5), (5, 6))]),
    ((4, 1, 5), (20,), [((0, 3), (0, 1))]),
    ((1, 4), (4, 1), [((0, 2), (0, 2))]),
    ((2, 3), (3, 2), [((0, 2), (0, 2))]),
    ((0, 3), (3, 0), None),
])
def test_reshape_groups(before, after, want):
    from compiler.codegen.emitter import reshape_groups
    assert reshape_groups(before, after) == want


def test_window_partition_reads_with_few_divisions():
    """Swin's roll + window partition + reverse as one loop kernel: each reshape maps its
    dim groups on their own (the channel passes through), so the optimized kernel has a
    handful of divisions by constants, not one per dim of the whole offset; the same
    numbers as numpy."""
    g = parse_graph("""
graph g(%x: f32[1,14,14,8]) -> (%y) {
  %a = slice(%x) {sizes=[1, 11, 14, 8], starts=[0, 3, 0, 0], steps=[1, 1, 1, 1]} : f32[1,11,14,8]
  %b = slice(%x) {sizes=[1, 3, 14, 8], starts=[0, 0, 0, 0], steps=[1, 1, 1, 1]} : f32[1,3,14,8]
  %r = concat(%a, %b) {axis=1} : f32[1,14,14,8]
  %s = reshape(%r) {shape=[1, 2, 7, 2, 7, 8]} : f32[1,2,7,2,7,8]
  %t = transpose(%s) {perm=[0, 1, 3, 2, 4, 5]} : f32[1,2,2,7,7,8]
  %w = reshape(%t) {shape=[4, 49, 8]} : f32[4,49,8]
  %y = exp(%w) : f32[4,49,8]
}""")
    x = np.random.default_rng(0).standard_normal((1, 14, 14, 8)).astype(np.float32)
    want = np.exp(np.roll(x, -3, axis=1).reshape(1, 2, 7, 2, 7, 8).transpose(0, 1, 3, 2, 4, 5)
                  .reshape(4, 49, 8))
    cg = compile_graph(g)
    np.testing.assert_allclose(CpuStep(cg).run([x])[0], want, rtol=1e-6)
    text = cg.llvm_ir
    divisions = text.count(" udiv ") + text.count(" urem ")
    assert divisions <= 8, divisions  # 18 through the whole offset (output loop: 4)


GLOBAL_POOL = """
graph p(%x: f32[2,13,13,1000]) -> (%s, %peak) {
  %s = reduce_sum(%x) {axes=[1, 2], keepdims=false} : f32[2,1000]
  %peak = reduce_max(%x) {axes=[1, 2], keepdims=false} : f32[2,1000]
}
"""


def test_column_reductions_add_in_blocks():
    """A global pool over channels-last activations (a column reduction) adds its 169
    positions in 13 blocks of 13: its error against float64 is well under a float32 sum
    taken one position after another (measured: 2e-7 against 6e-7), and a max is
    exact (blocks change the order, not the set)."""
    assert cpu_rows.column_blocks(169) == (13, 13) and cpu_rows.column_blocks(63) == (8, 8)
    assert cpu_rows.column_blocks(50) == (8, 7) and cpu_rows.column_blocks(9) == (9, 1)
    cg = CpuStep(compile_graph(parse_graph(GLOBAL_POOL)))
    assert [kernel_facts.by_columns(k) for k in cg.kernels] == [True, True]
    x = np.random.default_rng(0).random((2, 13, 13, 1000), dtype=np.float32)
    s, peak = cg.run([x])
    want = x.astype(np.float64).sum((1, 2))
    one_by_one = np.add.accumulate(x.reshape(2, 169, 1000), axis=1, dtype=np.float32)[:, -1]
    err = np.abs(s - want).max() / np.abs(want).max()
    assert err <= 0.5 * np.abs(one_by_one - want).max() / np.abs(want).max()
    np.testing.assert_array_equal(peak, x.max((1, 2)))


def _short_pool(hw: int, c: int, fused: bool = False) -> str:
    src = "%r" if fused else "%x"
    relu = f"  %r = max(%x, %z) : f32[1,{hw},{hw},{c}]\n" if fused else ""
    zero = "  %z = const() {value=dense<f32[]: [0.0]>} : f32[]\n" if fused else ""
    return f"""
graph p(%x: f32[1,{hw},{hw},{c}]) -> (%s, %peak) {{
{zero}{relu}  %s = reduce_sum({src}) {{axes=[1, 2], keepdims=true}} : f32[1,1,1,{c}]
  %peak = reduce_max({src}) {{axes=[1, 2], keepdims=true}} : f32[1,1,1,{c}]
}}
"""


@pytest.mark.parametrize("hw,c,fused", [(13, 32, False), (3, 32, False), (13, 16, False),
                                         (13, 24, False), (9, 40, False), (13, 64, False),
                                         (13, 8, False), (13, 72, False), (13, 32, True)])
def test_short_column_reductions_in_vectors(hw, c, fused):
    """A global pool whose kept dim is short (16 to COLUMN_VECTORS_MAX floats, read
    straight from a buffer) accumulates in explicit vectors: the loop vectorizer served
    it with gathers. The same sums as numpy (blocked as before: within float32's
    rounding of the float64 sum), maxima exact, NaN propagated; a fused input (relu) or
    a dim past the bound keeps the scalar loop, with the same results."""
    from compiler import target as targets
    from compiler.kernels import gemm

    lanes = gemm.Tile.of(targets.host()).vec
    cg = CpuStep(compile_graph(parse_graph(_short_pool(hw, c, fused))))
    assert [kernel_facts.by_columns(k) for k in cg.kernels if k.kind == "row"] == [True, True]
    explicit = not fused and lanes <= c <= cpu_rows.COLUMN_VECTORS_MAX
    assert (f"load <{lanes} x float>" in cg.llvm_ir) == explicit
    x = np.random.default_rng(c).standard_normal((1, hw, hw, c)).astype(np.float32)
    x[0, hw // 2, 1, c - 1] = np.nan  # a NaN in the scalar tail or the last vector
    x[0, 0, hw - 1, 0] = np.nan
    src = np.maximum(x, 0) if fused else x
    s, peak = cg.run([x])
    want = src.astype(np.float64).sum((1, 2), keepdims=True)
    scale = np.abs(want[np.isfinite(want)]).max()  # the zoo's measure: error / max |ref|
    np.testing.assert_allclose(s, want, rtol=1e-6, atol=1e-6 * scale)
    np.testing.assert_array_equal(peak, src.max((1, 2), keepdims=True))


def _dense_prologue(after: str = "") -> str:
    """A DenseNet layer's prologue: max_pool of one input concatenated on channels with
    two more, then a per-channel BatchNorm (mul, add) and ReLU; `after` appends a node."""
    scale = ", ".join(str(0.5 + i / 64) for i in range(40))
    shift = ", ".join(str(i / 80 - 0.25) for i in range(40))
    return f"""
graph d(%x: f32[1,8,8,16], %y: f32[1,4,4,8], %z: f32[1,4,4,16]) -> (%out) {{
  %p = max_pool(%x) {{kernel=[2, 2], strides=[2, 2], pads=[0, 0, 0, 0], dilations=[1, 1], layout="NHWC"}} : f32[1,4,4,16]
  %c = concat(%p, %y, %z) {{axis=3}} : f32[1,4,4,40]
  %s = const() {{value=dense<f32[40]: [{scale}]>}} : f32[40]
  %t = const() {{value=dense<f32[40]: [{shift}]>}} : f32[40]
  %zero = const() {{value=dense<f32[]: [0.0]>}} : f32[]
  %m = mul(%c, %s) : f32[1,4,4,40]
  %a = add(%m, %t) : f32[1,4,4,40]
  %r = max(%a, %zero) : f32[1,4,4,40]
{after}}}"""


def test_concat_on_the_last_axis_splits_the_inner_loop():
    """BN-ReLU over a channel concat (DenseNet): the inner loop runs once per input of
    the concat, each segment reading its input with no branch (no concat.in blocks in
    the IR), so the loop vectorizes; the same numbers as the interpreter."""
    g = parse_graph(_dense_prologue("  %out = add(%r, %zero) : f32[1,4,4,40]\n"))
    cg = compile_graph(g)
    (k,) = cg.kernels
    node, segments = kernel_facts.concat_segments(k)
    assert node.op == "concat" and segments == [(0, 16, 0), (16, 24, 1), (24, 40, 2)]
    assert "concat.in" not in cg.llvm_ir
    assert "x float>" in str(llvm_cpu.optimize(cg.llvm_ir))
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(v.shape).astype(np.float32) for v in g.inputs]
    np.testing.assert_array_equal(CpuStep(cg).run(xs)[0], evaluate(g, xs)[0])


def test_concat_read_through_a_movement_op_keeps_its_branches():
    """A concat whose result is also read at another index (here transposed) is not
    split: the inner loop's index is not the concat's along its axis there."""
    g = parse_graph(_dense_prologue(
        "  %q = transpose(%c) {perm=[0, 2, 1, 3]} : f32[1,4,4,40]\n"
        "  %out = add(%r, %q) : f32[1,4,4,40]\n"))
    cg = compile_graph(g)
    assert [kernel_facts.concat_segments(k) for k in cg.kernels] == [None]
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(v.shape).astype(np.float32) for v in g.inputs]
    np.testing.assert_array_equal(CpuStep(cg).run(xs)[0], evaluate(g, xs)[0])


def test_a_pool_over_a_concat_splits_the_inner_loop():
    """SqueezeNet's max pool over a fire module's channel concat: a channels-last pool
    reads its input at its own channel, so the loop still splits per input of the
    concat, with no branch per element."""
    g = parse_graph("""
graph f(%a: f32[1,9,9,16], %b: f32[1,9,9,24]) -> (%y) {
  %c = concat(%a, %b) {axis=3} : f32[1,9,9,40]
  %y = max_pool(%c) {kernel=[3, 3], strides=[2, 2], pads=[0, 0, 0, 0], dilations=[1, 1], layout="NHWC"} : f32[1,4,4,40]
}""")
    cg = compile_graph(g)
    (k,) = cg.kernels
    assert kernel_facts.concat_segments(k)[1] == [(0, 16, 0), (16, 40, 1)]
    assert "concat.in" not in cg.llvm_ir
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal(v.shape).astype(np.float32) for v in g.inputs]
    np.testing.assert_array_equal(CpuStep(cg).run(xs)[0], evaluate(g, xs)[0])


# -- reading through reshapes --------------------------------------------------------

_SAMPLE_ROWS = """
graph rows(%x: f32[2,8,10,12], %y: f32[2,8,10,12]) -> (%d) {
  %n = const() {value=dense<f32[]: [960.0]>} : f32[]
  %s = add(%x, %y) : f32[2,8,10,12]
  %r = reshape(%s) {shape=[2, 1, 960]} : f32[2,1,960]
  %t = reduce_sum(%r) {axes=[2], keepdims=true} : f32[2,1,1]
  %m = div(%t, %n) : f32[2,1,1]
  %d = sub(%r, %m) : f32[2,1,960]
}
"""


def test_a_reshaped_elementwise_value_is_read_at_its_row_offset():
    """A 1-group GroupNorm's row: each sample's sum x + y viewed as one row. Its elements
    read x and y at the row's own offset, with no division or remainder per element
    (mapping the row's index to x's four dims and back took 849 us on PoolFormer's
    56 x 56 x 64 rows, 140 us without)."""
    g = parse_graph(_SAMPLE_ROWS)
    compiled = compile_graph(g)
    assert [k.kind for k in compiled.kernels] == ["row"]
    ir_text = str(compiled.llvm_ir)
    assert " udiv " not in ir_text and " urem " not in ir_text
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal((2, 8, 10, 12)).astype(np.float32) for _ in range(2))
    got = CpuStep(compiled).run([x, y])[0]
    s = (x + y).reshape(2, 1, 960)
    np.testing.assert_allclose(got, s - s.mean(axis=2, keepdims=True), rtol=1e-5, atol=1e-5)
