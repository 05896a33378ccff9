"""`braze optimize` on ResNet-50, batch norms kept: `python -m benchmarks.optimize_resnet50`.

torchvision's resnet50 with random weights from a fixed seed (nothing downloaded), its
batch-norm parameters and running statistics also drawn at random (torchvision
initializes them to the identity, which would hide a wrong fold), in eval mode, exported
by the TorchScript exporter with the BatchNormalization nodes kept (dynamo=False,
do_constant_folding=False, training=TrainingMode.PRESERVE). Then:

1. the exported file must hold BatchNormalization nodes (else there is nothing to show);
2. `braze optimize IN -o OUT` runs through the console script (a subprocess, its
   output printed); it must succeed;
3. node types are counted before and after: no BatchNormalization may be left;
4. onnxruntime runs both files on one fixed random input: max|a - b| / max|a| must be
   at most MAX_REL_DIFF (1e-4);
5. onnxruntime's latency on both files, both sessions in this process (ORT_ENABLE_ALL,
   2 intra-op threads, 1 inter-op), warm-up, then interleaved rounds that alternate
   which file goes first (benchmarks/common.py's method), each timed call right after
   one untimed call of the same session: median and IQR of each. The optimized file
   must be no slower than the original within LATENCY_TOL, judged on the median of the
   per-round ratios optimized/original (the two samples of a round are taken within a
   fraction of a second, so load drift on a shared machine cancels out of the ratio;
   the ratio of the two medians is printed too). onnxruntime fuses
   Conv+BatchNormalization itself at ORT_ENABLE_ALL, so both files end up as nearly the
   same graph and an exact "<=" would be a coin flip; --tolerance 0 asks for it anyway.

Prints a table, writes benchmarks/out/optimize_resnet50.json, and exits 1 when any
condition fails (2 on bad usage). `check()` is the same run as a function, for tests.
"""

from __future__ import annotations

import argparse
import collections
import faulthandler
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

from benchmarks import common, runtimes
from benchmarks.common import OUT_DIR, Settings, fmt, fmt_err

SEED = 0
BATCH = 1
IMAGE = 224
OPSET = 17
MAX_REL_DIFF = 1e-4
# The optimized file's median may exceed the original's by this fraction and still
# count as "no worse": the timing noise of a shared two-core machine.
LATENCY_TOL = 0.03
DEFAULT_WARMUP = 5
DEFAULT_ROUNDS = 60
# Untimed calls right before each timed one: with a short settle the call right after
# the other session's was 1.5-1.7x slower (its spin-waiting pool still running), which
# alternating the order cancels on average but which swamps the spread.
DEFAULT_LEAD_IN = 1
ORIGINAL, OPTIMIZED = "onnxruntime, original", "onnxruntime, braze optimize"


