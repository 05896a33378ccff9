"""target="cuda" at the bridge: `braze compile --target cuda --emit ptx` (no GPU needed) on
the fusion benchmark's models, checked by ptxas for sm_80 and sm_90; compile_onnx's clear
error where no GPU is. Running on a GPU: tests/runtime/test_cuda.py (marked gpu)."""

from __future__ import annotations

import re
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import bridge
from bridge.cli import main
from compiler.codegen import nvptx
from compiler.errors import BrazeError
from runtime.cuda import no_device_reason

needs_ptxas = pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas not on PATH")


@pytest.fixture(scope="module")
def bench_models(tmp_path_factory):
    """The fusion benchmark's three cases as ONNX files (benchmarks/fusion.py)."""
    from pathlib import Path

    from benchmarks import fusion, runtimes

    d = Path(tmp_path_factory.mktemp("bench"))
    onnx.save(fusion.softmax_onnx(), str(d / "softmax.onnx"))
    onnx.save(fusion.chain_onnx(), str(d / "chain.onnx"))
    x = np.zeros((fusion.MLP_BATCH, fusion.MLP_FEATURES), np.float32)
    runtimes.export_onnx(fusion.torch_modules()["mlp"], [x], d / "mlp.onnx")
    return d


def _conv_relu() -> onnx.ModelProto:
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(
        nodes, "conv_relu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _ptx_files(out) -> list:
    return sorted(out.glob("cluster*.ptx"))


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("case,kernels", [("softmax", ["row"]), ("chain", ["loop"]),
                                          ("mlp", None)])
def test_compile_emits_ptx_that_ptxas_accepts(bench_models, tmp_path, capsys, case, kernels,
                                              arch):
    out = tmp_path / "ptx"
    argv = ["compile", str(bench_models / f"{case}.onnx"), "--target", "cuda", "--emit", "ptx",
            "--arch", arch, "-o", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    files = _ptx_files(out)
    assert len(files) == 1  # each model is one compiled cluster
    ptx = files[0].read_text()
    assert f".target {arch}" in ptx
    kinds = re.findall(r"^// k\d+ \((\w+),", ptx, re.M)
    assert ptx.count(".entry") == len(kinds)
    if kernels is not None:  # softmax and the 16-op chain: one kernel each
        assert kinds == kernels
    else:  # 4 x (layer norm; matmul with its bias; GELU and the residual)
        assert kinds.count("row") == 4 and kinds.count("contraction") == 4
    if "row" in kinds:
        assert "shfl.sync.bfly" in ptx
    nvptx.run_ptxas(ptx, arch)


def test_compile_ptx_skips_host_clusters_or_refuses_without_fallback(tmp_path, capsys):
    model = tmp_path / "conv.onnx"
    onnx.save(_conv_relu(), str(model))
    out = tmp_path / "ptx"
    assert main(["compile", str(model), "--target", "cuda", "-o", str(out)]) == 0
    assert _ptx_files(out) == []  # Conv is onnxruntime's, and the Relu after it too (cheap)
    assert "clusters: 0 compiled by braze, 1 on the host" in capsys.readouterr().out
    argv = ["compile", str(model), "--target", "cuda", "--no-fallback", "-o", str(out)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "cannot compile conv" in err and "not compiled by braze for CUDA" in err


@pytest.mark.parametrize("extra,words", [
    (["--emit", "ptx"], ["--target cpu", "--emit ptx"]),
    (["--target", "cuda", "--emit", "artifact"], ["--target cuda", "PTX"]),
    (["--arch", "sm_80"], ["--arch", "--target cuda"]),
    (["--target", "cuda", "--arch", "sm_1"], ["unknown CUDA architecture", "sm_90"]),
])
def test_compile_option_errors(tmp_path, capsys, extra, words):
    model = tmp_path / "conv.onnx"
    onnx.save(_conv_relu(), str(model))
    assert main(["compile", str(model), "-o", str(tmp_path / "out")] + extra) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("braze compile: error:"), err
    for w in words:
        assert w in err, (w, err)


def test_explain_for_cuda_names_library_class_ops(tmp_path, capsys):
    model = tmp_path / "conv.onnx"
    onnx.save(_conv_relu(), str(model))
    assert main(["explain", str(model), "--target", "cuda"]) == 0
    assert "not compiled by braze for CUDA" in capsys.readouterr().out


@pytest.mark.skipif(no_device_reason() is None, reason="a CUDA device is present")
def test_compile_onnx_for_cuda_without_a_gpu_says_so():
    with pytest.raises(BrazeError, match="target 'cuda': no CUDA device was found"):
        bridge.compile_onnx(_conv_relu(), target="cuda")
