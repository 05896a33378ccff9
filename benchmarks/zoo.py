"""Models people bring, braze against stock runtimes: `python -m benchmarks.zoo`.

Convolutional networks (torchvision), transformers (torchvision, torch.nn,
`transformers` configs) and recurrent nets (torch.nn), fp32, batch 1, random weights
with calibrated BatchNorm statistics (benchmarks/zoo_models.py). Per model, in one
process with ResNet-50's method (benchmarks/common.py): torch eager, inductor with
freezing, onnxruntime and OpenVINO on a TorchScript ONNX export, and braze through
both front ends (torch.compile(backend="braze") and bridge.compile_onnx on the same
file).

Columns: each braze front end's median and its ratio to the fastest stock runtime,
the stock runtimes' medians, braze's compile seconds, braze's max relative error
against eager fp32 and against the same model run in float64 (same weights, inputs
widened), and the model's own fp32 rounding noise (eager fp32 against that float64
run), the scale braze's error is judged on (max |x - ref| / max |ref| throughout).

`--models a b` picks models (`--list` names them); `--cpu x86-64-v3 x86-64-v2` also times
braze (compile_onnx) built for those CPUs (kernels for them, run here: each gets its own
column), `--only` keeps the runtimes whose names contain a word; `--update-results`
rewrites the zoo section of benchmarks/RESULTS.md. A full run takes a long time on two
cores (inductor compiles each model); `--no-inductor` leaves it out.
"""

from __future__ import annotations

import argparse
import copy
import faulthandler
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks import common, runtimes
from benchmarks.common import OUT_DIR, RESULTS_MD, Settings, fmt, fmt_err
from benchmarks.zoo_models import ZooModel, all_models, extra_models

DEFAULT_WARMUP = 2
DEFAULT_ROUNDS = 15
# Seconds of timed rounds per model at most; with about six runtimes this keeps a
# large model's timing near a minute, whatever its speed.
MODEL_BUDGET_S = 45.0
BRAZE = ("braze (compile_onnx)", "braze (torch.compile)")
STOCK = ("torch eager", "torch.compile (inductor, freezing)", "onnxruntime", "openvino")


def fp64_reference(module, arrays: list[np.ndarray]) -> list[np.ndarray] | None:
    """The model's outputs computed in float64 (a copy of the same weights, the inputs
    widened), or None if the model does not run in float64."""
    import torch

    try:
        with torch.no_grad():
            return common.as_arrays(copy.deepcopy(module).double()(*[
                torch.from_numpy(a.astype(np.float64) if a.dtype == np.float32 else a)
                for a in arrays]))
    except Exception as exc:  # a model with float32-only ops: say so in the table
        common.progress(f"fp64 reference failed: {common.describe_error(exc)}")
        return None


def fp32_noise(module, arrays: list[np.ndarray], ref: list[np.ndarray] | None) -> float | None:
    """max rel err of eager fp32 against the float64 reference `ref` on the same inputs
    (None without one): the model's own rounding noise."""
    import torch

    if ref is None:
        return None
    with torch.no_grad():
        got = common.as_arrays(module(*[torch.from_numpy(a) for a in arrays]))
    return common.max_rel_err(got, ref)


def zoo_runtimes(module, arrays, onnx_path: Path | None, inductor: bool, cpus=(), only=()):
    """The runtimes compared on one model (torch eager first: the reference); braze's
    ONNX front end also built for each CPU of `cpus` (LLVM names); only those `only`
    names (substrings), if given."""
    static = {"dynamic": False}
    rts = [runtimes.torch_eager(module, arrays)]
    if inductor:
        rts.append(runtimes.torch_compiled(module, arrays, STOCK[1],
                                           options={"freezing": True}, **static))
    if onnx_path is not None:
        rts += [runtimes.onnxruntime(onnx_path, arrays), runtimes.openvino(onnx_path, arrays)]
    rts.append(runtimes.torch_compiled(module, arrays, BRAZE[1], stock=False,
                                       backend="braze", **static))
    if onnx_path is not None:
        rts.append(runtimes.braze_onnx(onnx_path, arrays))
        rts += [runtimes.braze_onnx(onnx_path, arrays, t) for t in runtimes.cpu_targets(cpus)]
    return runtimes.chosen(rts, only)


