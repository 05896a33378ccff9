"""Artifacts: save in one process, load and run in another without recompiling; every
way a file can be wrong gives one clear ArtifactError; `braze compile` then `braze run`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import bridge
from bridge import ArtifactError, BrazeError, InputError
from bridge.cli import main
from compiler.codegen import llvm_cpu
from compiler.target import host
from runtime.artifact import FORMAT_VERSION

ROOT = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(0)
N = 64  # rows: 64 x 64 elements keeps the elementwise clusters from counting as "cheap"


def _model() -> onnx.ModelProto:
    """relu(mvn(x + w) over axis 1): Add and Relu compiled by braze,
    MeanVarianceNormalization (no braze converter) a host node on onnxruntime; symbolic
    batch."""
    w = np.random.default_rng(1).standard_normal(64).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w"),
             numpy_helper.from_array(np.array(1, np.int64), "axis")]
    nodes = [helper.make_node("Add", ["x", "w"], ["a"], name="add"),
             helper.make_node("MeanVarianceNormalization", ["a"], ["c"], name="mvn", axes=[1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    g = helper.make_graph(nodes, "addcumsumrelu",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 64])],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _x(rows: int = N) -> np.ndarray:
    return RNG.standard_normal((rows, 64)).astype(np.float32)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """An artifact holding two shapes (64 and 128 rows), the inputs, and braze's outputs."""
    d = tmp_path_factory.mktemp("artifact")
    m = bridge.compile_onnx(_model())
    xs = [_x(N), _x(2 * N)]
    refs = [m(x)[0] for x in xs]
    kinds = [c.compiled for c in m.saved_specializations()[0].clusters]
    assert kinds == [True, False, True]  # compiled, host, compiled
    m.save(d / "m.braze")
    return d / "m.braze", xs, refs


_CHILD = textwrap.dedent("""
    import pickle, sys
    import numpy as np
    import bridge
    from compiler.codegen import compiled, cpu, llvm_cpu

    def no(*args, **kwargs):
        raise AssertionError("loading an artifact must not compile or unpickle")

    llvm_cpu.optimize = llvm_cpu.emit_object = compiled._compile_uncached = no
    cpu.Renderer.render = no
    pickle.load = pickle.loads = pickle.Unpickler = no
    m = bridge.load(sys.argv[1])
    assert m.host_steps == 2, m.host_steps
    for i, path in enumerate(sys.argv[2:]):
        np.save(f"{path}.out.npy", m(np.load(path))[0])
""")


def test_runs_in_a_new_process_with_identical_outputs_and_no_llvm(saved, tmp_path):
    path, xs, refs = saved
    files = []
    for i, x in enumerate(xs):
        np.save(tmp_path / f"x{i}.npy", x)
        files.append(str(tmp_path / f"x{i}.npy"))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(path), *files], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for f, ref in zip(files, refs):
        assert np.array_equal(np.load(f + ".out.npy"), ref)


def test_loaded_model_calls_like_the_compiled_one(saved):
    path, xs, refs = saved
    m = bridge.load(path, threads=1)
    assert m.input_names == ["x"] and m.output_names == ["y"]
    assert m.saved_shapes == [{"x": (N, 64)}, {"x": (2 * N, 64)}]
    assert np.array_equal(m(xs[0])[0], refs[0])
    assert np.array_equal(m(x=xs[1])[0], refs[1])
    with pytest.raises(InputError, match="must be float32"):
        m(xs[0].astype(np.float64))
    with pytest.raises(InputError, match=r"saved for: x=\[64, 64\]; x=\[128, 64\]"):
        m(_x(3))


def test_weights_are_stored_once(saved):
    with zipfile.ZipFile(saved[0]) as zf:
        tensors = [n for n in zf.namelist() if n.startswith("tensors/")]
        manifest = json.loads(zf.read("manifest.json"))
    assert len(tensors) == 1  # w, shared by both specializations and their graphs
    assert len(manifest["specializations"]) == 2


def test_save_with_nothing_compiled_needs_shapes(tmp_path):
    m = bridge.compile_onnx(_model())
    with pytest.raises(BrazeError, match="input_shapes"):
        m.save(tmp_path / "m.braze")
    with pytest.raises(InputError, match="names no input"):
        m.save(tmp_path / "m.braze", input_shapes={"nope": (1,)})
    m.save(tmp_path / "m.braze", input_shapes={"x": (N, 64)})
    x = _x()
    assert np.array_equal(bridge.load(tmp_path / "m.braze")(x)[0], m(x)[0])


