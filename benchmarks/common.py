"""The benchmarking method, in one place, shared by every benchmark here.

All runtimes run in one process with the same thread count (torch intra-op threads,
onnxruntime intra_op_num_threads with inter_op 1, braze's and OpenVINO's thread options).
For each case:

1. setup: each runtime is built and called once; the wall time of both is its
   "compile" time (torch.compile and braze compile lazily, on that first call), and
   that first output is compared with the reference runtime's (torch eager):
   max|x - ref| / max|ref| over all outputs. A runtime that raises here, or later,
   becomes "n/a (reason)" and the benchmark goes on.
2. warm-up: every runtime runs `warmup` untimed samples (`warmup * number` calls).
3. rounds: in each round every runtime is timed once (`number` calls per sample, so
   tiny graphs are above the timer's noise), in a seeded random order that changes
   every round, so load drift on a shared machine hits all runtimes alike, and so does
   whatever the runtime timed just before leaves behind.
   Before each sample the harness sleeps SETTLE_S: thread pools (OpenMP, onnxruntime)
   spin-wait for a while after a call, and on a machine with as many cores as threads
   the previous runtime's spinning threads would otherwise steal this runtime's cores,
   a cost no user running one runtime pays. Cases also set `lead_in` untimed calls
   right before each sample (kept up for at least LEAD_IN_S), so this runtime's own
   pools are awake and the cores back to speed, as in a loop of calls.
   Rounds stop at `rounds`, or earlier once `budget_s` is spent (never under
   MIN_ROUNDS), at a round boundary so every runtime has as many samples.
4. statistics: median and interquartile range (and min/max) per call.

Results go out as a JSON-able dict, a Markdown table and a bar chart (matplotlib, Agg).
Everything runs under torch.no_grad(): these are inference benchmarks.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import json
import os
import platform
import random
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

THREADS = 2
OUT_DIR = Path(__file__).resolve().parent / "out"
RESULTS_MD = Path(__file__).resolve().parent / "RESULTS.md"

# Pause before each timed sample so thread pools that the previous runtime left
# spin-waiting go to sleep. onnxruntime's pool keeps its cores for tens of milliseconds
# after a call: measured on ResNet-50 (2 threads, braze timed right after onnxruntime,
# no lead-in), braze took 61 ms after a 10 ms pause, 40 ms after 30 ms, and its
# undisturbed 32 ms after 50 ms or more.
SETTLE_S = 0.1
# The lead-in calls (Settings.lead_in) go on for at least this long: after SETTLE_S of
# idling, this machine's cores take about a millisecond of work to come back to speed
# (measured: a 120 us call took 400-500 us right after a 100 ms pause, and its second
# thread's first call up to 7 ms), which a single short lead-in call does not cover.
LEAD_IN_S = 0.02
# Each round times the runtimes in a fresh order (seeded: the same orders every run), so
# no runtime always follows the same neighbour: a runtime's call right after another's
# can be slower (caches, the neighbour's threads), and a fixed rotation charged that to
# one runtime every round.
ORDER_SEED = 0
# A time budget never cuts a case below this many rounds: fewer samples make the
# median and quartiles meaningless.
MIN_ROUNDS = 3
# Failure reasons are cut to this many characters in the JSON, and to TABLE_REASON_CHARS
# in tables, so both stay readable.
REASON_CHARS = 300
TABLE_REASON_CHARS = 90
# Display units: factor from milliseconds.
UNIT_SCALE = {"ms": 1.0, "us": 1000.0}

_T0 = time.perf_counter()


def progress(message: str) -> None:
    """One progress line on stderr, stamped with seconds since the start."""
    print(f"[{time.perf_counter() - _T0:7.1f}s] {message}", file=sys.stderr, flush=True)


def configure_threads(threads: int = THREADS) -> None:
    """Pin torch to `threads` intra-op threads and one inter-op thread."""
    import torch

    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # can only be set before the first inter-op work; intra-op is what matters


@contextlib.contextmanager
def fresh_compile_caches(workdir: Path):
    """Point inductor's and braze's on-disk caches at fresh folders while inside (the
    previous settings are restored after), so both compile times are those of a first
    compile and do not depend on earlier runs. Kernels compiled earlier in the same
    process may still be reused from memory."""
    keys = {"TORCHINDUCTOR_CACHE_DIR": workdir / "inductor-cache",
            "BRAZE_CACHE_DIR": workdir / "braze-cache"}
    # importing torchvision already sets inductor's to the default
    before = {k: os.environ.get(k) for k in keys}
    os.environ.update({k: str(v) for k, v in keys.items()})
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def add_target_args(p) -> None:
    """--cpu and --only, shared by the benchmarks that time braze built for other CPUs."""
    p.add_argument("--cpu", nargs="+", default=[], metavar="NAME",
                   help="also run braze built for these LLVM CPUs (e.g. x86-64-v3 x86-64-v2; "
                   "they must run on this machine)")
    p.add_argument("--only", nargs="+", default=[], metavar="NAME",
                   help="run only the runtimes whose names contain one of these (torch "
                   "eager, the reference, always runs)")


def describe_error(exc: BaseException) -> str:
    """A short one-line reason: the exception type and its message's first line."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    reason = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return reason if len(reason) <= REASON_CHARS else reason[: REASON_CHARS - 3] + "..."