def build_model(seed: int = SEED):
    """resnet50(weights=None) in eval mode, fp32, every weight drawn from `seed`:
    batch-norm scale and shift, running mean and variance included."""
    import torch
    import torchvision

    torch.manual_seed(seed)
    model = torchvision.models.resnet50(weights=None).eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0.0, 0.1)
                m.running_mean.normal_(0.0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    return model


def make_input(batch: int = BATCH, image: int = IMAGE, seed: int = SEED) -> np.ndarray:
    """A fixed random image batch, NCHW, fp32."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch, 3, image, image), dtype=np.float32)


def export_bn_kept(model, x: np.ndarray, path: Path) -> Path:
    """The TorchScript export with BatchNormalization nodes kept (no constant folding,
    training=PRESERVE on an eval-mode model), input in0, output out0."""
    import torch

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dynamo=False's deprecation notice
        torch.onnx.export(model, (torch.from_numpy(x),), str(path), input_names=["in0"],
                          output_names=["out0"], opset_version=OPSET, dynamo=False,
                          do_constant_folding=False,
                          training=torch.onnx.TrainingMode.PRESERVE)
    return path


def op_counts(path: Path) -> collections.Counter:
    """Node count per op type (main graph)."""
    import onnx

    return collections.Counter(n.op_type for n in onnx.load(str(path)).graph.node)


def braze_command() -> list[str]:
    """The `braze` console script next to this interpreter (the venv's), else on PATH,
    else the same entry point through `python -m bridge.cli`."""
    here = Path(sys.executable).with_name("braze")
    if here.exists():
        return [str(here)]
    found = shutil.which("braze")
    return [found] if found else [sys.executable, "-m", "bridge.cli"]


def run_optimize(src: Path, dst: Path) -> subprocess.CompletedProcess:
    """`braze optimize src -o dst`, its output printed as it came."""
    cmd = braze_command() + ["optimize", str(src), "-o", str(dst)]
    print("$ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    print(proc.stdout, end="", flush=True)
    print(proc.stderr, end="", file=sys.stderr, flush=True)
    return proc


def output_diffs(src: Path, dst: Path, x: np.ndarray) -> tuple[float, float]:
    """(max abs, max rel) difference of onnxruntime's outputs on the two files, rel
    being max|a - b| / max|a| with a the original's (worst over outputs)."""
    a = runtimes.ort_session(src).run(None, {"in0": x})
    b = runtimes.ort_session(dst).run(None, {"in0": x})
    max_abs = max(float(np.abs(p.astype(np.float64) - q.astype(np.float64)).max())
                  for p, q in zip(a, b))
    return max_abs, common.max_rel_err(b, a)


def time_both(src: Path, dst: Path, x: np.ndarray, settings: Settings) -> dict:
    """common.measure on onnxruntime sessions of both files (created in this process)."""
    rts = [runtimes.onnxruntime(src, [x]), runtimes.onnxruntime(dst, [x])]
    rts[0].name, rts[1].name = ORIGINAL, OPTIMIZED
    return common.measure(f"batch {x.shape[0]}", rts, settings, reference=ORIGINAL)


def check(batch: int = BATCH, image: int = IMAGE, warmup: int = DEFAULT_WARMUP,
          rounds: int = DEFAULT_ROUNDS, lead_in: int = DEFAULT_LEAD_IN,
          latency_tol: float = LATENCY_TOL, workdir: Path | None = None, model=None) -> dict:
    """Export, optimize, compare and time; returns the results with `failures`, the
    conditions that failed (empty when all hold). `model` defaults to build_model()."""
    common.configure_threads()
    model = build_model() if model is None else model
    x = make_input(batch, image)
    with tempfile.TemporaryDirectory(prefix="braze-optimize-") as tmp:
        work = Path(workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        src, dst = work / "resnet50_bn.onnx", work / "resnet50_bn.optimized.onnx"
        common.progress(f"exporting ResNet-50 with BatchNormalization kept to {src}")
        export_bn_kept(model, x, src)
        res = {"batch": batch, "image": image, "failures": [], "before": dict(op_counts(src))}
        if not res["before"].get("BatchNormalization"):
            res["failures"].append("the exported model has no BatchNormalization node")
            return res
        common.progress("running braze optimize")
        proc = run_optimize(src, dst)
        res["braze_rc"] = proc.returncode
        if proc.returncode != 0 or not dst.exists():
            tail = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
            res["failures"].append(f"braze optimize failed (exit {proc.returncode}): {tail}")
            return res
        res["after"] = dict(op_counts(dst))
        res["bn_left"] = res["after"].get("BatchNormalization", 0)
        if res["bn_left"]:
            res["failures"].append(f"{res['bn_left']} BatchNormalization node(s) left")
        res["max_abs_diff"], res["max_rel_diff"] = output_diffs(src, dst, x)
        if not res["max_rel_diff"] <= MAX_REL_DIFF:
            res["failures"].append(f"max rel diff {res['max_rel_diff']:.3g} > {MAX_REL_DIFF:g}")
        res["timing"] = time_both(src, dst, x, Settings(warmup=warmup, rounds=rounds,
                                                           lead_in=lead_in))
    by = {r["runtime"]: r for r in res["timing"]["results"]}
    if any(r["status"] != "ok" for r in by.values()):
        res["failures"].append("onnxruntime failed: " + "; ".join(
            f"{n}: {r['reason']}" for n, r in by.items() if r["status"] != "ok"))
        return res
    orig, opt = by[ORIGINAL]["median_ms"], by[OPTIMIZED]["median_ms"]
    res["latency_ratio"], res["latency_tol"] = opt / orig, latency_tol
    paired = np.asarray(by[OPTIMIZED]["samples_ms"]) / np.asarray(by[ORIGINAL]["samples_ms"])
    res["paired_ratio_median"] = float(np.median(paired))
    res["paired_ratio_iqr"] = [float(q) for q in np.percentile(paired, [25, 75])]
    if res["paired_ratio_median"] > 1 + latency_tol:
        res["failures"].append(f"optimized/original latency {res['paired_ratio_median']:.3f} "
                               f"(median of per-round ratios; medians {opt:.2f} vs {orig:.2f} "
                               f"ms) > 1 + {latency_tol:g}")
    return res


def report(res: dict) -> str:
    """Node counts, numerics, latency and verdict as Markdown."""
    parts = []
    if "after" in res:
        before, after = res["before"], res["after"]
        rows = [[op, before.get(op, 0), after.get(op, 0)]
                for op in sorted(set(before) | set(after))]
        rows.append(["**total**", sum(before.values()), sum(after.values())])
        parts.append(common.markdown_table(["op", "original", "optimized"], rows))
    if "max_rel_diff" in res:
        parts.append(f"BatchNormalization left: {res['bn_left']}; outputs on one random "
                     f"input (batch {res['batch']}, {res['image']}x{res['image']}): max abs diff "
                     f"{res['max_abs_diff']:.3g}, max rel diff {fmt_err(res['max_rel_diff'])} "
                     f"(limit {MAX_REL_DIFF:g})")
    if "timing" in res:
        t = res["timing"]
        rows = [[r["runtime"], fmt(r.get("median_ms")),
                 f"{fmt(r.get('q1_ms'))}-{fmt(r.get('q3_ms'))}", fmt(r.get("min_ms"))]
                for r in t["results"]]
        head = (f"onnxruntime latency, {t['settings']['threads']} threads, "
                f"{t['settings']['warmup']} warm-up, {t['rounds']} interleaved rounds, "
                f"{t['settings']['lead_in']} untimed lead-in call(s) before each sample")
        parts.append(head + "\n\n" + common.markdown_table(
            ["runtime", "median ms", "IQR ms", "min ms"], rows))
        if "latency_ratio" in res:
            lo, hi = res["paired_ratio_iqr"]
            parts.append(f"optimized/original latency: per-round ratio median "
                         f"{res['paired_ratio_median']:.3f} (IQR {lo:.3f}-{hi:.3f}), accepted "
                         f"up to {1 + res['latency_tol']:.3f}; ratio of the medians "
                         f"{res['latency_ratio']:.3f}")
    verdict = "PASS" if not res["failures"] else "FAIL: " + "; ".join(res["failures"])
    parts.append(verdict)
    return "\n\n".join(parts)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m benchmarks.optimize_resnet50",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=BATCH, help="batch size (default 1)")
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help="untimed calls each")
    p.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="interleaved rounds")
    p.add_argument("--lead-in", type=int, default=DEFAULT_LEAD_IN,
                   help=f"untimed calls before each timed one (default {DEFAULT_LEAD_IN})")
    p.add_argument("--tolerance", type=float, default=LATENCY_TOL,
                   help="accepted slowdown of the optimized median, as a fraction "
                        f"(default {LATENCY_TOL:g}; 0: strictly no slower)")
    p.add_argument("--keep", type=Path, help="write both ONNX files here instead of a temp dir")
    p.add_argument("--out", type=Path, default=OUT_DIR, help="folder for the JSON")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    faulthandler.enable()
    res = check(batch=args.batch, warmup=args.warmup, rounds=args.rounds,
                lead_in=args.lead_in, latency_tol=args.tolerance, workdir=args.keep)
    print(report(res))
    path = common.write_json({"benchmark": "optimize_resnet50",
                              "machine": common.machine_info(), **res},
                             args.out / "optimize_resnet50.json")
    common.progress(f"wrote {path}")
    return 1 if res["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
