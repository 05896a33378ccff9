"""benchmarks/zoo.py: the model list, BN calibration and the table (the models' timings
are the benchmark; here small stand-ins check the harness's arithmetic)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks import zoo, zoo_models


def test_model_list_covers_every_family_with_unique_names():
    models = zoo_models.all_models()
    names = [m.name for m in models]
    assert len(names) == len(set(names))
    assert {m.family for m in models} == {"conv", "transformer", "recurrent"}
    assert "inception_v3" in names and "lstm" in names


def test_calibrated_batchnorm_has_data_statistics():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    net[0].bias.data.fill_(5.0)  # the conv's outputs have mean near 5, not 0
    zoo_models.calibrate_batchnorm(net, 16)
    assert not net.training
    assert torch.all(net[1].running_mean > 3.0)


def test_fp32_noise_is_small_and_positive():
    """The noise is eager fp32 against the same weights run in float64 (the module
    itself stays float32), max |x - ref| / max |ref|."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(),
                              torch.nn.Linear(64, 8)).eval()
    x = np.random.default_rng(0).standard_normal((2, 64), dtype=np.float32)
    ref = zoo.fp64_reference(net, [x])
    assert ref[0].dtype == np.float64 and net[0].weight.dtype == torch.float32
    noise = zoo.fp32_noise(net, [x], ref)
    assert 0 < noise < 1e-5
    with torch.no_grad():
        got = net(torch.from_numpy(x)).double().numpy()
    assert noise == np.abs(got - ref[0]).max() / np.abs(ref[0]).max()
    assert zoo.fp32_noise(net, [x], None) is None


def test_errors_against_eager_and_float64():
    """check_errors fills both columns for every runtime that ran."""
    from benchmarks import common

    ref32, ref64 = [np.array([1.0, -2.0], np.float32)], [np.array([1.0, -2.0])]
    r = common.Result("braze (compile_onnx)", stock=False)
    outputs = {"torch eager": ref32, r.runtime: [np.array([1.0, -2.5], np.float32)]}
    common.check_errors([r], outputs, "torch eager", ref64)
    assert r.max_rel_err == 0.25 and r.err_vs_fp64 == 0.25
    assert r.to_dict()["err_vs_fp64"] == 0.25


def _result(name, stock, median, err=1e-7, compile_s=1.0):
    return {"runtime": name, "stock": stock, "status": "ok", "median_ms": median,
            "max_rel_err": err, "compile_s": compile_s, "reason": None}


def test_table_ratios_are_to_the_fastest_stock_runtime():
    case = {"case": "m", "fp32_noise": 1e-7, "results": [
        _result("torch eager", True, 10.0), _result("onnxruntime", True, 4.0),
        _result("openvino", True, 5.0), _result("braze (torch.compile)", False, 3.0),
        _result("braze (compile_onnx)", False, 2.0)]}
    row = zoo.model_row(case)
    assert row[1] == "2.00 (0.50x)" and row[2] == "3.00 (0.75x)"
    assert row[-3] == "1.0e-07 / 1.0e-07" and row[-2] == "- / -" and row[-1] == "1.0e-07"
    line = zoo.geomean_line([case, dict(case, case="n")])
    assert "braze (compile_onnx): 0.50x over 2 models" in line


@pytest.mark.parametrize("argv", [["--list"]])
def test_list_names_models(argv, capsys):
    zoo.main(argv)
    assert "mobilenet_v2 (conv)" in capsys.readouterr().out


def test_zero_initialized_weights_get_random_values():
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    torch.nn.init.zeros_(net[1].weight)
    before = net[0].weight.clone()
    zoo_models.randomize_zero_weights(net)
    assert torch.any(net[1].weight != 0) and torch.equal(net[0].weight, before)


def test_cpu_targets_get_their_own_runtime_and_column(tmp_path):
    args = zoo.parse_args(["--cpu", "znver3", "--only", "compile_onnx", "--no-inductor"])
    assert args.cpu == ["znver3"] and args.only == ["compile_onnx"]
    net = torch.nn.Linear(4, 4).eval()
    x = np.zeros((1, 4), np.float32)
    names = [rt.name for rt in zoo.zoo_runtimes(net, [x], tmp_path / "m.onnx", False,
                                                args.cpu, args.only)]
    assert names == ["torch eager", "braze (compile_onnx)",
                     "braze (compile_onnx, cpu:znver3)"]
    case = {"case": "m", "fp32_noise": 1e-7, "results": [
        _result("torch eager", True, 10.0), _result("onnxruntime", True, 4.0),
        _result("braze (compile_onnx)", False, 2.0),
        _result("braze (compile_onnx, cpu:znver3)", False, 3.0)]}
    table = zoo.report({"cases": [case]})
    assert "(compile_onnx, cpu:znver3) ms (vs best)" in table and "3.00 (0.75x)" in table
    assert "braze (compile_onnx, cpu:znver3): 0.75x over 1 models" in table


def test_extra_models_are_apart_from_the_named_ones_and_selected_by_flag():
    named = {m.name for m in zoo_models.all_models()}
    extra = [m.name for m in zoo_models.extra_models()]
    assert len(extra) == len(set(extra)) and not named & set(extra)
    assert [m.name for m in zoo.selected(zoo.parse_args(["--extra"]))] == extra
    picked = zoo.selected(zoo.parse_args(["--models", "vgg11_bn", "resnet18"]))
    assert {m.name for m in picked} == {"vgg11_bn", "resnet18"}


def test_segmentation_wrapper_returns_the_out_map():
    class Seg(torch.nn.Module):
        def forward(self, x):
            return {"out": x * 2, "aux": x}

    m = zoo_models.FirstOutput(Seg(), key="out")
    x = torch.ones(1, 3)
    torch.testing.assert_close(m(x), x * 2)
