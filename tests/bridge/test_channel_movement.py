"""Channel split, concat and shuffle on braze's channels-last layout (issue 11): a stack
of ShuffleNet v2 units through `bridge.compile_onnx` computes what onnxruntime does,
and the layout pass leaves no NCHW<->NHWC transpose inside the network (only the image
in and the features out), so the shuffle is index arithmetic over NHWC's last dims."""

from __future__ import annotations

import warnings

import numpy as np
import onnxruntime as ort
import pytest
import torch
import torch.nn as nn

import bridge
from compiler.passes.layout import TO_FIRST, TO_LAST

RTOL, ATOL = 1e-4, 1e-5


def _units() -> nn.Module:
    from torchvision.models.shufflenetv2 import InvertedResidual

    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 24, 3, 1, 1), nn.ReLU(),
                      InvertedResidual(24, 48, 2), InvertedResidual(48, 48, 1),
                      InvertedResidual(48, 48, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    for mod in m.modules():  # non-trivial batch-norm statistics
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
    return m.eval()


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("shuffle") / "units.onnx"
    x = np.random.default_rng(0).standard_normal((1, 3, 20, 20)).astype(np.float32)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_units(), (torch.from_numpy(x),), str(path), input_names=["x"],
                          output_names=["y"], opset_version=17, dynamo=False)
    return str(path), x


def _compiled_graph(compiled):
    spec = next(iter(compiled._specs.values()))
    parts = [p.compiled for p in spec.parts if p.compiled is not None]
    assert len(parts) == 1 and len(spec.parts) == 1  # one compiled step, no host step
    return parts[0]


@pytest.mark.parametrize("threads", [1, 2])
def test_shuffle_units_match_onnxruntime(model, threads):
    path, x = model
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = bridge.compile_onnx(path, threads=threads)(x)
    got = got[0] if isinstance(got, (list, tuple)) else got
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL * max(1.0, np.abs(want).max()))


def test_no_layout_transpose_inside_the_network(model):
    path, x = model
    compiled = bridge.compile_onnx(path)
    compiled(x)
    cg = _compiled_graph(compiled)
    layout = [n for k in cg.kernels for n in k.nodes
              if n.op == "transpose" and tuple(n.attrs["perm"]) in (TO_FIRST, TO_LAST)]
    assert len(layout) == 1  # the image in; the pooled features leave as a reshape
    shuffles = [n for k in cg.kernels for n in k.nodes if n.op == "transpose"
                and len(n.attrs["perm"]) == 5]
    assert shuffles and all(tuple(n.attrs["perm"]) == (0, 1, 2, 4, 3) for n in shuffles)
    # every concat is over NHWC's channels
    cats = [n for k in cg.kernels for n in k.nodes if n.op == "concat"]
    assert cats and all(n.attrs["axis"] == 3 for n in cats)


def test_shuffle_units_copy_at_most_once_per_unit(model):
    """Between the convs, a unit's split, concat and shuffle are loop kernels of movement
    ops only: the downsampling unit's output is read by the next unit's conv through one
    kernel, each stride-1 unit writes its shuffled output once (and its conv's half once
    more: the conv reads a buffer of its own); the last shuffle runs inside the pooling."""
    path, x = model
    compiled = bridge.compile_onnx(path)
    compiled(x)
    cg = _compiled_graph(compiled)
    loops = [k for k in cg.kernels if k.kind == "loop"][1:]  # after the image's pad
    movement = {"concat", "reshape", "transpose", "slice"}
    assert all({n.op for n in k.nodes} <= movement for k in loops)
    assert len(loops) == 3
