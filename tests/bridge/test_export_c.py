"""A model exported as a C library (issue 14): a C program built by the system `cc` runs it
with no Python and gets compile_onnx's outputs bit for bit; the library depends on no
Python, numpy or braze; a model with host nodes is refused with each node and why."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import bridge
from bridge.cli import main
from bridge import ExportRefused

CC = shutil.which("cc")
needs_cc = pytest.mark.skipif(CC is None, reason="no system C compiler `cc` on PATH: the "
                              "library's driver and the test program are compiled with it")
RNG = np.random.default_rng(0)

# A C program: reads input 0 from argv[1], runs the model, writes output 0 to argv[2].
MAIN_C = """
#include <stdio.h>
#include <stdlib.h>
#include "NAME.h"

int main(int argc, char **argv) {
  static float in[NAME_UP_INPUT0_SIZE], out[NAME_UP_OUTPUT0_SIZE];
  void *scratch = malloc(NAME_UP_SCRATCH_BYTES);
  FILE *f = fopen(argv[1], "rb");
  if (fread(in, sizeof in, 1, f) != 1) return 2;
  fclose(f);
  if (NAME_run(in, out, scratch) != 0) return 3;
  f = fopen(argv[2], "wb");
  fwrite(out, sizeof out, 1, f);
  fclose(f);
  free(scratch);
  return 0;
}
"""


def _model(name, nodes, inits, x_shape, y_shape) -> onnx.ModelProto:
    g = helper.make_graph(nodes, name,
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
                          [numpy_helper.from_array(a, n) for n, a in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _w(*shape) -> np.ndarray:
    return (RNG.standard_normal(shape) * 0.2).astype(np.float32)


def mlp() -> onnx.ModelProto:
    inits = {"w1": _w(64, 128), "b1": _w(128), "w2": _w(128, 10), "b2": _w(10)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["o"]),
             helper.make_node("Add", ["o", "b2"], ["y"])]
    return _model("mlp", nodes, inits, [8, 64], [8, 10])


def conv_bn() -> onnx.ModelProto:
    """conv -> BatchNormalization (folded into the conv by braze) -> relu -> conv."""
    inits = {"w": _w(16, 3, 3, 3), "scale": 1 + _w(16), "bias": _w(16), "mean": _w(16),
             "var": np.abs(1 + _w(16)), "w2": _w(8, 16, 3, 3)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"],
                              ["bn"]),
             helper.make_node("Relu", ["bn"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])]
    return _model("convbn", nodes, inits, [1, 3, 32, 32], [1, 8, 16, 16])


def softmax() -> onnx.ModelProto:
    inits = {"w": _w(32, 100)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["l"]),
             helper.make_node("Softmax", ["l"], ["y"], axis=-1)]
    return _model("softmax", nodes, inits, [4, 32], [4, 100])


def host_model() -> onnx.ModelProto:
    """Add (braze) then MeanVarianceNormalization (no braze converter: a host node)."""
    inits = {"w": _w(64), "axis": np.array(1, np.int64)}
    nodes = [helper.make_node("Add", ["x", "w"], ["a"], name="add"),
             helper.make_node("MeanVarianceNormalization", ["a"], ["y"], name="mvn", axes=[1])]
    return _model("hosty", nodes, inits, [4, 64], [4, 64])


def _run_c(outdir: Path, name: str, x: np.ndarray, out_shape, static: bool) -> np.ndarray:
    (outdir / "main.c").write_text(MAIN_C.replace("NAME_UP", name.upper())
                                   .replace("NAME", name))
    lib = [f"lib{name}.a"] if static else [f"-L.", f"-l{name}", "-Wl,-rpath,$ORIGIN"]
    exe = outdir / ("main_static" if static else "main_shared")
    subprocess.run([CC, "-O2", "main.c", "-I.", *lib, "-lm", "-o", exe.name], cwd=outdir,
                   check=True)
    x.tofile(outdir / "x.bin")
    subprocess.run([str(exe), "x.bin", "y.bin"], cwd=outdir, check=True)
    return np.fromfile(outdir / "y.bin", np.float32).reshape(out_shape)


@needs_cc
@pytest.mark.parametrize("make", [mlp, conv_bn, softmax], ids=["mlp", "conv_bn", "softmax"])
def test_c_program_matches_compile_onnx_bit_for_bit(make, tmp_path):
    model = make()
    name = model.graph.name
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = RNG.standard_normal(shape).astype(np.float32)
    compiled = bridge.compile_onnx(model, threads=1)
    want = compiled(x)[0]
    files = compiled.export_c(tmp_path, name=name)
    assert set(files) >= {"header", "static", "shared", "readme"}
    header = files["header"].read_text()
    assert f"int {name}_run(const float *in0, float *out0, void *scratch);" in header
    assert f"#define {name.upper()}_INPUT0_SIZE {x.size}" in header
    assert f"#define {name.upper()}_THREADS 1" in header
    for static in (True, False):
        got = _run_c(tmp_path, name, x, want.shape, static)
        assert np.array_equal(got, want), (static, np.abs(got - want).max())
    # against the host framework too (onnxruntime), within float tolerance
    import onnxruntime as ort

    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def _needed(lib: Path) -> list[str]:
    out = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True,
                         check=True).stdout
    return [line.split("[")[1].split("]")[0] for line in out.splitlines() if "(NEEDED)" in line]


@needs_cc
@pytest.mark.skipif(shutil.which("readelf") is None, reason="no readelf (binutils) on PATH")
@pytest.mark.parametrize("threads", [1, 2])
def test_library_needs_only_libc_libm_and_gomp_with_threads(threads, tmp_path):
    files = bridge.compile_onnx(mlp()).export_c(tmp_path, name="mlp", threads=threads)
    needed = _needed(files["shared"])
    assert all(re.match(r"lib(c|m|gomp)\.so", n) for n in needed), needed
    assert any(n.startswith("libgomp") for n in needed) == (threads > 1), needed
    assert not any(bad in " ".join(needed) for bad in ("python", "numpy", "braze"))
    if shutil.which("ldd"):
        ldd = subprocess.run(["ldd", str(files["shared"])], capture_output=True,
                             text=True).stdout
        assert "python" not in ldd and "numpy" not in ldd, ldd
    # the static library's undefined symbols: libc/libm ones, and GOMP only when threaded
    nm = subprocess.run(["nm", "-u", str(files["static"])], capture_output=True, text=True)
    undefined = {line.split()[-1] for line in nm.stdout.splitlines() if line.strip()
                 and not line.endswith(":")}
    strong_gomp = [line for line in nm.stdout.splitlines() if " U GOMP" in line]
    assert bool(strong_gomp) == (threads > 1), nm.stdout
    assert not any("Py" in s for s in undefined), undefined


@needs_cc
def test_threaded_library_matches_too(tmp_path):
    x = RNG.standard_normal((1, 3, 32, 32)).astype(np.float32)
    compiled = bridge.compile_onnx(conv_bn(), threads=2)
    want = compiled(x)[0]
    compiled.export_c(tmp_path, name="convbn", threads=2)
    (tmp_path / "main.c").write_text(MAIN_C.replace("NAME_UP", "CONVBN")
                                     .replace("NAME", "convbn"))
    subprocess.run([CC, "-O2", "main.c", "-I.", "libconvbn.a", "-lm", "-lgomp", "-o", "m"],
                   cwd=tmp_path, check=True)
    x.tofile(tmp_path / "x.bin")
    subprocess.run(["./m", "x.bin", "y.bin"], cwd=tmp_path, check=True)
    got = np.fromfile(tmp_path / "y.bin", np.float32).reshape(want.shape)
    assert np.array_equal(got, want)


@needs_cc
def test_host_nodes_are_refused_with_each_node_and_why(tmp_path):
    with pytest.raises(ExportRefused) as e:
        bridge.compile_onnx(host_model()).export_c(tmp_path, name="hosty")
    text = str(e.value)
    assert "MeanVarianceNormalization" in text and "'mvn'" in text, text
    assert "add" not in text.split("\n", 1)[1], text  # only the host node is listed
    assert isinstance(e.value, bridge.BrazeError)
    assert not (tmp_path / "libhosty.so").exists()


@needs_cc
def test_cli_emit_c(tmp_path, capsys):
    path = tmp_path / "softmax.onnx"
    model = softmax()
    onnx.save(model, path)
    rc = main(["compile", str(path), "--emit", "c", "-o", str(tmp_path / "out"),
               "--name", "sm", "--threads", "1"])
    assert rc == 0
    for f in ("sm.h", "libsm.a", "libsm.so", "README.txt"):
        assert (tmp_path / "out" / f).is_file(), f
    readme = (tmp_path / "out" / "README.txt").read_text()
    assert "cc -O2 main.c -I. libsm.a -lm" in readme
    x = RNG.standard_normal((4, 32)).astype(np.float32)
    want = bridge.compile_onnx(model, threads=1)(x)[0]
    got = _run_c(tmp_path / "out", "sm", x, want.shape, static=True)
    assert np.array_equal(got, want)


@needs_cc
@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler `c++` on PATH")
def test_header_and_library_work_from_cpp(tmp_path):
    x = RNG.standard_normal((8, 64)).astype(np.float32)
    compiled = bridge.compile_onnx(mlp(), threads=1)
    want = compiled(x)[0]
    compiled.export_c(tmp_path, name="mlp")
    (tmp_path / "main.cpp").write_text(MAIN_C.replace("NAME_UP", "MLP").replace("NAME", "mlp")
                                       .replace("void *scratch = malloc",
                                                "void *scratch = (void *)malloc"))
    subprocess.run(["c++", "-O2", "main.cpp", "-I.", "libmlp.a", "-lm", "-o", "m"],
                   cwd=tmp_path, check=True)
    x.tofile(tmp_path / "x.bin")
    subprocess.run(["./m", "x.bin", "y.bin"], cwd=tmp_path, check=True)
    assert np.array_equal(np.fromfile(tmp_path / "y.bin", np.float32).reshape(want.shape), want)


CROSS = "aarch64-linux-gnu"
needs_cross = pytest.mark.skipif(
    shutil.which(f"{CROSS}-gcc") is None or shutil.which("qemu-aarch64") is None,
    reason=f"cross-compiling needs {CROSS}-gcc and qemu-aarch64 (Debian packages "
    "gcc-aarch64-linux-gnu and qemu-user; `make test-cross` installs them and runs this)")


@pytest.mark.cross
@needs_cross
@pytest.mark.parametrize("make", [mlp, conv_bn, softmax], ids=["mlp", "conv_bn", "softmax"])
def test_cross_compiled_library_runs_under_qemu(make, tmp_path):
    """--triple aarch64-linux-gnu --cpu neoverse-n1: an Arm ELF library; a program linked
    by the cross gcc runs under qemu-aarch64 and agrees with this machine's run."""
    model = make()
    name = model.graph.name
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    out = tmp_path / "out"
    assert main(["compile", str(path), "--emit", "c", "-o", str(out), "--name", name,
                 "--triple", CROSS, "--cpu", "neoverse-n1"]) == 0
    elf = subprocess.run(["readelf", "-h", str(out / f"lib{name}.so")], capture_output=True,
                         text=True, check=True).stdout
    assert "AArch64" in elf, elf
    (out / "main.c").write_text(MAIN_C.replace("NAME_UP", name.upper()).replace("NAME", name))
    subprocess.run([f"{CROSS}-gcc", "-O2", "-static", "main.c", "-I.", f"lib{name}.a", "-lm",
                    "-o", "m"], cwd=out, check=True)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = RNG.standard_normal(shape).astype(np.float32)
    x.tofile(out / "x.bin")
    subprocess.run(["qemu-aarch64", "./m", "x.bin", "y.bin"], cwd=out, check=True)
    want = bridge.compile_onnx(model, threads=1)(x)[0]
    got = np.fromfile(out / "y.bin", np.float32).reshape(want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_missing_compiler_is_a_braze_error_with_the_reason(tmp_path, capsys):
    from bridge.export_c import write_library

    with pytest.raises(bridge.BrazeError, match="no 'no-such-cc' found"):
        write_library(bridge.compile_onnx(mlp()), tmp_path, name="mlp", cc="no-such-cc")
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp(), path)
    assert main(["compile", str(path), "-o", str(tmp_path / "x.braze"), "--name", "m"]) == 1
    assert "--name is for --emit c" in capsys.readouterr().err


