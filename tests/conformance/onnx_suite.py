"""ONNX's own backend test suite (onnx.backend.test) run through any backend.

`python -m tests.conformance.onnx_suite` measures, in one run: the cases
onnxruntime.backend passes, how many of those pass through bridge.onnx_backend
with host fallback allowed, and how many with `allow_fallback=False` (every
node compiled by braze's own codegen). It rewrites the recorded passing lists
(onnx_passing.txt, onnx_passing_nofallback.txt) that test_onnx_backend.py
holds braze to. `--check` only prints the figures.

Kinds run: every kind the wheel ships: node, simple, pytorch-converted,
pytorch-operator and the `light` real models (onnx/backend/test/data/light: AlexNet,
DenseNet-121, Inception v1/v2, ResNet-50, ShuffleNet, SqueezeNet, VGG-19, ZFNet-512,
with weights made by the model itself; the suite writes their inputs and expected
outputs under $ONNX_MODELS, which defaults here to a temporary directory). Real
models that need downloads are not run (`real_model_names` keeps the light ones).

Cases onnxruntime passes but braze does not yet, kept with the reason in
onnx_expected_failures.txt (`name<TAB>reason`), are expected to fail: when one starts
passing, test_onnx_backend.py says so, and it moves to the passing lists.
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import os
import sys
import tempfile
import unittest
import warnings
from pathlib import Path

HERE = Path(__file__).parent
PASSING = HERE / "onnx_passing.txt"
PASSING_NOFALLBACK = HERE / "onnx_passing_nofallback.txt"
EXPECTED_FAILURES = HERE / "onnx_expected_failures.txt"
KINDS = ("NodeModel", "SimpleModel", "PyTorchConvertedModel", "PyTorchOperatorModel",
         "RealModel")
LIGHT_URL = "onnx/backend/test/data/light/"
# where the onnx runner writes the light models' generated inputs and outputs
os.environ.setdefault("ONNX_MODELS", os.path.join(tempfile.gettempdir(),
                                                  f"braze-onnx-light-{os.getuid()}"))
BACKENDS = ("onnxruntime", "braze", "braze-nofallback")


def _backend(name: str):
    if name == "onnxruntime":
        import onnxruntime.backend as ort_backend

        return ort_backend
    from bridge.onnx_backend import BrazeBackend

    if name == "braze":
        return BrazeBackend

    class NoFallback(BrazeBackend):
        @classmethod
        def prepare(cls, model, device="CPU", **options):
            return super().prepare(model, device, allow_fallback=False, **options)

    return NoFallback


@functools.cache
def items(backend: str) -> dict:
    """case name (without the _cpu suffix) -> TestItem for this backend."""
    import onnx.backend.test

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bt = onnx.backend.test.BackendTest(_backend(backend), __name__)
    out = {}
    light = set(real_model_names())
    for kind in KINDS:
        for name, item in bt._test_items[kind].items():
            if not name.endswith("_cpu"):
                continue
            short = name[: -len("_cpu")]
            if kind != "RealModel" or short in light:
                out[short] = item
    return out


@functools.cache
def real_model_names() -> tuple[str, ...]:
    """The real-model cases whose model ships in the wheel (the `light` ones)."""
    from onnx.backend.test.loader import load_model_tests

    return tuple(sorted(t.name for t in load_model_tests(kind="real")
                        if (t.url or "").startswith(LIGHT_URL)))


def expected_failures() -> dict[str, str]:
    """name -> reason, for the cases onnxruntime passes that braze does not yet."""
    out = {}
    for line in EXPECTED_FAILURES.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, reason = line.partition("\t")
            out[name.strip()] = reason.strip()
    return out


def run_case(backend: str, name: str) -> str:
    """'pass', 'skip' or 'fail: <first line of the error>'."""
    item = items(backend)[name]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            item.func(None)
        return "pass"
    except unittest.SkipTest:
        return "skip"
    except BaseException as e:  # the suite raises assertion and backend errors alike
        first = (str(e).strip().splitlines() or [""])[0]
        return f"fail: {type(e).__name__}: {first[:200]}"


def _job(args):
    backend, name = args
    return backend, name, run_case(backend, name)


def measure(jobs: int) -> dict[str, dict[str, str]]:
    names = sorted(items("onnxruntime"))
    results: dict[str, dict[str, str]] = {b: {} for b in BACKENDS}
    work = [(b, n) for n in names for b in BACKENDS]
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(jobs, maxtasksperchild=200) as pool:
        for i, (b, n, r) in enumerate(pool.imap_unordered(_job, work, chunksize=8)):
            results[b][n] = r
            if i % 500 == 0:
                print(f"  {i}/{len(work)}", file=sys.stderr)
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--check", action="store_true", help="print figures, do not rewrite lists")
    ap.add_argument("--failures", action="store_true", help="list braze's failures")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    res = measure(args.jobs)
    ort_pass = {n for n, r in res["onnxruntime"].items() if r == "pass"}
    braze_pass = {n for n in ort_pass if res["braze"][n] == "pass"}
    nofb_pass = {n for n in ort_pass if res["braze-nofallback"][n] == "pass"}
    total = len(res["onnxruntime"])
    print(f"cases run: {total}")
    print(f"onnxruntime.backend passes: {len(ort_pass)}")
    print(f"braze, fallback allowed:    {len(braze_pass)} "
          f"({100 * len(braze_pass) / max(len(ort_pass), 1):.1f}% of those)")
    print(f"braze, allow_fallback=False: {len(nofb_pass)} "
          f"({100 * len(nofb_pass) / max(len(ort_pass), 1):.1f}%)")
    if args.failures:
        for n in sorted(ort_pass - braze_pass):
            print(f"  FAIL {n}: {res['braze'][n]}")
    for n in sorted(expected_failures()):
        if n in braze_pass:
            print(f"  {n} now passes: remove it from {EXPECTED_FAILURES.name}")
    if not args.check:
        PASSING.write_text("".join(f"{n}\n" for n in sorted(braze_pass)))
        PASSING_NOFALLBACK.write_text("".join(f"{n}\n" for n in sorted(nofb_pass)))
        print(f"wrote {PASSING.name} and {PASSING_NOFALLBACK.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
