"""`braze bench MODEL.onnx`: does braze help this model? braze against onnxruntime (and
OpenVINO when installed) on the user's own file, as a table on the terminal.

The method is the one benchmarks/ uses for braze's published figures, kept small:
every runtime in this process with the same threads; each is set up and called once
(its "setup" time, braze's compile included) and its outputs are compared with
onnxruntime's; then untimed warm-up calls; then rounds in which every runtime is
timed once, in a seeded random order that changes every round, each sample preceded
by a SETTLE_S pause (so the previous runtime's spinning thread pool has gone to
sleep) and LEAD_IN_S of untimed lead-in calls (so this runtime's own pool is awake). Medians
and interquartile ranges per call are reported. The inputs are seeded random data at
the model's static shapes (or those given with --shape).
"""

from __future__ import annotations

import random
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from bridge.options import check_threads

# Pause before each timed sample; see benchmarks/common.py, where it was measured
# (onnxruntime's pool keeps its cores for tens of milliseconds after a call).
SETTLE_S = 0.1
# The lead-in calls go on for at least this long: after SETTLE_S of idling, calls stay
# slow for a few milliseconds while the cores and thread pools come back (measured: a
# model of one braze kernel and one onnxruntime step took 3.9 ms a call for the first
# ~5 ms after a 100 ms pause, 0.1 ms after 20 ms of calls).
LEAD_IN_S = 0.02
ORDER_SEED = 0
MIN_ROUNDS = 3


@dataclass
class Contender:
    """One runtime: its name, the zero-argument call, and what was measured of it."""

    name: str
    call: Callable[[], list]
    setup_s: float
    outputs: list
    samples_ms: list[float] = field(default_factory=list)

    def median_ms(self) -> float:
        return float(np.median(self.samples_ms))

    def iqr_ms(self) -> tuple[float, float]:
        q1, q3 = np.percentile(self.samples_ms, [25, 75])
        return float(q1), float(q3)


def progress(message: str) -> None:
    """A progress line on stderr, overwritten by the next one on a terminal."""
    end = "\r" if sys.stderr.isatty() else "\n"
    print(f"\033[K{message}" if sys.stderr.isatty() else message, end=end, file=sys.stderr,
          flush=True)


def set_up(name: str, build: Callable[[], Callable[[], list]]) -> Contender:
    """Build a runtime and call it once; both count as its setup time."""
    progress(f"setting up {name} ...")
    t0 = time.perf_counter()
    call = build()
    outputs = [np.asarray(o) for o in call()]
    return Contender(name, call, time.perf_counter() - t0, outputs)


def ort_builder(path: str, feeds: dict, threads: int):
    def build():
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        return lambda: sess.run(None, feeds)
    return build


def openvino_builder(path: str, feeds: dict, threads: int):
    def build():
        import openvino as ov

        config = {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32",
                  "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}
        request = ov.Core().compile_model(path, "CPU", config).create_infer_request()
        return lambda: list(request.infer(feeds, share_inputs=True).to_tuple())
    return build


def braze_builder(path: str, feeds: dict, threads: int, holder: dict):
    def build():
        import bridge

        compiled = bridge.compile_onnx(path, threads=threads)
        holder["model"] = compiled
        return lambda: compiled(**feeds)
    return build


def openvino_installed() -> bool:
    try:
        import openvino  # noqa: F401
    except ImportError:
        return False
    return True


def contenders(path: str, feeds: dict, threads: int, holder: dict) -> list[Contender]:
    """onnxruntime first (the reference), OpenVINO where installed, braze last."""
    out = [set_up("onnxruntime", ort_builder(path, feeds, threads))]
    if openvino_installed():
        try:
            out.append(set_up("openvino", openvino_builder(path, feeds, threads)))
        except Exception as exc:  # OpenVINO refusing a model is no reason to stop
            progress(f"openvino: skipped ({type(exc).__name__}: {str(exc)[:80]})")
    out.append(set_up("braze", braze_builder(path, feeds, threads, holder)))
    return out


def max_rel_err(got: list, ref: list) -> float:
    """max |got - ref| / max |ref| over all outputs."""
    worst = 0.0
    for g, r in zip(got, ref):
        g64, r64 = np.asarray(g, np.float64), np.asarray(r, np.float64)
        if r64.size:
            scale = max(float(np.max(np.abs(r64))), 1e-30)
            worst = max(worst, float(np.max(np.abs(g64 - r64))) / scale)
    return worst


def time_sample(c: Contender) -> None:
    time.sleep(SETTLE_S)
    t0 = time.perf_counter()
    c.call()  # lead-in
    while time.perf_counter() - t0 < LEAD_IN_S:
        c.call()
    t0 = time.perf_counter()
    c.call()
    c.samples_ms.append((time.perf_counter() - t0) * 1e3)


def run_rounds(cs: list[Contender], rounds: int, budget_s: float, warmup: int) -> int:
    """Warm up, then time interleaved rounds; returns the number of rounds run."""
    for c in cs:
        for _ in range(warmup):
            c.call()
    order, rng, start, done = list(cs), random.Random(ORDER_SEED), time.perf_counter(), 0
    while done < rounds and (done < MIN_ROUNDS or time.perf_counter() - start < budget_s):
        rng.shuffle(order)
        for c in order:
            time_sample(c)
        done += 1
        progress(f"timing: round {done}/{rounds}")
    return done


def table(cs: list[Contender], ref: Contender) -> str:
    """The terminal table: median, IQR, ratio to onnxruntime, setup time, error."""
    rows = [("runtime", "median ms", "IQR ms", "vs onnxruntime", "setup s", "max rel err")]
    for c in cs:
        q1, q3 = c.iqr_ms()
        err = "-" if c is ref else f"{max_rel_err(c.outputs, ref.outputs):.1e}"
        rows.append((c.name, f"{c.median_ms():.2f}", f"{q1:.2f}-{q3:.2f}",
                     f"{c.median_ms() / ref.median_ms():.2f}x", f"{c.setup_s:.2f}", err))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def verdict(cs: list[Contender], report: dict) -> str:
    """One sentence: braze's ratio to the fastest other runtime, and what it compiled
    (`report`: the compiled model's explain_data)."""
    braze = cs[-1]
    best = min(cs[:-1], key=Contender.median_ms)
    r = braze.median_ms() / best.median_ms()
    word = "faster than" if r < 1 else "slower than"
    left = report["nodes"] - report["compiled_nodes"]
    tail = (f"; {left} of {report['nodes']} nodes run on onnxruntime (`braze explain` says "
            "why)" if left else f"; all {report['nodes']} nodes compiled by braze")
    return f"braze takes {r:.2f}x {best.name}'s time: {word} the fastest other runtime{tail}."


def bench(path: str, feeds: dict, threads: int, rounds: int, budget_s: float,
          warmup: int) -> str:
    """Set up, check and time every runtime; returns the report text."""
    check_threads(threads)
    holder: dict = {}
    cs = contenders(path, feeds, threads, holder)
    n = run_rounds(cs, rounds, budget_s, warmup)
    progress("")
    head = f"{path}: {n} rounds, {threads} threads, batch as given by the input shapes"
    report = holder["model"].explain_data()
    return "\n".join([head, "", table(cs, cs[0]), "", verdict(cs, report)])
