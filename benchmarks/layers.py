"""Per layer: what braze's conv kernels reach inside ResNet-50, against the FMA peak.

    python -m benchmarks.layers [--batch 1] [--threads 2] [--rounds 20] [--update-results]

ResNet-50 (benchmarks.resnet50's model, exported to ONNX) is compiled by
`bridge.compile_onnx`; `CpuStep.profile` (runtime/cpu.py) times every kernel of the one
executable in place (a copy of its code that reads the cycle counter between
kernels), so each layer sees the caches and memory traffic it has in the model.
GFLOP/s count a direct convolution's 2 * multiply-adds (a Winograd layer does fewer
multiplies, so it can pass the peak). The peak is measured here, for the CPU the layers
are built for (`--cpu`: an AVX2 build's peak is half an AVX-512 one's where the cores
run 512-bit FMAs at full width): an unrolled loop of independent FMAs of that target's
vector width (24 accumulators, no loads) on each thread at once.

Prints one row per distinct conv shape (summed over its layers), furthest from the
peak first, the non-conv kernels' total, and writes benchmarks/out/layers.json.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from benchmarks import common, runtimes
from benchmarks.resnet50 import build_model, make_input

PEAK_ITERS = 20_000_000
ACCUMULATORS = 24


def peak_chains(target) -> int:
    """FMA chains the peak probe runs on `target` (a compiler.target.Target): as many as
    its registers hold beside the two operands (24 of AVX-512's 32, 14 of AVX2's 16: 24
    there spilled, and measured half the peak)."""
    return min(ACCUMULATORS, target.vector_registers - 2)


def fma_peak_gflops(threads: int, target: str = "cpu") -> float:
    """GFLOP/s of `threads` threads each running up to ACCUMULATORS independent float32 FMA
    chains of `target`'s vector width (what the micro-kernel's inner loop is made of),
    built for that target (it must run here)."""
    from llvmlite import ir

    from compiler import target as targets
    from compiler.codegen import llvm_cpu
    from compiler.kernels.gemm import F32, Tile, _i64, _phi_loop, mul_add
    from runtime.cpu import JitModule

    spec = targets.parse(target)
    lanes = spec.vec
    chains = peak_chains(spec)
    tile = Tile(vec=lanes, nv=2, mr=12, fma=spec.fma)
    V16 = tile.vtype
    module = ir.Module("peak")
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ir.PointerType()]), "peak")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    x = b.load(fn.args[0], typ=V16, align=4)
    y = b.load(b.gep(fn.args[0], [_i64(lanes)], source_etype=F32), typ=V16, align=4)
    out = _phi_loop(b, PEAK_ITERS, [x] * chains,
                    lambda b, i, accs: [mul_add(b, tile, a, y, x) for a in accs])
    total = out[0]
    for a in out[1:]:
        total = b.fadd(total, a)
    b.store(total, fn.args[0], align=4)
    b.ret_void()
    jit = JitModule(object_code=llvm_cpu.compile_ir(str(module), spec))
    run = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(jit.address("peak"))
    bufs = [np.full(32, 0.5, np.float32) for _ in range(threads)]
    run(bufs[0].ctypes.data)  # warm
    workers = [threading.Thread(target=run, args=(a.ctypes.data,)) for a in bufs]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    seconds = time.perf_counter() - start
    return threads * PEAK_ITERS * chains * lanes * 2 / seconds / 1e9


def describe(k) -> tuple[str, int]:
    """(a conv kernel's shape and implementation, its multiply-adds counted as a direct
    conv), from the fusion plan's choice (`Kernel.impl`)."""
    node = k.contraction
    x, w = node.inputs[0].shape, node.inputs[1].shape
    y = node.outputs[0].shape
    stride = node.attrs["strides"][0]
    algo = f"Winograd F({k.impl.m}x{k.impl.m})" if k.impl.m else "direct"
    label = (f"{w[2]}x{w[3]} s{stride} {x[3]}->{w[0]} @ {y[1]}x{y[2]} ({algo})")
    return label, int(np.prod(y)) * int(np.prod(w[1:]))


