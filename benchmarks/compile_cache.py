"""Compile time with a cold and a warm disk cache: `python -m benchmarks.compile_cache`.

The fusion benchmark's four models and ResNet-50 (batch 1) are exported to ONNX once;
then two fresh processes in turn compile every model with bridge.compile_onnx (the
compile happens at the first call: import, passes, clustering, codegen, loading) against
one new cache directory. The first process finds the cache empty, the second finds what
the first wrote. Each process reports its seconds per model, measured around
`compile_onnx(path)` and the first call, so Python's own start-up is not counted.
Prints a table, and the warm/cold ratio of the totals.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import common


def export_models(folder: Path) -> dict[str, tuple[Path, list[np.ndarray]]]:
    """name -> (ONNX path, inputs) for the fusion cases and ResNet-50 at batch 1."""
    from benchmarks import fusion, resnet50, runtimes

    modules = fusion.torch_modules()
    out = {}
    for case in fusion.cases():
        path = case.make_onnx(modules[case.name], case.inputs, folder / f"{case.name}.onnx")
        out[case.name] = (path, case.inputs)
    arrays = [resnet50.make_input(1)]
    path = runtimes.export_onnx(resnet50.build_model(), arrays, folder / "resnet50.onnx")
    out["resnet50 (batch 1)"] = (path, arrays)
    return out


def compile_all(spec: Path) -> dict[str, float]:
    """In this process: seconds to compile (and first-call) each model listed in `spec`."""
    import bridge

    models = json.loads(spec.read_text())
    seconds = {}
    for name, entry in models.items():
        inputs = [np.load(p) for p in entry["inputs"]]
        start = time.perf_counter()
        bridge.compile_onnx(entry["path"])(*inputs)
        seconds[name] = time.perf_counter() - start
    return seconds


def run_process(spec: Path, cache: Path) -> dict[str, float]:
    env = {**os.environ, "BRAZE_CACHE_DIR": str(cache)}
    done = subprocess.run([sys.executable, "-m", "benchmarks.compile_cache", "--child",
                           str(spec)], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.compile_cache", description=__doc__)
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(compile_all(args.child)))
        return {}
    with tempfile.TemporaryDirectory(prefix="braze-cache-bench-") as tmp:
        folder = Path(tmp)
        common.progress("exporting the models")
        models = {}
        for name, (path, inputs) in export_models(folder).items():
            files = []
            for i, a in enumerate(inputs):
                files.append(str(folder / f"{path.stem}.in{i}.npy"))
                np.save(files[-1], a)
            models[name] = {"path": str(path), "inputs": files}
        spec = folder / "models.json"
        spec.write_text(json.dumps(models))
        cache = folder / "cache"
        common.progress("first process (empty cache)")
        cold = run_process(spec, cache)
        common.progress("second process (the first one's cache)")
        warm = run_process(spec, cache)
    rows = [[name, f"{cold[name]:.2f}", f"{warm[name]:.2f}", f"{warm[name] / cold[name]:.2f}"]
            for name in cold]
    total_cold, total_warm = sum(cold.values()), sum(warm.values())
    rows.append(["total", f"{total_cold:.2f}", f"{total_warm:.2f}",
                 f"{total_warm / total_cold:.2f}"])
    print(common.markdown_table(["model", "cold cache s", "warm cache s", "warm/cold"], rows))
    return {"cold": cold, "warm": warm}


if __name__ == "__main__":
    main()