# -- runtimes and results -------------------------------------------------------------


@dataclass
class Runtime:
    """A runtime under test: `setup()` builds it and returns a zero-argument callable
    that runs the model once on the case's fixed inputs and returns its outputs."""

    name: str
    setup: Callable[[], Callable[[], object]]
    stock: bool = True  # a stock runtime (not braze): ratios are taken to the fastest one


@dataclass
class Result:
    """What one runtime measured in one case (times are per call, in milliseconds)."""

    runtime: str
    stock: bool
    status: str = "ok"  # "ok" or "n/a"
    reason: str | None = None
    compile_s: float | None = None
    max_rel_err: float | None = None
    err_vs_fp64: float | None = None  # max rel err against a float64 reference, if given
    samples_ms: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def fail(self, reason: str) -> None:
        """Mark n/a, keeping the reason; samples taken before the failure are dropped."""
        self.status, self.reason, self.samples_ms = "n/a", reason, []

    def stats(self) -> dict:
        """Median, quartiles, min and max of the samples (ms); empty when none."""
        if not self.samples_ms:
            return {}
        s = np.asarray(self.samples_ms)
        q1, med, q3 = np.percentile(s, [25, 50, 75])
        return {"median_ms": float(med), "q1_ms": float(q1), "q3_ms": float(q3),
                "min_ms": float(s.min()), "max_ms": float(s.max())}

    @property
    def median_ms(self) -> float | None:
        return self.stats().get("median_ms")

    def to_dict(self) -> dict:
        return {"runtime": self.runtime, "stock": self.stock, "status": self.status,
                "reason": self.reason, "compile_s": self.compile_s,
                "max_rel_err": self.max_rel_err, "err_vs_fp64": self.err_vs_fp64,
                **self.stats(),
                "samples_ms": list(self.samples_ms)}


@dataclass
class Settings:
    """How long to measure: warm-up samples, rounds, calls per sample, time budget."""

    warmup: int = 3
    rounds: int = 20
    number: int = 1
    budget_s: float | None = None
    lead_in: int = 0  # untimed calls right before each sample (wake this runtime's pools)

    def to_dict(self) -> dict:
        return {"warmup": self.warmup, "rounds": self.rounds, "number": self.number,
                "budget_s": self.budget_s, "lead_in": self.lead_in, "settle_s": SETTLE_S,
                "lead_in_s": LEAD_IN_S,
                "threads": THREADS}


# -- numerics -------------------------------------------------------------------------


def as_arrays(out) -> list[np.ndarray]:
    """A runtime's outputs as a flat list of numpy arrays (tensors, lists, dicts)."""
    if isinstance(out, dict):
        out = list(out.values())
    if not isinstance(out, (list, tuple)):
        out = [out]
    arrays = []
    for o in out:
        if isinstance(o, (list, tuple, dict)):
            arrays.extend(as_arrays(o))
        elif hasattr(o, "detach"):
            arrays.append(o.detach().cpu().numpy())
        else:
            arrays.append(np.asarray(o))
    return arrays


def max_rel_err(got: list[np.ndarray], ref: list[np.ndarray]) -> float:
    """max |got - ref| / max |ref| over all outputs; raises on a count or shape mismatch."""
    if len(got) != len(ref):
        raise ValueError(f"{len(got)} outputs, reference has {len(ref)}")
    worst = 0.0
    for g, r in zip(got, ref):
        if g.shape != r.shape:
            raise ValueError(f"output shape {g.shape}, reference {r.shape}")
        diff = np.abs(g.astype(np.float64) - r.astype(np.float64))
        scale = float(np.abs(r).max()) if r.size else 0.0
        err = float(diff.max()) if diff.size else 0.0
        worst = max(worst, err / scale if scale > 0 else err)
    return worst


# -- measuring ------------------------------------------------------------------------