def profile_resnet(batch: int, threads: int, rounds: int, target: str = "cpu") -> dict:
    import bridge

    model = build_model()
    x = make_input(batch)
    with tempfile.TemporaryDirectory(prefix="braze-layers-") as tmp:
        path = runtimes.export_onnx(model, [x], Path(tmp) / "resnet50.onnx")
        compiled = bridge.compile_onnx(str(path), threads=threads, target=target)
        compiled(x)
    spec = next(iter(compiled._specs.values()))
    graphs = [p.compiled for p in spec.parts if p.compiled is not None]
    if len(graphs) != 1:
        raise SystemExit(f"expected ResNet-50 as one compiled cluster, got {len(graphs)}")
    cg = graphs[0]
    if [tuple(v.shape) for v in cg.graph.inputs] != [x.shape]:
        raise SystemExit("expected the cluster to take the model input as it is")
    cg.profile([x], rounds=3)  # compiles the profiling copy, warms up
    times = cg.profile([x], rounds=rounds)
    rows: dict[str, dict] = defaultdict(lambda: {"layers": 0, "seconds": 0.0, "macs": 0})
    other = 0.0
    for k, seconds in zip(cg.kernels, times):
        node = k.contraction
        if node is None or node.op != "conv":
            other += seconds
            continue
        label, macs = describe(k)
        row = rows[label]
        row["layers"] += 1
        row["seconds"] += seconds
        row["macs"] += macs
    return {"rows": dict(rows), "other_s": other, "total_s": float(sum(times)),
            "kernels": len(cg.kernels)}


def report(result: dict, peak: float, threads: int, batch: int, target: str = "cpu") -> str:
    built = "" if target == "cpu" else f", built for {target}"
    lines = [f"ResNet-50 batch {batch}, {threads} threads{built}: {result['kernels']} kernels, "
             f"{result['total_s'] * 1e3:.1f} ms in kernels; FMA peak {peak:.0f} GFLOP/s "
             f"({threads} threads, {target}'s vectors)", "",
             "| conv (kernel x kernel, stride, channels @ output) | layers | ms | GFLOP/s "
             "| of peak |", "|---|---|---|---|---|"]
    rows = sorted(result["rows"].items(),
                  key=lambda kv: 2 * kv[1]["macs"] / kv[1]["seconds"])
    for label, r in rows:
        gflops = 2 * r["macs"] / r["seconds"] / 1e9
        lines.append(f"| {label} | {r['layers']} | {r['seconds'] * 1e3:.2f} | {gflops:.0f} "
                     f"| {gflops / peak:.0%} |")
    lines.append(f"| pooling, layout, FC and the rest | | {result['other_s'] * 1e3:.2f} | | |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--threads", type=int, default=common.THREADS)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--cpu", default=None, metavar="NAME",
                   help="profile braze built for this LLVM CPU (e.g. x86-64-v3; it must run here)")
    p.add_argument("--out", type=Path, default=common.OUT_DIR)
    p.add_argument("--update-results", action="store_true",
                   help="rewrite the per-layer section of benchmarks/RESULTS.md")
    args = p.parse_args(argv)
    common.configure_threads(args.threads)
    target = f"cpu:{args.cpu}" if args.cpu else "cpu"
    common.progress(f"measuring the FMA peak ({target})")
    peak = fma_peak_gflops(args.threads, target)
    common.progress(f"profiling ResNet-50 at batch {args.batch}")
    result = profile_resnet(args.batch, args.threads, args.rounds, target)
    table = report(result, peak, args.threads, args.batch, target)
    print(table)
    if args.update_results:
        machine = common.machine_line(common.machine_info(args.threads))
        common.replace_section(common.RESULTS_MD, "layers", f"Machine: {machine}.\n\n{table}")
    args.out.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": "layers", "machine": common.machine_info(args.threads),
               "batch": args.batch, "threads": args.threads, "peak_gflops": peak, **result}
    path = args.out / f"layers_b{args.batch}.json"
    path.write_text(json.dumps(payload, indent=1))
    common.progress(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
