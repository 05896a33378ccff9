"""Run-time faults in compiled code (compiler/codegen/faults.py): an out-of-range gather
index and an integer division by zero raise, as onnxruntime and torch do, rather than
return a clamped row or x / 0 = x."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import bridge
from compiler.codegen import faults
from compiler.codegen import compile_graph
from compiler.errors import BrazeError, BrazeIndexError, DivisionByZeroError
from compiler.ir import Graph, TensorType

TABLE = np.arange(30, dtype=np.float32).reshape(10, 3)


def _gather_graph() -> Graph:
    g = Graph("gather")
    w = g.add_node("const", [], {"value": TABLE}).output
    i = g.add_input("i", TensorType("i64", (4,)))
    y = g.add_node("gather", [w, i], {"axis": 0}, name="lookup").output
    g.outputs = [g.op("max", y, g.add_node("const", [], {"value": np.array(0, np.float32)}).output)]
    return g


def _gather_model() -> onnx.ModelProto:
    g = helper.make_graph(
        [helper.make_node("Gather", ["w", "i"], ["y"], axis=0, name="lookup"),
         helper.make_node("Relu", ["y"], ["z"])], "g",
        [helper.make_tensor_value_info("i", TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 3])],
        [numpy_helper.from_array(TABLE, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _divide_model(op: str, **attrs) -> onnx.ModelProto:
    t = TensorProto.INT32
    g = helper.make_graph([helper.make_node(op, ["a", "b"], ["y"], name="q", **attrs)], "g",
                          [helper.make_tensor_value_info("a", t, [4]),
                           helper.make_tensor_value_info("b", t, [4])],
                          [helper.make_tensor_value_info("y", t, [4])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


# -- structure ------------------------------------------------------------------------

def test_only_faulting_clusters_get_a_fault_slot():
    c = compile_graph(_gather_graph())
    assert faults.FAULTS in c.slots
    assert "atomicrmw or" in c.llvm_ir
    g = Graph("plain")
    x = g.add_input("x", TensorType("f32", (4,)))
    g.outputs = [g.op("add", x, x)]
    assert faults.FAULTS not in compile_graph(g).slots


def test_constant_nonzero_divisor_needs_no_check():
    g = Graph("d")
    x = g.add_input("x", TensorType("i32", (4,)))
    three = g.add_node("const", [], {"value": np.full(4, 3, np.int32)}).output
    g.outputs = [g.op("div", x, three)]
    assert faults.sites(g) == []
    zero = g.add_node("const", [], {"value": np.array([3, 0, 1, 1], np.int32)}).output
    g.outputs = [g.op("div", x, zero)]
    assert [n.op for n in faults.sites(g)] == ["div"]


def test_constant_in_range_gather_indices_need_no_check():
    g = Graph("g")
    x = g.add_input("x", TensorType("f32", (10, 3)))
    fine = g.add_node("const", [], {"value": np.array([0, 9, -10, 4], np.int64)}).output
    g.outputs = [g.add_node("gather", [x, fine], {"axis": 0}).output]
    assert faults.sites(g) == []
    bad = g.add_node("const", [], {"value": np.array([0, 10], np.int64)}).output
    g.outputs = [g.add_node("gather", [x, bad], {"axis": 0}).output]
    assert [n.op for n in faults.sites(g)] == ["gather"]


@pytest.mark.parametrize("op,good,bad", [  # more elements than the text prints inline
    ("gather", [0, 9, 3, 4] * 8, [0, 10, 3, 4] + [0, 9, 3, 4] * 7),
    ("div", [3, 2, 1, 1] * 8, [3, 0, 1, 1] + [3, 2, 1, 1] * 7),
])
def test_the_compile_cache_tells_checked_from_unchecked_constants(op, good, bad, memory_cache):
    # the graph text names a large constant without its values; whether it needs a
    # run-time check does depend on them: a cached unchecked kernel must not serve it
    def graph(values):
        g = Graph("g")
        if op == "gather":
            x = g.add_input("x", TensorType("f32", (10, 3)))
            i = g.add_node("const", [], {"value": np.array(values, np.int64)}).output
            g.outputs = [g.add_node("gather", [x, i], {"axis": 0}).output]
        else:
            x = g.add_input("x", TensorType("i32", (32,)))
            d = g.add_node("const", [], {"value": np.array(values, np.int32)}).output
            g.outputs = [g.op("div", x, d)]
        return g

    from runtime.cpu import CpuStep

    x = TABLE if op == "gather" else np.arange(32, dtype=np.int32)
    CpuStep(compile_graph(graph(good), cache=memory_cache)).run([x])
    with pytest.raises((BrazeIndexError, DivisionByZeroError)):
        CpuStep(compile_graph(graph(bad), cache=memory_cache)).run([x])
    assert len(memory_cache.store) == 2


def test_error_classes_are_python_ones_too():
    assert issubclass(BrazeIndexError, IndexError) and issubclass(BrazeIndexError, BrazeError)
    assert issubclass(DivisionByZeroError, ZeroDivisionError)
    assert issubclass(bridge.BrazeIndexError, BrazeError)


# -- numbers against onnxruntime ---------------------------------------------------------

@pytest.mark.parametrize("indices", [[0, -1, 9, -10], [3, 3, 2, 1]])
def test_in_range_gather_matches_onnxruntime(indices):
    m = _gather_model()
    i = np.array(indices, np.int64)
    want = ort.InferenceSession(m.SerializeToString()).run(None, {"i": i})[0]
    got = bridge.compile_onnx(m, allow_fallback=False)(i)[0]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("bad", [10, -11, 1 << 40])
def test_out_of_range_gather_raises_like_onnxruntime(bad):
    m = _gather_model()
    i = np.array([0, bad, 1, 2], np.int64)
    with pytest.raises(Exception):
        ort.InferenceSession(m.SerializeToString()).run(None, {"i": i})
    c = bridge.compile_onnx(m, allow_fallback=False)
    with pytest.raises(BrazeIndexError, match='gather node "lookup" \\(axis of size 10\\)'):
        c(i)
    # the fault word is cleared: the next good call answers
    np.testing.assert_array_equal(c(np.array([9, 8, 7, 6]))[0], TABLE[[9, 8, 7, 6]])


@pytest.mark.parametrize("op,attrs", [("Div", {}), ("Mod", {}), ("Mod", {"fmod": 1})])
def test_integer_division_by_zero_raises_like_onnxruntime(op, attrs):
    m = _divide_model(op, **attrs)
    a, b = np.array([7, -7, 3, 4], np.int32), np.array([2, 2, 0, 1], np.int32)
    with pytest.raises(Exception, match="by zero"):
        ort.InferenceSession(m.SerializeToString()).run(None, {"a": a, "b": b})
    c = bridge.compile_onnx(m, allow_fallback=False)
    with pytest.raises(DivisionByZeroError, match="by zero"):
        c(a, b)
    ok = np.array([2, 3, -2, 1], np.int32)
    want = ort.InferenceSession(m.SerializeToString()).run(None, {"a": a, "b": ok})[0]
    np.testing.assert_array_equal(c(a, ok)[0], want)


def test_threads_see_only_their_own_faults():
    c = bridge.compile_onnx(_gather_model(), allow_fallback=False)
    errors, wrong = [], []

    def work(bad: bool):
        for _ in range(200):
            try:
                out = c(np.array([10 if bad else 1, 0, 0, 0]))[0]
                if bad or not np.array_equal(out[0], TABLE[1]):
                    wrong.append(out)
            except BrazeIndexError:
                errors.append(bad)

    ts = [threading.Thread(target=work, args=(k % 2 == 0,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not wrong and errors == [True] * 400


# -- torch --------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [10, -1])
def test_torch_embedding_and_index_select_raise_index_error(bad):
    torch = pytest.importorskip("torch")
    torch._dynamo.reset()
    emb = torch.nn.Embedding(10, 4)
    x = torch.randn(10, 3)

    def lookup(i):
        return torch.relu(emb(i)) * 2

    def select(i):
        return torch.index_select(x, 0, i) + 1

    for fn in (lookup, select):
        c = torch.compile(fn, backend="braze", options={"strict": True,
                                                         "allow_fallback": False})
        with torch.no_grad():
            good = torch.tensor([9, 0])
            torch.testing.assert_close(c(good), fn(good))
            with pytest.raises(IndexError):
                fn(torch.tensor([bad, 0]))
            with pytest.raises(BrazeIndexError):
                c(torch.tensor([bad, 0]))
        torch._dynamo.reset()


def test_torch_integer_division_by_zero_raises():
    torch = pytest.importorskip("torch")
    torch._dynamo.reset()

    def f(a, b):
        return (a // b) + torch.remainder(a, b)

    a = torch.arange(-6, 6, dtype=torch.int32).reshape(3, 4)
    good, zero = torch.full((4,), 3, dtype=torch.int32), torch.tensor([1, 0, 2, 3],
                                                                        dtype=torch.int32)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        f(a, zero)
    c = torch.compile(f, backend="braze", options={"strict": True, "allow_fallback": False})
    torch.testing.assert_close(c(a, good), f(a, good))
    with pytest.raises(DivisionByZeroError, match="integer division by zero"):
        c(a, zero)
    torch._dynamo.reset()


def test_saved_artifact_keeps_the_check(tmp_path):
    m = bridge.compile_onnx(_gather_model(), allow_fallback=False)
    m(np.array([0, 1, 2, 3]))
    m.save(tmp_path / "gather.braze")
    loaded = bridge.load(tmp_path / "gather.braze")
    np.testing.assert_array_equal(loaded(np.array([9, 0, 1, 2]))[0], TABLE[[9, 0, 1, 2]])
    with pytest.raises(BrazeIndexError):
        loaded(np.array([0, 0, 10, 0]))
