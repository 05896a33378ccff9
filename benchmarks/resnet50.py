"""ResNet-50 inference, fp32, braze against stock runtimes: `python -m benchmarks.resnet50`.

torchvision's resnet50 with random weights from a fixed seed (nothing downloaded), in
eval mode, at batch 1 and 8. Runtimes: torch eager; torch.compile with inductor, with
and without freezing; onnxruntime (ORT_ENABLE_ALL) on a TorchScript ONNX export;
OpenVINO on the same file where installed; braze through torch.compile(backend="braze")
and through bridge.compile_onnx on the same ONNX file. Method: benchmarks/common.py.

Prints a table per batch size, writes benchmarks/out/resnet50.json and .png;
--update-results rewrites the ResNet-50 section of benchmarks/RESULTS.md.

Run time: compiling takes most of it (inductor on two cores, with and without
freezing, per batch size). The timed rounds of each batch size stop at DEFAULT_ROUNDS
or CASE_BUDGET_S, whichever comes first, so a full default run stays near ten minutes
on two cores whatever braze's speed; --quick is a smoke run of a minute or two.
"""

from __future__ import annotations

import argparse
import faulthandler
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks import common, runtimes
from benchmarks.common import OUT_DIR, RESULTS_MD, Settings, fmt, fmt_err, na

SEED = 0
DEFAULT_BATCHES = (1, 8)
DEFAULT_WARMUP = 3
DEFAULT_ROUNDS = 30
# Seconds of timed rounds per batch size at most: about 7 runtimes at 0.2-0.4 s a call
# at batch 8 make a round 2-3 s; 120 s keeps the whole default run near ten minutes.
CASE_BUDGET_S = 120.0
QUICK = {"batches": (1,), "warmup": 1, "rounds": 3}


def build_model(seed: int = SEED):
    """resnet50(weights=None) with weights drawn from `seed`, in eval mode, fp32."""
    import torch
    import torchvision

    torch.manual_seed(seed)
    return torchvision.models.resnet50(weights=None).eval()


def make_input(batch: int, seed: int = SEED) -> np.ndarray:
    """A fixed random image batch, NCHW 224x224, fp32."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch, 3, 224, 224), dtype=np.float32)


def runtimes_for(model, arrays: list[np.ndarray], onnx_path: Path, cpus=(),
                 only=()) -> list[common.Runtime]:
    """The runtimes compared, in table order (torch eager first: the reference); braze
    also built for each CPU in `cpus` (LLVM names: kernels for that CPU, run here); only
    those named by `only` (substrings), if given."""
    static = {"dynamic": False}  # one specialization per batch size, as braze and ORT have
    return runtimes.chosen([
        runtimes.torch_eager(model, arrays),
        runtimes.torch_compiled(model, arrays, "torch.compile (inductor)", **static),
        runtimes.torch_compiled(model, arrays, "torch.compile (inductor, freezing)",
                                options={"freezing": True}, **static),
        runtimes.onnxruntime(onnx_path, arrays),
        runtimes.openvino(onnx_path, arrays),
        runtimes.torch_compiled(model, arrays, "braze (torch.compile)", stock=False,
                                backend="braze", **static),
        runtimes.braze_onnx(onnx_path, arrays),
        *(runtimes.braze_onnx(onnx_path, arrays, t) for t in runtimes.cpu_targets(cpus)),
    ], only)


def run_batch(model, batch: int, settings: Settings, workdir: Path, cpus=(),
              only=()) -> dict:
    """Export, set up and time every runtime at one batch size."""
    import torch

    torch._dynamo.reset()  # earlier cases' compiled code is no longer used
    arrays = [make_input(batch)]
    case = f"batch {batch}"
    common.progress(f"{case}: exporting ONNX")
    onnx_path = runtimes.export_onnx(model, arrays, workdir / f"resnet50_b{batch}.onnx")
    return common.measure(case, runtimes_for(model, arrays, onnx_path, cpus, only), settings)


def case_table(case: dict) -> str:
    """One batch size as a Markdown table."""
    best = common.fastest_stock_ms(case)
    rows = []
    for r in case["results"]:
        if r["status"] != "ok":
            rows.append([r["runtime"], na(r), "-", "-", fmt(r["compile_s"]), "-"])
            continue
        rows.append([r["runtime"], fmt(r["median_ms"]),
                     f"{fmt(r['q1_ms'])}-{fmt(r['q3_ms'])}",
                     f"{r['median_ms'] / best:.2f}x" if best else "-",
                     fmt(r["compile_s"]), fmt_err(r["max_rel_err"])])
    headers = ["runtime", "median ms", "IQR ms", "vs fastest stock", "compile s",
               "max rel err"]
    return markdown_heading(case) + common.markdown_table(headers, rows)


def markdown_heading(case: dict) -> str:
    """The line above a case's table."""
    return f"**{case['case']}** ({case['rounds']} rounds)\n\n"


