"""Smoke tests of the benchmark harness: tiny models, 1 warm-up and 2 rounds, no timing
assertions. They check the shape of the results (JSON, tables, chart) and that a
runtime that fails, at any stage, shows as n/a instead of ending the benchmark."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnxruntime = pytest.importorskip("onnxruntime")

from benchmarks import common, fusion, resnet50, runtimes  # noqa: E402
from benchmarks.common import Runtime, Settings  # noqa: E402

SMOKE = Settings(warmup=1, rounds=2)
RESULT_KEYS = {"runtime", "stock", "status", "reason", "compile_s", "max_rel_err",
               "samples_ms"}
STAT_KEYS = {"median_ms", "q1_ms", "q3_ms", "min_ms", "max_ms"}


def _raise(message):
    raise RuntimeError(message)


def fails_on_call(n):
    """A runtime whose n-th call raises (the first call is setup's)."""
    calls = {"n": 0}

    def run():
        calls["n"] += 1
        if calls["n"] >= n:
            raise RuntimeError(f"broke on call {n}")
        return np.ones(3, np.float32)

    return lambda: run


@pytest.fixture(scope="module")
def tiny_case():
    x = np.arange(3, dtype=np.float32)
    rts = [
        Runtime("torch eager", lambda: lambda: torch.from_numpy(x) * 2),
        Runtime("numpy", lambda: lambda: [x * 2]),
        Runtime("off by a bit", lambda: lambda: x * 2 + 0.01, stock=False),
        Runtime("broken setup", lambda: _raise("no such runtime\nsecond line")),
        Runtime("broken in warm-up", fails_on_call(2)),
        Runtime("broken in rounds", fails_on_call(4)),
        Runtime("wrong shape", lambda: lambda: np.ones(4, np.float32)),
    ]
    return common.measure("tiny", rts, SMOKE)


def by_name(case):
    return {r["runtime"]: r for r in case["results"]}


def test_case_structure(tiny_case):
    assert {"case", "unit", "rounds", "settings", "results"} <= set(tiny_case)
    assert tiny_case["rounds"] == 2
    for r in tiny_case["results"]:
        assert RESULT_KEYS <= set(r)
        assert r["status"] in ("ok", "n/a")
        if r["status"] == "ok":
            assert STAT_KEYS <= set(r) and len(r["samples_ms"]) == 2
            assert r["q1_ms"] <= r["median_ms"] <= r["q3_ms"]
        else:
            assert r["reason"] and not r["samples_ms"]
    json.loads(json.dumps(tiny_case))  # JSON-able as is


def test_errors_against_eager(tiny_case):
    rs = by_name(tiny_case)
    assert rs["torch eager"]["max_rel_err"] == 0.0
    assert rs["numpy"]["max_rel_err"] == 0.0
    assert rs["off by a bit"]["max_rel_err"] == pytest.approx(0.01 / 4, rel=1e-4)


def test_failures_become_na(tiny_case):
    rs = by_name(tiny_case)
    assert rs["broken setup"]["reason"] == "RuntimeError: no such runtime"
    assert "broke on call 2" in rs["broken in warm-up"]["reason"]
    assert "broke on call 4" in rs["broken in rounds"]["reason"]
    assert "shape" in rs["wrong shape"]["reason"]
    assert all(rs[n]["status"] == "ok" for n in ("torch eager", "numpy", "off by a bit"))


def test_tables_and_chart(tiny_case, tmp_path):
    payload = {"benchmark": "tiny", "machine": common.machine_info(),
               "settings": SMOKE.to_dict(), "cases": [tiny_case]}
    table = resnet50.report(payload)
    lines = [ln for ln in table.splitlines() if ln.startswith("| ")]
    assert len(lines) == 1 + len(tiny_case["results"])  # header and one row per runtime
    assert len({ln.count(" | ") for ln in lines}) == 1  # every row has every column
    assert "n/a (RuntimeError: no such runtime)" in table
    assert "1.00x" in table  # the fastest stock runtime
    png = common.bar_chart([tiny_case], tmp_path / "tiny.png", "tiny")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = common.write_json(payload, tmp_path / "tiny.json")
    assert json.loads(out.read_text())["cases"][0]["case"] == "tiny"


def test_results_section_is_replaced(tiny_case, tmp_path):
    md = tmp_path / "RESULTS.md"
    md.write_text("# Results\n\nIntro.\n")
    payload = {"benchmark": "tiny", "machine": common.machine_info(),
               "settings": Settings(budget_s=60).to_dict(), "cases": [tiny_case]}
    resnet50.update_results(payload, md)
    resnet50.update_results(payload, md, note="loaded machine")
    text = md.read_text()
    assert text.startswith("# Results\n\nIntro.\n")
    assert text.count("<!-- resnet50:begin -->") == 1 and "loaded machine" in text
    assert "| torch eager |" in text


def test_real_runtimes_on_a_tiny_model(tmp_path):
    """Stock runtimes run; braze and optional ones either run or show n/a."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()).eval()
    arrays = [np.random.default_rng(0).standard_normal((2, 8), dtype=np.float32)]
    path = runtimes.export_onnx(model, arrays, tmp_path / "tiny.onnx")
    rts = [runtimes.torch_eager(model, arrays), runtimes.onnxruntime(path, arrays),
           runtimes.openvino(path, arrays), runtimes.braze_onnx(path, arrays),
           runtimes.braze_torch(model, arrays),
           runtimes.torch_compiled(model, arrays, "bogus", backend="no-such-backend")]
    rs = by_name(common.measure("tiny model", rts, SMOKE))
    assert rs["onnxruntime"]["status"] == "ok" and rs["onnxruntime"]["max_rel_err"] < 1e-5
    assert rs["bogus"]["status"] == "n/a" and "no-such-backend" in rs["bogus"]["reason"]
    for name in ("openvino", "braze (compile_onnx)", "braze (torch.compile)"):
        r = rs[name]
        assert r["status"] == "n/a" or r["max_rel_err"] < 1e-4, r


@pytest.mark.parametrize("name", ["softmax", "chain", "add"])
def test_fusion_onnx_models_match_torch(name):
    """The hand-built ONNX models compute what their torch modules do."""
    case = next(c for c in fusion.cases() if c.name == name)
    module = fusion.torch_modules()[name]
    model = {"softmax": fusion.softmax_onnx, "chain": fusion.chain_onnx,
             "add": fusion.add_onnx}[name]()
    sess = runtimes.ort_session(model.SerializeToString())
    got = sess.run(None, {f"in{i}": a for i, a in enumerate(case.inputs)})
    want = common.as_arrays(module(*runtimes.as_tensors(case.inputs)))
    assert common.max_rel_err(got, want) < 1e-5


def test_fusion_report_lists_na_reasons(tiny_case):
    case = dict(tiny_case, description="tiny", case="tiny")
    case["results"] = [dict(r, runtime=fusion.BRAZE) if r["runtime"] == "broken setup"
                       else r for r in tiny_case["results"]]
    text = fusion.report({"cases": [case]})
    assert "- tiny, braze (compile_onnx): RuntimeError: no such runtime" in text
    row = text.splitlines()[2].strip("| ").split(" | ")
    assert len(row) == 9 and row[5] == "n/a" and row[6] == "-"


def test_quick_flags():
    args = resnet50.parse_args(["--quick"])
    assert args.batch == [1] and args.rounds == 3 and args.warmup == 1
    assert fusion.parse_args(["--quick"]).rounds == 3
