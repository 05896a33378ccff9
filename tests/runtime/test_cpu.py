"""runtime/cpu.py: a CpuProgram (codegen's data) loaded and run by CpuStep; the memory
plan both targets share; the output pool."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np

from compiler.codegen import compile_graph
from compiler.codegen.compiled import CpuProgram
from compiler.codegen.cuda import compile_cuda
from compiler.text import parse_graph
from runtime.cpu import CpuStep

ROOT = Path(__file__).resolve().parents[2]


W = np.random.default_rng(1).standard_normal((8, 16)).astype(np.float32)


def _graph():
    return parse_graph("""
graph g(%x: f32[4,8]) -> (%s, %y) {
  %w = const() {value=@w} : f32[8,16]
  %m = matmul(%x, %w) : f32[4,16]
  %y = tanh(%m) : f32[4,16]
  %z = exp(%y) : f32[4,16]
  %s = add(%z, %y) : f32[4,16]
}
""", {"w": W})


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_compile_graph_returns_data_and_the_runtime_runs_it():
    g = _graph()
    program = compile_graph(g)
    assert isinstance(program, CpuProgram) and not hasattr(program, "run")
    assert program.object_code and program.memory.arena_bytes == program.arena_bytes
    step = CpuStep(program, threads=1)
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    y = np.tanh(x @ W)
    got = step.run([x])
    np.testing.assert_allclose(got[0], np.exp(y) + y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1], y, rtol=1e-5, atol=1e-5)
    again = CpuStep(CpuProgram.from_object_code(g, program.object_code))
    np.testing.assert_array_equal(again.run([x])[0], got[0])


def test_both_targets_share_one_memory_plan_numbering():
    """The CUDA program numbers inputs, outputs and intermediates as the CPU's does (the
    CPU adds packed operands among the constants; arena sizes agree)."""
    g = _graph()
    cpu, gpu = compile_graph(g).memory, compile_cuda(_graph())
    names = lambda slots: {getattr(k, "name", None): s for k, s in slots.items()  # noqa: E731
                           if not isinstance(k, tuple)}
    assert [v.name for v in cpu.inputs + cpu.outputs] == \
        [v.name for v in gpu.inputs + gpu.outputs]
    assert cpu.arena_bytes == gpu.arena_bytes
    assert sorted(cpu.offsets.values()) == sorted(gpu.offsets.values())
    for name in ("x", "s", "y"):
        assert names(cpu.slots)[name] == names(gpu.slots)[name]


def test_runtime_never_imports_the_cpu_codegen_module_or_the_front_ends():
    for path in (ROOT / "runtime").glob("*.py"):
        mods = _imports(path)
        assert "compiler.codegen.compiled" not in mods, path
        assert not any(m.split(".")[0] in ("bridge", "importers") for m in mods), path


# -- the output pool ----------------------------------------------------------------

def test_pool_reuses_a_block_only_once_nothing_else_refers_to_it():
    from runtime.cpu import OutputPool

    pool = OutputPool((64,), np.float32)
    first = pool.take()
    addr = first.__array_interface__["data"][0]
    second = pool.take()  # `first` is held: a new block
    assert not np.shares_memory(first, second)
    del first
    third = pool.take()  # `first` is gone: its block comes back (as a fresh view)
    assert third.__array_interface__["data"][0] == addr
    assert not np.shares_memory(third, second)


def test_pool_never_reuses_a_block_a_view_of_a_view_still_reads():
    from runtime.cpu import OutputPool

    pool = OutputPool((4, 16), np.float32)
    out = pool.take()
    row = out[1][2:5]  # a view of a view: its base is the pooled block
    row[:] = 7.0
    del out
    for _ in range(pool.KEEP + 2):
        fresh = pool.take()
        assert not np.shares_memory(fresh, row)
        fresh[:] = -1.0
    np.testing.assert_array_equal(row, 7.0)


def test_pool_keeps_at_most_keep_blocks():
    from runtime.cpu import OutputPool

    pool = OutputPool((8,), np.float64)
    held = [pool.take() for _ in range(pool.KEEP + 3)]
    assert len(pool.blocks) == pool.KEEP
    assert len({a.__array_interface__["data"][0] for a in held}) == len(held)


def test_the_free_count_is_measured_not_assumed():
    import runtime.cpu as cpu_runtime

    assert cpu_runtime._FREE_REFS == cpu_runtime._free_refs() > 0


def test_results_held_across_calls_keep_their_values():
    """A step's results are never overwritten by later calls while the caller holds them
    (the pool hands their blocks out again only once they are let go)."""
    step = CpuStep(compile_graph(_graph()), threads=1)
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((4, 8)).astype(np.float32) for _ in range(6)]
    held = [step.run([x]) for x in xs]
    for x, (s, y) in zip(xs, held):
        want = np.tanh(x @ W)
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(s, np.exp(want) + want, rtol=1e-5, atol=1e-5)
