"""braze's CUDA target end to end on a real GPU: each ONNX model in benchmarks/cuda_check/models
compiled with compile_onnx(target="cuda"), its outputs against onnxruntime on the CPU,
and its time against torch eager on the GPU where the model came from torch."""
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import bridge  # noqa: E402

TARGET = os.environ.get("CHECK_TARGET", "cuda")  # "cpu": a dry run without a GPU


def rel_err(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


def timed(fn, rounds=30):
    for _ in range(5):
        fn()
    samples = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e3


for path in sorted(Path(__file__).with_name("models").glob("*.onnx")):
    model = onnx.load(path)
    data = np.load(path.with_suffix(".npz"))
    arrays = [data[f"in{i}"] for i in range(len(data.files))]
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    want = sess.run(None, dict(zip(names, arrays)))
    try:
        t = time.perf_counter()
        fn = bridge.compile_onnx(model, target=TARGET)
        got = fn(*arrays)
        compile_s = time.perf_counter() - t
        errs = [rel_err(g, w) for g, w in zip(got, want)]
        finite = all(np.isfinite(np.asarray(g)).all() for g in got)
        ms = timed(lambda: fn(*arrays))
        ort_ms = timed(lambda: sess.run(None, dict(zip(names, arrays))))
        print(f"{path.stem:40s} ok  max rel err {max(errs):.2e} finite {finite} "
              f"compile {compile_s:.1f} s  braze {TARGET} {ms:.3f} ms (numpy in/out)  "
              f"ort cpu {ort_ms:.3f} ms", flush=True)
    except Exception:
        print(f"{path.stem:40s} FAILED", flush=True)
        traceback.print_exc()
