"""ResNet-50 (batch 1, random weights) exported as a C library (issue 14): file sizes, the
C program's output against compile_onnx's, and latency from C against compile_onnx from
Python, timed in one run, alternating. `python -m benchmarks.export_c [--threads N]`."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

# A C program: reads the input, runs the model `rounds` times, prints the median
# microseconds per call, writes the output.
MAIN_C = """
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "NAME.h"

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  int rounds = atoi(argv[3]);
  float *in = malloc(sizeof(float) * UP_INPUT0_SIZE);
  float *out = malloc(sizeof(float) * UP_OUTPUT0_SIZE);
  void *scratch = malloc(UP_SCRATCH_BYTES);
  double *us = malloc(sizeof(double) * rounds);
  FILE *f = fopen(argv[1], "rb");
  if (fread(in, sizeof(float), UP_INPUT0_SIZE, f) != UP_INPUT0_SIZE) return 2;
  fclose(f);
  NAME_run(in, out, scratch);
  for (int i = 0; i < rounds; i++) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    NAME_run(in, out, scratch);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    us[i] = (t1.tv_sec - t0.tv_sec) * 1e6 + (t1.tv_nsec - t0.tv_nsec) / 1e3;
  }
  qsort(us, rounds, sizeof(double), cmp);
  printf("%.1f\\n", rounds ? us[rounds / 2] : 0.0);
  f = fopen(argv[2], "wb");
  fwrite(out, sizeof(float), UP_OUTPUT0_SIZE, f);
  fclose(f);
  return 0;
}
"""


def main(argv=None) -> int:
    import torch
    import torchvision

    import bridge
    from benchmarks.runtimes import export_onnx

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--cross", action="store_true",
                    help="also cross-compile for aarch64-linux-gnu (neoverse-n1) and run "
                    "under qemu-aarch64 (needs gcc-aarch64-linux-gnu, qemu-user)")
    ap.add_argument("--out", default=None, help="directory to keep (default: a temporary one)")
    args = ap.parse_args(argv)
    work = Path(args.out or tempfile.mkdtemp(prefix="braze-resnet-c-"))
    work.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = torchvision.models.resnet50().eval()
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    onnx_path = export_onnx(model, [x], work / "resnet50.onnx")
    lib = work / "lib"
    cmd = ["python", "-m", "bridge.cli", "compile", str(onnx_path), "--emit", "c", "-o",
           str(lib), "--name", "resnet50", "--threads", str(args.threads)]
    print("$", " ".join(cmd))
    t0 = time.perf_counter()
    from bridge.cli import main as cli

    cli(cmd[3:])
    print(f"export: {time.perf_counter() - t0:.1f} s")
    for f in ("resnet50.h", "libresnet50.a", "libresnet50.so"):
        print(f"{f}: {(lib / f).stat().st_size / 1e6:.3f} MB")
    print(f"weights (onnx initializers): {_weight_bytes(onnx_path) / 1e6:.1f} MB")
    main_c = MAIN_C.replace("UP_", "RESNET50_").replace("NAME", "resnet50")
    (lib / "main.c").write_text(main_c)
    link = ["cc", "-O2", "main.c", "-I.", "libresnet50.a", "-lm", "-o", "main"]
    if args.threads > 1:
        link.insert(-2, "-lgomp")
    print("$", " ".join(link))
    subprocess.run(link, cwd=lib, check=True)
    print(subprocess.run(["ldd", "libresnet50.so"], cwd=lib, capture_output=True,
                         text=True).stdout)
    x.tofile(lib / "x.bin")
    compiled = bridge.compile_onnx(onnx_path, threads=args.threads)
    want = compiled(x)[0]
    c_us, py_us = [], []
    for _ in range(3):  # alternate C and Python, to share the machine's noise
        run = subprocess.run(["./main", "x.bin", "y.bin", str(args.rounds)], cwd=lib,
                             capture_output=True, text=True, check=True)
        c_us.append(float(run.stdout))
        times = []
        for _ in range(args.rounds):
            t = time.perf_counter()
            compiled(x)
            times.append((time.perf_counter() - t) * 1e6)
        py_us.append(float(np.median(times)))
    got = np.fromfile(lib / "y.bin", np.float32).reshape(want.shape)
    print(f"max abs diff C vs compile_onnx: {np.abs(got - want).max():.3g} "
          f"(bit-identical: {np.array_equal(got, want)})")
    print(f"latency (median of {args.rounds}, 3 alternating runs, threads={args.threads}): "
          f"C {', '.join(f'{u / 1e3:.2f}' for u in c_us)} ms; compile_onnx from Python "
          f"{', '.join(f'{u / 1e3:.2f}' for u in py_us)} ms")
    if args.cross:
        _cross(onnx_path, work, main_c, want)
    if args.out is None:
        shutil.rmtree(work)
    return 0


def _cross(onnx_path: Path, work: Path, main_c: str, want: np.ndarray) -> None:
    from bridge.cli import main as cli

    lib = work / "lib-aarch64"
    cmd = ["compile", str(onnx_path), "--emit", "c", "-o", str(lib), "--name", "resnet50",
           "--triple", "aarch64-linux-gnu", "--cpu", "neoverse-n1"]
    print("$ python -m bridge.cli", " ".join(cmd))
    cli(cmd)
    (lib / "main.c").write_text(main_c)
    link = ["aarch64-linux-gnu-gcc", "-O2", "-static", "main.c", "-I.", "libresnet50.a",
            "-lm", "-o", "main"]
    print("$", " ".join(link))
    subprocess.run(link, cwd=lib, check=True)
    (work / "lib" / "x.bin").replace(lib / "x.bin")
    t = time.perf_counter()
    subprocess.run(["qemu-aarch64", "./main", "x.bin", "y.bin", "0"], cwd=lib, check=True,
                   capture_output=True)
    got = np.fromfile(lib / "y.bin", np.float32).reshape(want.shape)
    rel = np.abs(got - want).max() / np.abs(want).max()
    print(f"aarch64 under qemu ({time.perf_counter() - t:.0f} s): max abs diff against the "
          f"x86 run {np.abs(got - want).max():.3g}, max rel (to max |y|) {rel:.3g}, "
          f"elementwise max rel {np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-6)):.3g}")


def _weight_bytes(path: Path) -> int:
    import onnx

    return sum(np.prod(t.dims, dtype=np.int64) * 4 for t in onnx.load(str(path)).graph.initializer)


if __name__ == "__main__":
    raise SystemExit(main())
