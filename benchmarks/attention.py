"""The attention kernel alone: `python -m benchmarks.attention [--seqs 128 512 2048]`.

Causal self-attention, batch 1, 12 heads, head dim 64, fp32, in one process with the
benchmarks' method (benchmarks/common.py: interleaved seeded rounds, settle pause,
lead-in calls): torch's scaled_dot_product_attention (eager; the reference), and on the
TorchScript exporter's decomposed ONNX pattern (MatMul, Mul, Add of a causal mask,
Softmax, MatMul) onnxruntime and braze's compile_onnx (which recognizes the pattern:
one attention kernel). Per length it also prints braze's memory plan: the arena of
intermediates and the largest buffer braze materializes, against the T x T scores a
decomposed graph writes (4 * heads * T^2 bytes).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from benchmarks import common, runtimes
from benchmarks.common import Runtime, Settings

HEADS, HEAD_DIM = 12, 64


class _Sdpa:
    """Built lazily (torch imported in main)."""

    @staticmethod
    def module():
        import torch

        class Sdpa(torch.nn.Module):
            def forward(self, q, k, v):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

        return Sdpa().eval()


def memory_plan(path: Path) -> dict:
    """braze's compiled clusters for the ONNX file: arena bytes, the largest buffer it
    materializes, and the kernels' contractions."""
    from compiler import driver
    from compiler.codegen import compile_graph
    from compiler.passes.cluster import outline
    from importers.onnx import import_onnx

    graph = import_onnx(str(path)).graph
    arena, largest, ops = 0, 0, []
    for cluster in driver.plan(graph, "cpu", allow_fallback=False).clusters:
        cg = compile_graph(outline(graph, cluster))
        arena += cg.arena_bytes
        largest = max([largest] + [v.type.size * 4 for v in cg.plan.materialized])
        ops += [k.contraction.op for k in cg.kernels if k.contraction is not None]
    return {"arena_bytes": arena, "largest_buffer_bytes": largest, "kernels": ops}


def _ort(path: Path, arrays: list, threads: int) -> Runtime:
    def setup():
        sess = runtimes.ort_session(path, threads)
        feeds = {i.name: a for i, a in zip(sess.get_inputs(), arrays)}
        return lambda: sess.run(None, feeds)

    return Runtime("onnxruntime", setup)


def _braze(path: Path, arrays: list, threads: int) -> Runtime:
    def setup():
        import bridge

        compiled = bridge.compile_onnx(str(path), threads=threads)
        return lambda: compiled(*arrays)

    return Runtime("braze (compile_onnx)", setup, stock=False)


def run(seq: int, settings: Settings, workdir: Path, threads: int) -> dict:
    rng = np.random.default_rng(seq)
    arrays = [rng.standard_normal((1, HEADS, seq, HEAD_DIM)).astype(np.float32)
              for _ in range(3)]
    module = _Sdpa.module()
    path = runtimes.export_onnx(module, arrays, workdir / f"attention_{seq}.onnx")
    rts = [runtimes.torch_eager(module, arrays, "torch SDPA"),
           _ort(path, arrays, threads), _braze(path, arrays, threads)]
    case = common.measure(f"attention T={seq}", rts, settings, reference="torch SDPA")
    case["memory"] = memory_plan(path)
    case["scores_bytes"] = 4 * HEADS * seq * seq
    return case


def table(cases: list[dict]) -> str:
    rows = []
    for c in cases:
        med = {r["runtime"]: r.get("median_ms") for r in c["results"]}
        braze = next(r for r in c["results"] if r["runtime"].startswith("braze"))
        mem = c["memory"]
        rows.append([c["case"], common.fmt(med.get("torch SDPA")),
                     common.fmt(med.get("onnxruntime")), common.fmt(braze.get("median_ms")),
                     common.fmt(common.ratio(c, braze["runtime"], "torch SDPA")),
                     common.fmt(common.ratio(c, braze["runtime"], "onnxruntime")),
                     common.fmt_err(braze.get("max_rel_err")),
                     f"{mem['arena_bytes'] / 2**20:.2f} MiB",
                     f"{mem['largest_buffer_bytes'] / 2**20:.2f} MiB",
                     f"{c['scores_bytes'] / 2**20:.1f} MiB", " ".join(mem["kernels"])])
    return common.markdown_table(
        ["case", "torch SDPA ms", "onnxruntime ms", "braze ms", "braze/SDPA", "braze/ort",
         "braze err", "braze arena", "largest buffer", "T x T scores", "braze kernels"],
        rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seqs", type=int, nargs="+", default=[128, 512, 2048])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--budget", type=float, default=40.0)
    p.add_argument("--threads", type=int, default=common.THREADS)
    args = p.parse_args(argv)
    common.configure_threads(args.threads)
    # lead-in calls before each sample, as the zoo, fusion and ResNet-50 harnesses do
    # (common.LEAD_IN_S): without them a T=128 call (~0.5 ms) was timed with the second
    # core still waking from the settle pause, 5-6 ms for braze and torch's SDPA alike
    settings = Settings(warmup=2, rounds=args.rounds, budget_s=args.budget, lead_in=1)
    with tempfile.TemporaryDirectory() as tmp:
        cases = [run(seq, settings, Path(tmp), args.threads) for seq in args.seqs]
    print(common.machine_line(common.machine_info(args.threads)))
    print(table(cases))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