def test_value_specialized_inputs_are_saved_with_their_values(tmp_path):
    """Reshape's target shape comes in as an input: braze specializes on its value."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("Relu", ["r"], ["y"])]
    g = helper.make_graph(nodes, "reshape",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16]),
                           helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = bridge.compile_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    x, shape = RNG.standard_normal((4, 16)).astype(np.float32), np.array([8, 8], np.int64)
    with pytest.raises(BrazeError, match="values of input"):
        m.save(tmp_path / "r.braze")
    ref = m(x, shape)[0]
    m.save(tmp_path / "r.braze")
    loaded = bridge.load(tmp_path / "r.braze")
    assert np.array_equal(loaded(x, shape)[0], ref)
    with pytest.raises(InputError, match="particular values of input"):
        loaded(x, np.array([2, 32], np.int64))


# -- errors -----------------------------------------------------------------------


def _rewrite(src: Path, dst: Path, manifest=None, entry=None) -> Path:
    """A copy of the artifact with its manifest edited in place by `manifest(m)`, or
    with the entry whose name ends as entry[0] replaced by entry[1](data)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for name in zin.namelist():
            data = zin.read(name)
            if name == "manifest.json" and manifest is not None:
                m = json.loads(data)
                manifest(m)
                data = json.dumps(m).encode()
            elif entry is not None and name.endswith(entry[0]):
                data = entry[1](data)
            zout.writestr(name, data)
    return dst


def _set(*keys_value):
    *keys, value = keys_value

    def edit(m):
        for k in keys[:-1]:
            m = m[k]
        m[keys[-1]] = value
    return edit


_FEATURES = host().features
_NEWER = FORMAT_VERSION + 1

# (case, manifest edit or entry edit, words the message must contain)
BAD_MANIFESTS = [
    ("format_newer", _set("format_version", FORMAT_VERSION + 1),
     [f"format version {FORMAT_VERSION + 1}", "newer"]),
    ("format_older", _set("format_version", FORMAT_VERSION - 1),
     [f"format version {FORMAT_VERSION - 1}", "older"]),
    ("not_braze", _set("format", "something-else"), ["not a braze artifact"]),
    ("braze_version", _set("braze_version", "0.0.1"), ["braze 0.0.1", "this is braze"]),
    ("triple", _set("target", "triple", "sparc-sun-solaris"), ["sparc-sun-solaris"]),
    ("cpu_name", _set("target", "cpu", "pentium-mmx"), ["pentium-mmx", "cpu"]),
    ("cpu_features", _set("target", "features", _FEATURES + ",+braze-test-feature"),
     ["features differ", "braze-test-feature"]),
    ("malformed", lambda m: m.pop("specializations"), ["malformed", "specializations"]),
    ("named_cpu_features", lambda m: m["target"].update(
        spec="cpu:znver3", requires=["avx2", "braze-test-feature"]),
     ["cpu:znver3", "lacks", "braze-test-feature"]),
    ("named_cpu_arch", lambda m: m["target"].update(
        spec="cpu:neoverse-n1", triple="aarch64-unknown-linux-gnu"),
     ["cpu:neoverse-n1", "aarch64"]),
]


@pytest.mark.parametrize("case,edit,words", BAD_MANIFESTS, ids=[c[0] for c in BAD_MANIFESTS])
def test_manifest_problems_say_which(saved, tmp_path, case, edit, words):
    bad = _rewrite(saved[0], tmp_path / f"{case}.braze", manifest=edit)
    with pytest.raises(ArtifactError) as e:
        bridge.load(bad)
    msg = str(e.value)
    assert str(bad) in msg
    for w in words:
        assert w.lower() in msg.lower(), (w, msg)