def export(module, arrays, path: Path) -> Path | None:
    """The ONNX export, or None (with the reason printed) when the exporter fails. MHA's
    fast path is off while exporting: its fused op has no ONNX form, and the exported
    graph computes the same function either way."""
    import torch

    before = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        return runtimes.export_onnx(module, arrays, path)
    except Exception as exc:
        common.progress(f"ONNX export failed: {common.describe_error(exc)}")
        return None
    finally:
        torch.backends.mha.set_fastpath_enabled(before)


def run_model(zm: ZooModel, settings: Settings, workdir: Path, inductor: bool, cpus=(),
              only=()) -> dict:
    """Build, export, check and time one model."""
    import torch

    torch._dynamo.reset()
    before = torch.backends.mha.get_fastpath_enabled()
    if zm.mha_fast_path is not None:
        torch.backends.mha.set_fastpath_enabled(zm.mha_fast_path)
    rnn_before = torch._dynamo.config.allow_rnn
    torch._dynamo.config.allow_rnn = zm.allow_rnn
    try:
        common.progress(f"{zm.name}: building")
        module, arrays = zm.build()
        ref64 = fp64_reference(module, arrays)
        noise = fp32_noise(module, arrays, ref64)
        onnx_path = export(module, arrays, workdir / f"{zm.name}.onnx")
        case = common.measure(zm.name, zoo_runtimes(module, arrays, onnx_path, inductor, cpus,
                                                       only),
                              settings, fp64=ref64)
    finally:
        torch.backends.mha.set_fastpath_enabled(before)
        torch._dynamo.config.allow_rnn = rnn_before
    case.update(family=zm.family, fp32_noise=noise, note=zm.note)
    return case


def braze_cells(case: dict, name: str, best: float | None) -> list[str]:
    """A braze front end's median (ratio to the fastest stock runtime)."""
    r = common.result_for(case, name)
    if r is None or r["status"] != "ok":
        return [common.na(r) if r else "-"]
    ratio = f" ({r['median_ms'] / best:.2f}x)" if best else ""
    return [f"{fmt(r['median_ms'])}{ratio}"]


def stock_cell(case: dict, name: str) -> str:
    r = common.result_for(case, name)
    if r is None:
        return "-"
    return fmt(r["median_ms"]) if r["status"] == "ok" else common.na(r)


def braze_field(case: dict, key: str, show) -> str:
    """One field of both braze front ends, 'onnx / torch'."""
    cells = []
    for name in BRAZE:
        r = common.result_for(case, name)
        cells.append(show(r.get(key)) if r and r["status"] == "ok" else "-")
    return " / ".join(cells)


def target_names(cases: list[dict]) -> list[str]:
    """braze (compile_onnx) built for other CPUs (--cpu), in the order they ran."""
    names = []
    for case in cases:
        for r in case["results"]:
            if not r["stock"] and r["runtime"] not in BRAZE and r["runtime"] not in names:
                names.append(r["runtime"])
    return names


def model_row(case: dict, others=()) -> list[str]:
    """A model's cells: braze's front ends, then braze built for `others` (other CPUs),
    the stock runtimes, compile seconds and errors."""
    best = common.fastest_stock_ms(case)
    row = [case["case"]]
    for name in (*BRAZE, *others):
        row += braze_cells(case, name, best)
    row += [stock_cell(case, name) for name in STOCK]
    row += [braze_field(case, "compile_s", fmt), braze_field(case, "max_rel_err", fmt_err),
            braze_field(case, "err_vs_fp64", fmt_err), fmt_err(case.get("fp32_noise"))]
    return row


def ratios(cases: list[dict], name: str) -> list[float]:
    """The front end's ratio to the fastest stock runtime on each model where both ran."""
    out = []
    for case in cases:
        r, best = common.result_for(case, name), common.fastest_stock_ms(case)
        if r and r["status"] == "ok" and best:
            out.append(r["median_ms"] / best)
    return out