def report(payload: dict) -> str:
    """All batch sizes' tables, one after another."""
    return "\n\n".join(case_table(c) for c in payload["cases"])


def results_section(payload: dict, note: str | None = None) -> str:
    """The ResNet-50 section of RESULTS.md: machine, settings, tables."""
    s = payload["settings"]
    lines = [f"Machine: {common.machine_line(payload['machine'])}.",
             f"Settings: {s['threads']} threads, {s['warmup']} warm-up call(s), up to "
             f"{s['rounds']} interleaved rounds (budget {s['budget_s']:.0f} s per batch size)."]
    if note:
        lines.append(f"Note: {note}")
    return "\n".join(lines) + "\n\n" + report(payload)


def update_results(payload: dict, path: Path = RESULTS_MD, note: str | None = None) -> None:
    """Rewrite the ResNet-50 section of benchmarks/RESULTS.md with these results."""
    common.replace_section(path, "resnet50", results_section(payload, note))


def parse_args(argv):
    """The command line; --quick overrides batch, warm-up and rounds."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.resnet50", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, nargs="+", default=list(DEFAULT_BATCHES),
                   help="batch sizes (default: 1 8)")
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help="untimed calls each")
    p.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="timed rounds at most")
    p.add_argument("--budget", type=float, default=CASE_BUDGET_S,
                   help="seconds of timed rounds per batch size at most (0: no limit)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: batch 1, 1 warm-up, 3 rounds")
    p.add_argument("--out", type=Path, default=OUT_DIR, help="folder for JSON and PNG")
    p.add_argument("--update-results", action="store_true",
                   help="rewrite the ResNet-50 section of benchmarks/RESULTS.md")
    p.add_argument("--note", help="a sentence to print under the machine in RESULTS.md")
    common.add_target_args(p)
    args = p.parse_args(argv)
    if args.quick:
        args.batch, args.warmup, args.rounds = list(QUICK["batches"]), QUICK["warmup"], \
            QUICK["rounds"]
    return args


def main(argv=None) -> dict:
    """Run every batch size, print the tables, write JSON and PNG; returns the payload."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    faulthandler.enable()  # a crash in native code still says where
    common.configure_threads()
    # lead_in: one untimed call right before each sample, as in a loop of calls (this
    # runtime's pools awake); SETTLE_S before it lets the previous runtime's go to sleep.
    settings = Settings(warmup=args.warmup, rounds=args.rounds, budget_s=args.budget or None,
                        lead_in=1)
    model = build_model()
    with tempfile.TemporaryDirectory(prefix="braze-bench-") as tmp, \
            common.fresh_compile_caches(Path(tmp)):
        cases = [run_batch(model, b, settings, Path(tmp), args.cpu, args.only)
                 for b in args.batch]
    payload = {"benchmark": "resnet50", "machine": common.machine_info(),
               "settings": settings.to_dict(), "cases": cases}
    print(report(payload))
    json_path = common.write_json(payload, args.out / "resnet50.json")
    png_path = common.bar_chart(cases, args.out / "resnet50.png", "ResNet-50 fp32, CPU")
    common.progress(f"wrote {json_path} and {png_path}")
    if args.update_results:
        update_results(payload, note=args.note)
        common.progress(f"updated {RESULTS_MD}")
    return payload


if __name__ == "__main__":
    main()