def test_damaged_files(saved, tmp_path):
    path = saved[0]
    raw = path.read_bytes()
    at = raw.index(b"graph cluster0") + 8
    flipped = tmp_path / "crc.braze"
    flipped.write_bytes(raw[:at] + bytes([raw[at] ^ 1]) + raw[at + 1:])
    truncated = tmp_path / "truncated.braze"
    truncated.write_bytes(raw[: len(raw) // 2])
    text = tmp_path / "notes.braze"
    text.write_text("not an artifact\n")
    no_manifest = tmp_path / "nomanifest.braze"
    with zipfile.ZipFile(no_manifest, "w") as zf:
        zf.writestr("hello.txt", "hi")
    swapped = _rewrite(path, tmp_path / "swapped.braze",
                       entry=("step0.ir", lambda d: d[:-1] + bytes([d[-1] ^ 1])))
    longer = _rewrite(path, tmp_path / "longer.braze", entry=("step0.ir", lambda d: d + b" "))
    cases = [
        (tmp_path / "missing.braze", "no such file"),
        (tmp_path, "is a directory"),
        (text, "not a zip file"),
        (truncated, "truncated"),
        (no_manifest, "no manifest.json"),
        (flipped, "corrupted"),
        (swapped, "does not match its checksum"),
        (longer, "step0.ir' holds .* bytes, its manifest says"),
    ]
    for bad, words in cases:
        with pytest.raises(ArtifactError, match=words):
            bridge.load(bad)


# -- CLI --------------------------------------------------------------------------


def test_cli_compile_then_run(tmp_path, capsys):
    src, out = tmp_path / "m.onnx", tmp_path / "m.braze"
    onnx.save(_model(), src)
    x = _x()
    np.save(tmp_path / "x.npy", x)
    assert main(["compile", str(src), "-o", str(out), "--shape", f"x={N},64",
                 "--threads", "1"]) == 0
    assert "2 compiled by braze, 1 on onnxruntime" in capsys.readouterr().out
    assert main(["run", str(out), "--input", f"x={tmp_path / 'x.npy'}",
                 "--output-dir", str(tmp_path / "out")]) == 0
    assert "y: f32[64, 64]" in capsys.readouterr().out
    ref = bridge.compile_onnx(_model())(x)[0]
    assert np.array_equal(np.load(tmp_path / "out" / "y.npy"), ref)
    assert main(["run", str(out), "--random"]) == 0


@pytest.mark.parametrize("argv,words", [
    (["compile", "{src}", "-o", "{dir}/m.braze"], ["symbolic", "--shape x="]),
    (["compile", "{src}", "-o", "{dir}/m.braze", "--shape", "x=64,64", "--no-fallback"],
     ["MeanVarianceNormalization"]),
    (["run", "{dir}/missing.braze"], ["no such file"]),
    (["run", "{dir}/m.onnx.braze", "--random"], ["no such file"]),
])
def test_cli_errors_are_one_line(tmp_path, capsys, argv, words):
    src = tmp_path / "m.onnx"
    onnx.save(_model(), src)
    argv = [a.format(src=src, dir=tmp_path) for a in argv]
    assert main(argv) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"braze {argv[0]}: error:"), lines
    for w in words:
        assert w in lines[0], (w, lines[0])


def test_cli_run_refuses_fallback_when_told(saved, capsys):
    assert main(["run", str(saved[0]), "--random", "--no-fallback"]) == 1
    assert "onnxruntime" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["compile", "run"])
def test_cli_help(command, capsys):
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    assert "artifact" in capsys.readouterr().out


def test_code_compiled_in_parallel_parts_saves_and_loads(tmp_path, monkeypatch):
    """Object code made of two parts (a parallel compile) is saved and loaded whole."""
    from compiler.codegen import compiled

    monkeypatch.setattr(compiled, "PARALLEL_MIN_GROUPS", 2)
    monkeypatch.setenv("BRAZE_COMPILE_JOBS", "2")
    monkeypatch.setenv("BRAZE_CACHE_DIR", "off")
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal((64, 48)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal((48, 40)).astype(np.float32), "w2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Tanh", ["h"], ["t"]),
             helper.make_node("MatMul", ["t", "w2"], ["u"]),
             helper.make_node("Softmax", ["u"], ["y"], axis=1)]
    g = helper.make_graph(nodes, "two_parts",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [32, 40])],
                          inits)
    m = bridge.compile_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    x = rng.standard_normal((32, 64)).astype(np.float32)
    want = m(x)[0]
    (part,) = [p.compiled for p in m.saved_specializations()[0].parts if p.compiled is not None]
    assert len(llvm_cpu.split_objects(part.object_code)) == 2
    m.save(tmp_path / "p.braze")
    np.testing.assert_array_equal(bridge.load(tmp_path / "p.braze")(x)[0], want)


def test_an_artifact_for_another_cpu_records_it_and_runs_where_its_features_are(tmp_path):
    """Compiled for x86-64-v3 (AVX2): the manifest names the target and the features it
    requires; this machine has them, so it loads and matches the host build."""
    x = _x()
    m = bridge.compile_onnx(_model(), target="cpu:x86-64-v3")
    m.save(tmp_path / "avx2.braze", input_shapes={"x": x.shape})
    with zipfile.ZipFile(tmp_path / "avx2.braze") as zf:
        target = json.loads(zf.read("manifest.json"))["target"]
    assert target["spec"] == "cpu:x86-64-v3" and target["cpu"] == "x86-64-v3"
    assert target["requires"] == ["avx", "avx2", "fma", "sse4.2"]
    loaded = bridge.load(tmp_path / "avx2.braze")
    np.testing.assert_allclose(loaded(x)[0], bridge.compile_onnx(_model())(x)[0], rtol=1e-6)


def test_cli_compile_for_another_cpu(tmp_path, capsys):
    onnx.save(_model(), tmp_path / "m.onnx")
    assert main(["compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "m.braze"),
                 "--shape", "x=64,64", "--cpu", "x86-64-v2"]) == 0
    assert "x86-64-v2" in capsys.readouterr().out
    x = _x()
    np.testing.assert_allclose(bridge.load(tmp_path / "m.braze")(x)[0],
                               bridge.compile_onnx(_model())(x)[0], rtol=1e-6)
    assert main(["compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "a.braze"),
                 "--shape", "x=64,64", "--cpu", "neoverse-n1"]) == 0
    with pytest.raises(ArtifactError, match="aarch64"):
        bridge.load(tmp_path / "a.braze")
