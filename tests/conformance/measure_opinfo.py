"""PyTorch's OpInfo database swept through torch.compile, float32 on CPU, against eager.

Each case is one sample input of one OpInfo (at most SAMPLES per op); it passes
when the compiled function's outputs match eager's under
`torch.testing.assert_close` (default float32 tolerances). Cases where eager
itself raises are not counted. Modes:

  braze        backend="braze", strict=True (a braze compile error fails the case
               rather than silently running eagerly), host fallback allowed
  nofallback   backend="braze", allow_fallback=False, strict=True, fullgraph=True:
               every node compiled by braze's own codegen (the coverage figure)
  inductor     backend="inductor", for comparison

    python tests/conformance/measure_opinfo.py --modes braze nofallback inductor \
        [--record] [--every N] [--jobs 2]

--record rewrites opinfo_passing.txt (braze mode) and opinfo_passing_nofallback.txt;
--every N measures every N-th case only (inductor compiles slowly); the summary
(pass rates, share of ops compiled with no fallback) goes to stdout and
opinfo_figures.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
SAMPLES = 3  # sample inputs per OpInfo
MODES = {
    "braze": dict(backend="braze", options={"strict": True}, fullgraph=False),
    "nofallback": dict(backend="braze", options={"strict": True, "allow_fallback": False},
                       fullgraph=True),
    "inductor": dict(backend="inductor", options=None, fullgraph=False),
}
RECORDS = {"braze": HERE / "opinfo_passing.txt",
           "nofallback": HERE / "opinfo_passing_nofallback.txt"}


def op_table() -> dict:
    """case-id prefix ('name.variant') -> OpInfo, for ops that support float32 on CPU."""
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    table = {}
    for op in op_db:
        if torch.float32 in op.supported_dtypes("cpu"):
            table[f"{op.name}.{op.variant_test_name}"] = op
    return table


def samples(op) -> list:
    import torch

    out = []
    try:
        for s in op.sample_inputs("cpu", torch.float32, requires_grad=False):
            out.append(s)
            if len(out) == SAMPLES:
                break
    except Exception:  # an OpInfo whose sample generator fails here: nothing to test
        pass
    return out


def case_ids(table: dict) -> list[str]:
    return [f"{key}#{i}" for key, op in table.items() for i in range(len(samples(op)))]


# Ops that return uninitialized memory: only shape and dtype can be compared (PyTorch's
# own OpInfo tests skip their values too); comparing values made these cases pass or
# fail by luck.
UNINITIALIZED = {"empty", "empty_like", "empty_permuted", "empty_strided", "new_empty",
                 "new_empty_strided"}


def _assert_same_metadata(got, expected) -> None:
    from torch.utils import _pytree as pytree

    a, b = pytree.tree_leaves(got), pytree.tree_leaves(expected)
    assert len(a) == len(b), f"{len(a)} results, expected {len(b)}"
    for x, y in zip(a, b):
        assert (x.shape, x.dtype) == (y.shape, y.dtype), \
            f"{x.dtype}{list(x.shape)}, expected {y.dtype}{list(y.shape)}"


def run_case(table: dict, case: str, mode: str) -> tuple[bool | None, str]:
    """(True, "") pass, (False, why) fail, (None, why) not counted (eager itself fails)."""
    import torch
    from torch.utils import _pytree as pytree

    key, index = case.rsplit("#", 1)
    op = table[key]
    sample = samples(op)[int(index)]
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    tensor_at = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]

    def fn(*tensors):
        full = list(leaves)
        for i, t in zip(tensor_at, tensors):
            full[i] = t
        inp, args, kwargs = pytree.tree_unflatten(full, spec)
        return op(inp, *args, **kwargs)

    inputs = [leaves[i] for i in tensor_at]
    torch.manual_seed(0)
    try:
        expected = fn(*[t.clone() for t in inputs])
    except Exception as e:
        return None, f"eager: {type(e).__name__}"
    cfg = MODES[mode]
    torch._dynamo.reset()
    torch.manual_seed(0)
    try:
        compiled = torch.compile(fn, backend=cfg["backend"], options=cfg["options"],
                                 fullgraph=cfg["fullgraph"])
        got = compiled(*[t.clone() for t in inputs])
        if key.split(".")[0] in UNINITIALIZED:  # their values are whatever memory held
            _assert_same_metadata(got, expected)
        else:
            torch.testing.assert_close(got, expected, equal_nan=True)
    except Exception as e:
        return False, f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"
    finally:
        torch._dynamo.reset()
    return True, ""


def _worker(args):
    cases, mode = args
    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("torch").setLevel(logging.ERROR)
    logging.getLogger("braze").setLevel(logging.ERROR)
    table = op_table()
    return [(c, *run_case(table, c, mode)) for c in cases]


def sweep(cases: list[str], mode: str, jobs: int) -> list[tuple]:
    chunks = [(cases[i::jobs * 8], mode) for i in range(jobs * 8)]
    with multiprocessing.get_context("spawn").Pool(jobs) as pool:
        return [r for part in pool.map(_worker, chunks) for r in part]


def summarize(results: list[tuple]) -> dict:
    counted = [(c, ok) for c, ok, _ in results if ok is not None]
    passed = [c for c, ok in counted if ok]
    ops: dict[str, bool] = {}
    for c, ok in counted:
        key = c.rsplit("#", 1)[0]
        ops[key] = ops.get(key, True) and ok
    return {"cases": len(counted), "passed": len(passed),
            "pass_rate": round(len(passed) / max(len(counted), 1), 4),
            "ops": len(ops), "ops_all_passed": sum(ops.values()),
            "op_share": round(sum(ops.values()) / max(len(ops), 1), 4)}


def format_figures(figures: dict) -> str:
    """opinfo_figures.json's text: one line per mode."""
    body = ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in figures.items())
    return "{\n" + body + "\n}\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", nargs="+", default=["braze", "nofallback"], choices=list(MODES))
    p.add_argument("--every", type=int, default=1, help="measure every N-th case only")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--record", action="store_true", help="rewrite the recorded passing lists")
    args = p.parse_args(argv)
    sys.path.insert(0, str(HERE.parents[1]))
    cases = case_ids(op_table())[::args.every]
    figures = {"samples_per_op": SAMPLES}
    for mode in args.modes:
        start = time.time()
        results = sweep(cases, mode, args.jobs)
        label = mode if args.every == 1 else f"{mode}_every{args.every}"
        figures[label] = {**summarize(results), "seconds": round(time.time() - start),
                          "date": time.strftime("%Y-%m-%d")}
        print(label, figures[label], flush=True)
        failures = sorted((c, why) for c, ok, why in results if ok is False)
        (HERE / f"opinfo_failures_{label}.txt").write_text(
            "".join(f"{c}\t{why}\n" for c, why in failures))
        if args.record and mode in RECORDS and args.every == 1:
            RECORDS[mode].write_text("".join(sorted(f"{c}\n" for c, ok, _ in results if ok)))
    out = HERE / "opinfo_figures.json"
    old = json.loads(out.read_text()) if out.exists() else {}
    old.update(figures)
    out.write_text(format_figures(old))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