def geomean_line(cases: list[dict]) -> str:
    """Geometric means of braze's ratios, per front end (and per other CPU built for)."""
    parts = []
    for name in (*BRAZE, *target_names(cases)):
        rs = ratios(cases, name)
        if rs:
            parts.append(f"{name}: {float(np.exp(np.mean(np.log(rs)))):.2f}x over "
                         f"{len(rs)} models, worst {max(rs):.2f}x")
    return "Geometric mean of the ratio to the fastest stock runtime: " + "; ".join(parts)


def report(payload: dict) -> str:
    others = target_names(payload["cases"])
    headers = ["model", "braze onnx ms (vs best)", "braze torch ms (vs best)",
               *(f"{name.removeprefix('braze ')} ms (vs best)" for name in others),
               "eager", "inductor+freezing", "onnxruntime", "openvino",
               "braze compile s (onnx / torch)", "braze max rel err (onnx / torch)",
               "braze err vs fp64 (onnx / torch)", "fp32 noise"]
    rows = [model_row(c, others) for c in payload["cases"]]
    return common.markdown_table(headers, rows) + "\n\n" + geomean_line(payload["cases"])


def results_section(payload: dict, note: str | None = None) -> str:
    s = payload["settings"]
    lines = [f"Machine: {common.machine_line(payload['machine'])}.",
             f"Settings: batch 1, fp32, {s['threads']} threads, {s['warmup']} warm-up "
             f"call(s), up to {s['rounds']} interleaved rounds (budget "
             f"{s['budget_s']:.0f} s per model). Medians in ms."]
    if note:
        lines.append(f"Note: {note}")
    return "\n".join(lines) + "\n\n" + report(payload)


def parse_args(argv):
    names = [m.name for m in all_models() + extra_models()]
    p = argparse.ArgumentParser(prog="python -m benchmarks.zoo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", choices=names, metavar="MODEL",
                   help="models to run (default: all; --list names them)")
    p.add_argument("--family", choices=["conv", "transformer", "recurrent"],
                   help="only the models of one family")
    p.add_argument("--extra", action="store_true",
                   help="the models no issue names instead (zoo_models.extra_models)")
    p.add_argument("--list", action="store_true", help="print the model names and exit")
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP)
    p.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    p.add_argument("--budget", type=float, default=MODEL_BUDGET_S,
                   help="seconds of timed rounds per model at most")
    p.add_argument("--no-inductor", action="store_true", help="leave inductor out")
    common.add_target_args(p)
    p.add_argument("--out", type=Path, default=OUT_DIR)
    p.add_argument("--update-results", action="store_true",
                   help="rewrite the zoo section of benchmarks/RESULTS.md")
    p.add_argument("--note", help="a sentence to print under the machine in RESULTS.md")
    return p.parse_args(argv)


def selected(args) -> list[ZooModel]:
    models = extra_models() if args.extra else all_models()
    if args.models:
        models = [m for m in all_models() + extra_models() if m.name in args.models]
    if args.family:
        models = [m for m in models if m.family == args.family]
    return models


def main(argv=None) -> dict:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.list:
        print("\n".join(f"{m.name} ({m.family})" for m in all_models() + extra_models()))
        return {}
    faulthandler.enable()
    common.configure_threads()
    settings = Settings(warmup=args.warmup, rounds=args.rounds, budget_s=args.budget or None,
                        lead_in=1)
    with tempfile.TemporaryDirectory(prefix="braze-zoo-") as tmp, \
            common.fresh_compile_caches(Path(tmp)):
        cases = [run_model(m, settings, Path(tmp), not args.no_inductor, args.cpu, args.only)
                 for m in selected(args)]
    payload = {"benchmark": "zoo", "machine": common.machine_info(),
               "settings": settings.to_dict(), "cases": cases}
    print(report(payload))
    common.progress(f"wrote {common.write_json(payload, args.out / 'zoo.json')}")
    if args.update_results:
        section = "zoo-extra" if args.extra else "zoo"  # the extra models: their own table
        common.replace_section(RESULTS_MD, section, results_section(payload, args.note))
        common.progress(f"updated {RESULTS_MD}")
    return payload


if __name__ == "__main__":
    main()
