"""Run mutants through braze and onnxruntime in child processes, and classify each.

A worker process runs mutants one after another (imports are paid once); the parent
gives each TIMEOUT seconds: a worker that dies is a crash, one that does not answer in
time a hang (it is killed and a fresh worker takes the next mutant). Classes:

  braze error       braze refused with a bridge.BrazeError (its one-line message kept)
  equal output      braze's outputs equal onnxruntime's (float tolerance RTOL/ATOL)
  undefined cast    outputs differ only through a float -> int Cast, which ONNX leaves
                    undefined out of range (so any answer is right)
  other exception   braze raised something that is not a BrazeError
  crash             the worker process died
  hang              no answer within the timeout
  differing output  braze returned, and its outputs differ from onnxruntime's, or
                    onnxruntime refused the model or the call and braze answered
"""

from __future__ import annotations

import multiprocessing
import sys
import threading
import zlib
from collections import Counter
from dataclasses import dataclass

import numpy as np

CLASSES = ("braze error", "equal output", "undefined cast", "other exception", "crash",
           "hang", "differing output")
BAD = CLASSES[3:]
TIMEOUT = 60.0
RTOL, ATOL = 1e-4, 1e-5


@dataclass
class Result:
    name: str
    cls: str
    detail: str = ""


# -- in the worker -------------------------------------------------------------------

def _feeds(data: bytes, name: str) -> dict:
    """Inputs for the mutant's declared inputs (empty when it does not parse)."""
    import onnx
    from onnx import helper

    m = onnx.ModelProto()
    try:
        m.ParseFromString(data)
    except Exception:
        return {}
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    inits = {t.name for t in m.graph.initializer}
    feeds = {}
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
        except Exception:
            dtype = np.dtype(np.float32)
        shape = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else
                 (0 if d.HasField("dim_value") and d.dim_value == 0 else 2)
                 for d in tt.shape.dim]
        if dtype.kind == "f":
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iu":
            feeds[vi.name] = rng.integers(0, 10 if "embed" in name else 40,
                                          shape).astype(dtype)
            if dtype.kind == "i" and "embed" not in name:
                feeds[vi.name] -= 20
        elif dtype.kind == "b":
            feeds[vi.name] = rng.random(shape) < 0.5
        else:
            feeds[vi.name] = np.full(shape, "a", dtype=object)
    return feeds


def _onnxruntime(data: bytes, feeds: dict):
    """(outputs, None) or (None, error text)."""
    import onnxruntime as ort

    try:
        opts = ort.SessionOptions()
        opts.log_severity_level = 4
        s = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
        return s.run(None, feeds), None
    except Exception as e:
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"


def _equal(got: list, want: list) -> bool:
    if len(got) != len(want):
        return False
    for a, b in zip(got, want):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.dtype.kind == "f":
            if not np.allclose(a, b, rtol=RTOL, atol=ATOL, equal_nan=True):
                return False
        elif not np.array_equal(a, b):
            return False
    return True


def _has_float_to_int_cast(data: bytes) -> bool:
    import onnx

    m = onnx.ModelProto()
    m.ParseFromString(data)
    ints = {onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32,
            onnx.TensorProto.INT64, onnx.TensorProto.UINT8, onnx.TensorProto.UINT16,
            onnx.TensorProto.UINT32, onnx.TensorProto.UINT64}
    return any(n.op_type == "Cast" and any(a.name == "to" and a.i in ints
                                           for a in n.attribute) for n in m.graph.node)


def classify(name: str, data: bytes) -> Result:
    """One mutant's class (runs in the worker)."""
    import bridge

    feeds = _feeds(data, name)
    want, ort_error = _onnxruntime(data, feeds)
    try:
        model = bridge.compile_onnx(data)
        # by name, unless a flipped byte left a name that is not UTF-8 (protobuf gives
        # bytes, which Python takes as no keyword): then in the inputs' order
        named = all(isinstance(k, str) for k in feeds)
        got = model(**feeds) if named else model(*feeds.values())
    except bridge.BrazeError as e:
        return Result(name, "braze error", f"{type(e).__name__}: {str(e)[:200]}")
    except Exception as e:
        return Result(name, "other exception", f"{type(e).__name__}: {str(e)[:200]}")
    if ort_error is not None:
        return Result(name, "differing output", f"onnxruntime refused ({ort_error}); "
                                                f"braze answered")
    if _equal(got, want):
        return Result(name, "equal output")
    if _has_float_to_int_cast(data):
        return Result(name, "undefined cast")
    return Result(name, "differing output", "outputs differ from onnxruntime's")


def _serve(conn) -> None:
    import logging
    import os
    import warnings

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.stdout = open(os.devnull, "w")  # onnxruntime's Python layer prints EP errors there
    warnings.filterwarnings("ignore")
    logging.getLogger("braze").setLevel(logging.CRITICAL)
    while True:
        job = conn.recv()
        if job is None:
            return
        conn.send(classify(*job))


# -- in the parent --------------------------------------------------------------------

class _Worker:
    def __init__(self):
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child,), daemon=True)
        self.proc.start()
        child.close()

    def run(self, name: str, data: bytes, timeout: float) -> Result:
        self.conn.send((name, data))
        if self.conn.poll(timeout):
            try:
                return self.conn.recv()
            except EOFError:
                pass
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
            return Result(name, "hang", f"no answer in {timeout:.0f} s")
        self.proc.join()
        return Result(name, "crash", f"worker died, exit code {self.proc.exitcode}")

    def close(self) -> None:
        if self.proc.is_alive():
            self.conn.send(None)
            self.proc.join(10)
            if self.proc.is_alive():
                self.proc.kill()


def run_all(mutants: list[tuple[str, bytes]], jobs: int = 2,
            timeout: float = TIMEOUT) -> list[Result]:
    """Every mutant's Result, in order, over `jobs` worker processes."""
    results: list[Result | None] = [None] * len(mutants)

    def lane(k: int) -> None:
        worker = _Worker()
        for i in range(k, len(mutants), jobs):
            results[i] = worker.run(*mutants[i], timeout)
            if results[i].cls in ("crash", "hang"):
                worker = _Worker()
        worker.close()

    threads = [threading.Thread(target=lane, args=(k,)) for k in range(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def table(results: list[Result]) -> str:
    counts = Counter(r.cls for r in results)
    width = max(len(c) for c in CLASSES)
    lines = [f"{'class':<{width}}  count"] + [f"{c:<{width}}  {counts.get(c, 0):5d}"
                                               for c in CLASSES]
    lines.append(f"{'total':<{width}}  {len(results):5d}")
    return "\n".join(lines)