def time_call(fn: Callable[[], object], number: int) -> float:
    """Milliseconds per call of `number` back-to-back calls (gc off, as timeit does)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter_ns()
        for _ in range(number):
            fn()
        elapsed = time.perf_counter_ns() - t0
    finally:
        if was_enabled:
            gc.enable()
    return elapsed / number / 1e6


def set_up(rt: Runtime, case: str) -> tuple[Callable | None, Result, list | None]:
    """Build a runtime and call it once: its callable, result and first outputs."""
    result = Result(rt.name, rt.stock)
    progress(f"{case}: compiling {rt.name}")
    try:
        t0 = time.perf_counter()
        fn = rt.setup()
        outputs = as_arrays(fn())
        result.compile_s = time.perf_counter() - t0
    except Exception as exc:  # any failure of one runtime must not end the benchmark
        result.fail(describe_error(exc))
        progress(f"{case}: {rt.name} is n/a ({result.reason})")
        return None, result, None
    progress(f"{case}: {rt.name} ready in {result.compile_s:.1f}s")
    return fn, result, outputs


def check_errors(results: list[Result], outputs: dict, reference: str,
                 fp64: list[np.ndarray] | None = None) -> None:
    """Fill max_rel_err against the reference runtime's outputs, where both exist, and
    err_vs_fp64 against `fp64` (the model run in float64), when given."""
    ref = outputs.get(reference)
    for r in results:
        if not r.ok or ref is None:
            continue
        try:
            r.max_rel_err = max_rel_err(outputs[r.runtime], ref)
            if fp64 is not None:
                r.err_vs_fp64 = max_rel_err(outputs[r.runtime], fp64)
        except ValueError as exc:
            r.fail(f"wrong outputs: {exc}")


def warm_up(fns: dict, results: dict, settings: Settings, case: str) -> None:
    """Untimed calls of every runtime; one that fails here is dropped as n/a."""
    calls = settings.warmup * settings.number
    progress(f"{case}: warm-up, {calls} call(s) each")
    for name in list(fns):
        try:
            for _ in range(calls):
                fns[name]()
        except Exception as exc:
            results[name].fail(describe_error(exc))
            del fns[name]


def run_rounds(fns: dict, results: dict, settings: Settings, case: str) -> int:
    """Interleaved timed rounds; returns how many rounds ran."""
    names = list(fns)
    order = random.Random(ORDER_SEED)
    t0 = time.perf_counter()
    done = 0
    for rnd in range(settings.rounds):
        for name in order.sample(names, len(names)):
            if name in fns:
                time_one(name, fns, results, settings)
        done += 1
        elapsed = time.perf_counter() - t0
        if done % max(1, settings.rounds // 5) == 0 or done == settings.rounds:
            progress(f"{case}: round {done}/{settings.rounds} ({elapsed:.0f}s)")
        if settings.budget_s and elapsed > settings.budget_s and done >= MIN_ROUNDS:
            progress(f"{case}: time budget {settings.budget_s:.0f}s spent after {done} rounds")
            break
    return done


def time_one(name: str, fns: dict, results: dict, settings: Settings) -> None:
    """Settle, lead-in calls, then one timed sample of one runtime; a failure drops
    it as n/a."""
    fn = fns[name]
    try:
        time.sleep(SETTLE_S)
        start = time.perf_counter()
        calls = 0
        while calls < settings.lead_in or (
                calls and time.perf_counter() - start < LEAD_IN_S):
            fn()
            calls += 1
        results[name].samples_ms.append(time_call(fn, settings.number))
    except Exception as exc:
        results[name].fail(describe_error(exc))
        del fns[name]


def measure(case: str, runtimes: list[Runtime], settings: Settings,
            reference: str = "torch eager", unit: str = "ms",
            fp64: list[np.ndarray] | None = None) -> dict:
    """Set up, check, warm up and time `runtimes` on one case; returns the case's dict.
    `fp64`, if given, is the case's outputs computed in float64 (see check_errors)."""
    import torch

    with torch.no_grad():
        fns, results, outputs = {}, {}, {}
        for rt in runtimes:
            fn, result, out = set_up(rt, case)
            results[rt.name] = result
            if fn is not None:
                fns[rt.name], outputs[rt.name] = fn, out
        check_errors(list(results.values()), outputs, reference, fp64)
        fns = {n: f for n, f in fns.items() if results[n].ok}
        outputs.clear()
        warm_up(fns, results, settings, case)
        rounds = run_rounds(fns, results, settings, case)
    return {"case": case, "unit": unit, "rounds": rounds, "settings": settings.to_dict(),
            "results": [r.to_dict() for r in results.values()]}


# -- derived figures ------------------------------------------------------------------


def fastest_stock_ms(case: dict) -> float | None:
    """The smallest median among the case's stock runtimes that ran."""
    meds = [r["median_ms"] for r in case["results"] if r["stock"] and r["status"] == "ok"]
    return min(meds) if meds else None


def result_for(case: dict, runtime: str) -> dict | None:
    """The case's result dict for one runtime name, or None."""
    return next((r for r in case["results"] if r["runtime"] == runtime), None)