@needs_cc
def test_torch_module_exports_through_bridge_export_c(tmp_path):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                              torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 64, 10),
                              torch.nn.Softmax(dim=-1)).eval()
    x = torch.randn(2, 3, 8, 8)
    files = bridge.export_c(net, (x,), tmp_path, name="tnet")
    assert "int tnet_run(const float *in0, float *out0, void *scratch);" in \
        files["header"].read_text()
    with torch.no_grad():
        want = net(x).numpy()
    got = _run_c(tmp_path, "tnet", x.numpy(), want.shape, static=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def gather_model() -> onnx.ModelProto:
    """y = table[idx] (idx: int64 input), so an index out of range is a run-time fault."""
    table = _w(10, 4)
    g = helper.make_graph(
        [helper.make_node("Gather", ["table", "idx"], ["y"], axis=0)], "gath",
        [helper.make_tensor_value_info("idx", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
        [numpy_helper.from_array(table, "table")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@needs_cc
def test_run_returns_the_fault_word(tmp_path):
    """An index out of range: compile_onnx raises BrazeIndexError; the C call returns
    GATH_FAULT_INDEX (and 0 for indices in range, with compile_onnx's values)."""
    model = gather_model()
    compiled = bridge.compile_onnx(model, threads=1)
    files = compiled.export_c(tmp_path, name="gath")
    assert "int gath_run(const int64_t *in0, float *out0, void *scratch);" in \
        files["header"].read_text()
    (tmp_path / "main.c").write_text(
        "#include <stdio.h>\n#include <stdlib.h>\n#include \"gath.h\"\n"
        "int main(int argc, char **argv) {\n"
        "  int64_t idx[3] = {atoll(argv[1]), 2, -1}; float y[12];\n"
        "  void *s = malloc(GATH_SCRATCH_BYTES);\n"
        "  int rc = gath_run(idx, y, s);\n"
        "  printf(\"%d\\n\", rc);\n"
        "  for (int i = 0; i < 12; i++) printf(\"%.9g\\n\", y[i]);\n  return 0;\n}\n")
    subprocess.run([CC, "main.c", "-I.", "libgath.a", "-lm", "-o", "m"], cwd=tmp_path,
                   check=True)
    ok = subprocess.run(["./m", "7"], cwd=tmp_path, capture_output=True, text=True,
                        check=True).stdout.split()
    assert ok[0] == "0"
    want = compiled(np.array([7, 2, -1], np.int64))[0]
    assert np.array_equal(np.array(ok[1:], np.float32).reshape(3, 4), want)
    bad = subprocess.run(["./m", "12"], cwd=tmp_path, capture_output=True, text=True,
                         check=True).stdout.split()
    assert bad[0] == "1"  # GATH_FAULT_INDEX
    with pytest.raises(bridge.BrazeError):
        compiled(np.array([12, 2, -1], np.int64))
