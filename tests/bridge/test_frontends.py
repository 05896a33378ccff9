"""The front-end layer shared by compile_onnx, onnx_backend, the torch backend, the CLI
and artifacts: one Options type, one threads check, one specialization cache, one
compile driver (the same clustering decisions on both front ends)."""

import threading
import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

import bridge
import bridge.onnx_backend as backend
from bridge.cli import main
from bridge.options import MAX_THREADS, Options, TorchOptions
from bridge.specializations import MAX_SPECIALIZATIONS, MISSING, SpecializationCache

BAD_THREADS = [0, -1, 1.5, "2", True, MAX_THREADS + 1]


def _exp_add(batch="N") -> onnx.ModelProto:
    """exp(x) + x with a symbolic batch."""
    nodes = [helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Add", ["e", "x"], ["y"])]
    g = helper.make_graph(nodes, "exp_add",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _ort(model, x):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# -- threads: one check, the same words everywhere -----------------------------

@pytest.mark.parametrize("threads", BAD_THREADS)
def test_bad_threads_refused_alike_by_every_front_end(threads, tmp_path):
    with pytest.raises(bridge.BrazeError, match="threads"):
        bridge.compile_onnx(_exp_add(), threads=threads)
    with pytest.raises(bridge.BrazeError, match="threads"):
        backend.prepare(_exp_add(), threads=threads)
    with pytest.raises(Exception, match="threads"):
        torch.compile(torch.exp, backend="braze", options={"threads": threads})(torch.ones(2))
    m = bridge.compile_onnx(_exp_add(2))
    m.save(tmp_path / "m.braze")
    with pytest.raises(bridge.BrazeError, match="threads"):
        bridge.load(tmp_path / "m.braze", threads=threads)


def test_threads_upper_bound_is_stated(tmp_path, capsys):
    assert MAX_THREADS == 256
    with pytest.raises(bridge.BrazeError, match=f"up to {MAX_THREADS}, got 257"):
        Options(threads=MAX_THREADS + 1)
    src = tmp_path / "m.onnx"
    onnx.save(_exp_add(2), src)
    for command in (["run", str(src), "--random"], ["bench", str(src)]):
        assert main([*command, "--threads", str(MAX_THREADS + 1)]) == 1
        assert f"up to {MAX_THREADS}" in capsys.readouterr().err


def test_largest_threads_runs_and_matches_onnxruntime():
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    m = bridge.compile_onnx(_exp_add(), threads=MAX_THREADS)
    np.testing.assert_allclose(m(x)[0], _ort(_exp_add(), x), rtol=1e-6, atol=1e-6)


def test_saved_threads_are_checked_at_load(tmp_path):
    """A manifest whose saved threads is out of range is a damaged artifact, refused by
    the same check (no OS threads started for it)."""
    from runtime import artifact

    m = bridge.compile_onnx(_exp_add(2), threads=3)
    m.save(tmp_path / "m.braze")
    assert bridge.load(tmp_path / "m.braze").options.threads == 3
    assert bridge.load(tmp_path / "m.braze", threads=1).options.threads == 1
    reader = artifact.ArtifactReader(tmp_path / "m.braze")
    manifest = dict(reader.manifest)
    manifest["model"] = dict(manifest["model"], options={"allow_fallback": True,
                                                         "threads": 100_000})
    w = artifact.ArtifactWriter()
    for name in reader.manifest["entries"]:
        w.add(name, reader.read(name))
    w.write(tmp_path / "bad.braze", manifest)
    with pytest.raises(bridge.ArtifactError, match="threads"):
        bridge.load(tmp_path / "bad.braze")


# -- options --------------------------------------------------------------------

def test_one_options_type_with_torch_fields_as_an_extension():
    assert issubclass(TorchOptions, Options)
    assert Options.TARGETS == ("cpu", "cuda") and TorchOptions.TARGETS == ("cpu",)
    with pytest.raises(bridge.BrazeError, match="unknown braze option.*known options: "
                       "allow_fallback, dynamic, threads$"):
        Options.from_dict({"freeze": False}, target="cpu")
    opts = TorchOptions.from_dict({"freeze": False, "threads": 3})
    assert (opts.target, opts.threads, opts.freeze, opts.strict) == ("cpu", 3, False, False)
    with pytest.raises(bridge.BrazeError, match="unknown target 'cuda'"):
        TorchOptions(target="cuda")


# -- the specialization cache ---------------------------------------------------

def test_both_front_ends_keep_sixteen_specializations():
    assert MAX_SPECIALIZATIONS == 16
    model = _exp_add()
    m = bridge.compile_onnx(model, dynamic="off")  # exact shapes: no buckets
    for n in range(1, MAX_SPECIALIZATIONS + 3):
        x = np.full((n, 4), 0.5, np.float32)
        np.testing.assert_allclose(m(x)[0], _ort(model, x), rtol=1e-6)
    assert len(m._specs) == MAX_SPECIALIZATIONS
    assert dict(next(iter(m._specs)))["x"] == (3, 4)  # 1 and 2 were least recently used

    from torch.fx.experimental.proxy_tensor import make_fx

    from bridge.torch_backend import GraphRunner

    gm = make_fx(lambda x: (torch.exp(x) + x,), tracing_mode="symbolic")(torch.randn(3))
    runner = GraphRunner(gm, "t", (), TorchOptions(strict=True))
    for n in range(1, MAX_SPECIALIZATIONS + 3):
        x = torch.randn(n)
        torch.testing.assert_close(runner(x)[0], torch.exp(x) + x)
    assert len(runner._specs) == MAX_SPECIALIZATIONS


def test_cache_builds_a_key_once_under_concurrent_calls():
    cache = SpecializationCache(size=2)
    built = []

    def build():
        built.append(1)
        time.sleep(0.05)
        return "spec"

    workers = [threading.Thread(target=lambda: cache.get_or_build("k", build))
               for _ in range(8)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert built == [1] and cache.get("k") == "spec"
    cache.put("a", None)  # a stored None (run eagerly) is a value, not a miss
    cache.put("b", 2)
    assert cache.get("k") is MISSING and cache.get("a") is None and len(cache) == 2


# -- one driver: the same clustering on both front ends -------------------------

def test_torch_without_fallback_names_the_node_braze_cannot_compile():
    """exp before airy_ai is cheap: with fallback it joins airy_ai on torch; without, it
    stays compiled (as on the ONNX path), so the refusal names airy_ai, not exp."""
    def f(x):
        return torch.special.airy_ai(torch.exp(x))

    c = torch.compile(f, backend="braze", options={"allow_fallback": False, "strict": True})
    with pytest.raises(Exception, match=r"airy_ai.*\(allow_fallback=False\)") as e:
        c(torch.randn(3))
    assert "too cheap" not in str(e.value)
    x = torch.randn(3)
    torch._dynamo.reset()
    got = torch.compile(f, backend="braze", options={"strict": True})(x)
    torch.testing.assert_close(got, f(x))


def test_onnx_explain_and_call_share_one_plan():
    """explain() describes the clusters the call ran (the same driver.plan)."""
    m = bridge.compile_onnx(_exp_add())
    x = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(m(x)[0], _ort(_exp_add(), x), rtol=1e-6)
    (spec,) = m._specs.values()
    assert m.explain() == spec.plan.describe()
    assert [c.kind for c in spec.clusters] == ["compiled"]
