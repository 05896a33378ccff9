"""The `braze` CLI: each command works, and each bad input gives one clear line."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bridge.cli import main
from tests.bridge import badmodels

# (case, exit status, words the one-line message must contain)
BAD_FILES = [
    ("missing", 1, ["does_not_exist.onnx"]),
    ("directory", 1, ["directory"]),
    ("not_onnx", 1, ["not", "ONNX"]),
    ("empty", 1, ["empty"]),
    ("truncated", 1, ["truncated.onnx"]),
    ("cycle", 1, ["cycle"]),
    ("dangling", 1, ["nowhere", "add0"]),
    ("unknown_domain", 1, ["com.example.nope", "frob0"]),
    ("unknown_op", 1, ["Frobnicate", "frob0"]),
    ("future_opset", 1, ["opset"]),
    ("zero_kernel", 1, ["pool0", "kernel_shape"]),
    ("no_kernel", 1, ["pool0", "kernel_shape"]),
    ("zero_stride", 1, ["pool0", "strides"]),
    ("div_by_zero", 1, ["div0", "zero"]),
    ("mod_by_zero", 1, ["div0", "zero"]),
    ("undefined_elem", 1, ["'x'", "element type"]),
    ("negative_dim", 1, ["-2"]),
]


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    return badmodels.write_bad_files(tmp_path_factory.mktemp("bad"))


@pytest.mark.parametrize("case,status,words", BAD_FILES, ids=[c[0] for c in BAD_FILES])
@pytest.mark.parametrize("command", ["explain", "run"])
def test_bad_file_gives_one_clear_line(bad_files, capsys, case, status, words, command):
    path = bad_files[case]
    argv = [command, str(path)] + (["--random"] if command == "run" else [])
    assert main(argv) == status
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"braze {command}: error:"), err
    for w in words:
        assert w.lower() in lines[0].lower(), (w, lines[0])


def _bn_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.uniform(0.5, 2, 8).astype(np.float32), "gamma"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "beta"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "mean"),
        numpy_helper.from_array(rng.uniform(0.5, 2, 8).astype(np.float32), "var"),
    ]
    nodes = [
        helper.make_node("Identity", ["w"], ["w_id"]),
        helper.make_node("Conv", ["x", "w_id"], ["c"], pads=[1, 1, 1, 1], name="conv0"),
        helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["bn"],
                         name="bn0"),
        helper.make_node("Relu", ["bn"], ["y"], name="relu0"),
    ]
    g = helper.make_graph(nodes, "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_optimize_folds_batchnorm_and_checks(tmp_path, capsys):
    src, dst = tmp_path / "m.onnx", tmp_path / "m.opt.onnx"
    onnx.save(_bn_model(), src)
    assert main(["optimize", str(src), "-o", str(dst)]) == 0
    out = capsys.readouterr().out
    assert "max rel diff" in out and "nodes: 4 ->" in out
    opt = onnx.load(dst)
    onnx.checker.check_model(opt)
    ops = [n.op_type for n in opt.graph.node]
    assert "BatchNormalization" not in ops and "Identity" not in ops
    assert ops.count("Conv") == 1
    assert [i.name for i in opt.graph.input] == ["x"]
    assert [o.name for o in opt.graph.output] == ["y"]


def test_optimize_needs_shapes_for_symbolic_inputs(tmp_path, capsys):
    m = _bn_model()
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    src = tmp_path / "dyn.onnx"
    onnx.save(m, src)
    assert main(["optimize", str(src), "-o", str(tmp_path / "o.onnx")]) == 1
    assert "--shape x=" in capsys.readouterr().err
    assert main(["optimize", str(src), "-o", str(tmp_path / "o.onnx"),
                 "--shape", "x=2,3,8,8"]) == 0


def test_run_and_explain(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    onnx.save(_bn_model(), src)
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(src), "--input", f"x={tmp_path / 'x.npy'}",
                 "--output-dir", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "y: f32[1, 8, 8, 8]" in out
    y = np.load(tmp_path / "out" / "y.npy")
    import onnxruntime as ort

    ref = ort.InferenceSession(str(src)).run(None, {"x": x})[0]
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    assert main(["explain", str(src)]) == 0
    assert "cluster" in capsys.readouterr().out.lower()


def test_run_reports_missing_and_extra_inputs(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    onnx.save(_bn_model(), src)
    assert main(["run", str(src)]) == 1
    assert "x" in capsys.readouterr().err
    np.save(tmp_path / "z.npy", np.zeros(3, np.float32))
    assert main(["run", str(src), "--random", "--input", f"zz={tmp_path / 'z.npy'}"]) == 1
    assert "zz" in capsys.readouterr().err


def test_help_for_every_command():
    for cmd in ["optimize", "explain", "compile", "run", "bench"]:
        r = subprocess.run([sys.executable, "-m", "bridge.cli", cmd, "--help"],
                           capture_output=True, text=True)
        assert r.returncode == 0 and "usage: braze" in r.stdout


def test_bench_times_braze_against_onnxruntime(tmp_path, capsys, monkeypatch):
    from bridge import bench

    monkeypatch.setattr(bench, "SETTLE_S", 0.0)
    src = tmp_path / "m.onnx"
    onnx.save(_bn_model(), src)
    assert main(["bench", str(src), "--rounds", "3", "--budget", "0", "--warmup", "1",
                 "--threads", "1"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line.split() for line in out.splitlines()
             if len(line.split()) == 6}  # the table's rows
    assert lines["onnxruntime"][3] == "1.00x"
    braze = lines["braze"]
    assert float(braze[1]) > 0 and braze[3].endswith("x") and float(braze[5]) < 1e-4
    assert "nodes compiled by braze" in out and "3 rounds" in out


def test_bench_refuses_bad_threads(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    onnx.save(_bn_model(), src)
    assert main(["bench", str(src), "--threads", "0"]) == 1
    assert "threads" in capsys.readouterr().err


def test_explain_kernels_prints_each_kernel_its_implementation_and_why(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    onnx.save(_bn_model(), src)
    assert main(["explain", str(src)]) == 0
    plain = capsys.readouterr().out
    assert "kernel 0" not in plain
    assert main(["explain", "--kernels", str(src)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(plain)
    assert "kernels:" in out and re.search(r"kernel \d+ \(contraction\) -> %\S+: conv", out)
    assert "[direct_conv: not Winograd: " in out  # 3 input channels: no Winograd