def ratio(case: dict, num: str, den: str) -> float | None:
    """median(num) / median(den) in one case, when both ran."""
    a, b = result_for(case, num), result_for(case, den)
    if a is None or b is None or a["status"] != "ok" or b["status"] != "ok":
        return None
    return a["median_ms"] / b["median_ms"]


# -- formatting -----------------------------------------------------------------------


def fmt(value: float | None, scale: float = 1.0) -> str:
    """A time or ratio with about three significant figures; '-' for None."""
    if value is None:
        return "-"
    v = value * scale
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    if abs(v) >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def fmt_err(value: float | None) -> str:
    """A relative error in scientific notation; '-' for None."""
    return "-" if value is None else f"{value:.1e}"


def na(result: dict) -> str:
    """'n/a (reason)' for a runtime that did not run."""
    reason = result.get("reason")
    if not reason:
        return "n/a"
    if len(reason) > TABLE_REASON_CHARS:
        reason = reason[: TABLE_REASON_CHARS - 3] + "..."
    return f"n/a ({reason})"


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    """A GitHub Markdown table; '|' inside cells is escaped."""
    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    out = [line(headers), "|" + "|".join("---" for _ in headers) + "|"]
    out += [line(r) for r in rows]
    return "\n".join(out)


# -- the machine ----------------------------------------------------------------------


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (or platform's answer elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    m = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return m.group(1).strip() if m else platform.machine()


def package_version(name: str) -> str | None:
    """An installed distribution's version, or None."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def machine_info(threads: int = THREADS) -> dict:
    """CPU, cores, threads used, load at start, package versions and the date."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    versions = {n: package_version(n) for n in
                ("torch", "torchvision", "onnxruntime", "onnx", "openvino", "braze")}
    return {"cpu": cpu_model(), "cores": cores, "threads": threads, "load_1min": load,
            "python": platform.python_version(), "versions": versions,
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}


def machine_line(m: dict) -> str:
    """The machine as one Markdown line for RESULTS.md."""
    vers = ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v)
    load = f", load average {m['load_1min']:.1f} at start" if m.get("load_1min") is not None else ""
    return (f"{m['cpu']}, {m['cores']} cores, {m['threads']} threads{load}; "
            f"Python {m['python']}, {vers}; {m['date'][:10]}")


# -- output files ---------------------------------------------------------------------


def write_json(payload: dict, path: Path) -> Path:
    """Write the benchmark's results as indented JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1) + "\n")
    return path


def bar_chart(cases: list[dict], path: Path, title: str) -> Path:
    """Horizontal bars of median time per runtime, one panel per case, IQR as error
    bars; runtimes that did not run are labelled n/a."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_rt = max(len(c["results"]) for c in cases)
    fig, axes = plt.subplots(len(cases), 1, figsize=(8, 0.45 * n_rt * len(cases) + 1.2),
                             squeeze=False)
    for ax, case in zip(axes[:, 0], cases):
        draw_case(ax, case)
    fig.suptitle(f"{title}   (blue: stock runtimes, orange: braze)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def draw_case(ax, case: dict) -> None:
    """One panel of bar_chart."""
    rs, k = case["results"], UNIT_SCALE[case["unit"]]
    y = np.arange(len(rs))
    meds = [k * r["median_ms"] if r["status"] == "ok" else 0.0 for r in rs]
    lo = [k * (r["median_ms"] - r["q1_ms"]) if r["status"] == "ok" else 0.0 for r in rs]
    hi = [k * (r["q3_ms"] - r["median_ms"]) if r["status"] == "ok" else 0.0 for r in rs]
    colors = ["tab:blue" if r["stock"] else "tab:orange" for r in rs]
    ax.barh(y, meds, xerr=[lo, hi], color=colors, capsize=3)
    ax.set_yticks(y, [r["runtime"] for r in rs])
    ax.invert_yaxis()
    for yi, r, m, h in zip(y, rs, meds, hi):
        label = "n/a" if r["status"] != "ok" else fmt(r["median_ms"], k)
        ax.text(m + h, yi, f"  {label}", va="center", ha="left", fontsize=8)
    ax.margins(x=0.12)  # room for the labels past the longest bar
    ax.set_xlabel(f"median {case['unit']} per call (IQR bars)")
    ax.set_title(case["case"], fontsize=10)


def replace_section(path: Path, section: str, body: str) -> None:
    """Replace the text between `<!-- section:begin -->` and `<!-- section:end -->` in a
    Markdown file (appending the marked section when absent)."""
    begin, end = f"<!-- {section}:begin -->", f"<!-- {section}:end -->"
    block = f"{begin}\n{body.rstrip()}\n{end}"
    text = path.read_text() if path.exists() else ""
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = text.rstrip() + ("\n\n" if text else "") + block + "\n"
    path.write_text(text)
