"""Fusion micro-benchmarks: `python -m benchmarks.fusion`.

Small graphs where fusing elementwise work (or not paying per-op overhead) is what
decides the time, each run by torch eager, torch.compile (inductor), onnxruntime
(ORT_ENABLE_ALL) and braze (bridge.compile_onnx), all on common.THREADS threads:

- softmax: exp / reduce-sum / div over 64x4096 fp32, written from primitives in both
  (torch: e = x.exp(); e / e.sum(-1, keepdim=True); ONNX: Exp, ReduceSum, Div), with
  no max subtraction in either (inputs are standard normal, so exp cannot overflow).
- mlp: 4 x (LayerNorm -> Linear 768 -> GELU -> residual) at batch 32, a torch module
  and its TorchScript ONNX export.
- chain: 16 elementwise ops over 2**20 floats, built for torch and ONNX from one table.
- add: a single Add of two 1x1 tensors: the per-call overhead, in microseconds.

Prints a table (times, braze/ORT and braze/eager ratios) and writes
benchmarks/out/fusion.json; --update-results rewrites its section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import faulthandler
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from benchmarks import common, runtimes
from benchmarks.common import OUT_DIR, RESULTS_MD, Settings, fmt, fmt_err

SEED = 0
OPSET = 17
SOFTMAX_SHAPE = (64, 4096)
MLP_BATCH, MLP_FEATURES, MLP_BLOCKS = 32, 768, 4
CHAIN_ELEMENTS = 1 << 20
DEFAULT_WARMUP = 5
DEFAULT_ROUNDS = 30
QUICK = {"warmup": 1, "rounds": 3}

# The elementwise chain: (ONNX op, constant operand or None). Chosen so every value stays
# finite and in the domain of the next op (Sqrt and Log see values above 1).
CHAIN = [("Mul", 0.5), ("Add", 0.25), ("Tanh", None), ("Mul", 3.0), ("Sub", 0.1),
         ("Sigmoid", None), ("Add", 1.0), ("Sqrt", None), ("Neg", None), ("Exp", None),
         ("Mul", 2.0), ("Abs", None), ("Add", 1.5), ("Log", None), ("Relu", None),
         ("Mul", 1.5)]


def torch_chain_op(op: str, const: float | None) -> Callable:
    """The torch function for one CHAIN entry."""
    import torch

    binary = {"Mul": lambda x: x * const, "Add": lambda x: x + const,
              "Sub": lambda x: x - const}
    unary = {"Tanh": torch.tanh, "Sigmoid": torch.sigmoid, "Sqrt": torch.sqrt,
             "Neg": torch.neg, "Exp": torch.exp, "Abs": torch.abs, "Log": torch.log,
             "Relu": torch.relu}
    return binary[op] if const is not None else unary[op]


# -- torch modules --------------------------------------------------------------------


def torch_modules():
    """The torch side of every case (built lazily: torch is imported here)."""
    import torch
    from torch import nn

    class Softmax(nn.Module):
        def forward(self, x):
            e = x.exp()
            return e / e.sum(-1, keepdim=True)

    class Block(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.norm, self.fc = nn.LayerNorm(n), nn.Linear(n, n)

        def forward(self, x):
            return x + torch.nn.functional.gelu(self.fc(self.norm(x)))

    class Chain(nn.Module):
        def __init__(self):
            super().__init__()
            self.fns = [torch_chain_op(op, c) for op, c in CHAIN]

        def forward(self, x):
            for f in self.fns:
                x = f(x)
            return x

    class AddOne(nn.Module):
        def forward(self, a, b):
            return a + b

    torch.manual_seed(SEED)
    mlp = nn.Sequential(*[Block(MLP_FEATURES) for _ in range(MLP_BLOCKS)]).eval()
    return {"softmax": Softmax(), "mlp": mlp, "chain": Chain(), "add": AddOne()}


# -- ONNX models from primitives ------------------------------------------------------


def onnx_model(nodes, inputs, outputs, initializers=(), name="bench"):
    """A float32 ONNX model at OPSET from nodes and (name, shape) inputs/outputs."""
    from onnx import TensorProto, helper

    def vi(n, shape):
        return helper.make_tensor_value_info(n, TensorProto.FLOAT, list(shape))

    graph = helper.make_graph(nodes, name, [vi(*i) for i in inputs],
                              [vi(*o) for o in outputs], list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                             ir_version=8)


def scalar(name: str, value: float):
    """A float32 scalar initializer."""
    from onnx import numpy_helper

    return numpy_helper.from_array(np.array(value, dtype=np.float32), name)


def softmax_onnx():
    """Exp -> ReduceSum(axis -1, keepdims) -> Div, the same form as the torch module."""
    from onnx import helper, numpy_helper

    axes = numpy_helper.from_array(np.array([-1], dtype=np.int64), "axes")
    nodes = [helper.make_node("Exp", ["in0"], ["e"]),
             helper.make_node("ReduceSum", ["e", "axes"], ["s"], keepdims=1),
             helper.make_node("Div", ["e", "s"], ["out0"])]
    return onnx_model(nodes, [("in0", SOFTMAX_SHAPE)], [("out0", SOFTMAX_SHAPE)], [axes],
                      "softmax")


def chain_onnx():
    """The CHAIN table as ONNX nodes, constants as scalar initializers."""
    from onnx import helper

    nodes, inits, prev = [], [], "in0"
    for i, (op, const) in enumerate(CHAIN):
        out = "out0" if i == len(CHAIN) - 1 else f"t{i}"
        if const is None:
            nodes.append(helper.make_node(op, [prev], [out]))
        else:
            inits.append(scalar(f"c{i}", const))
            nodes.append(helper.make_node(op, [prev, f"c{i}"], [out]))
        prev = out
    shape = (CHAIN_ELEMENTS,)
    return onnx_model(nodes, [("in0", shape)], [("out0", shape)], inits, "chain")


def add_onnx():
    """One Add of two 1x1 inputs."""
    from onnx import helper

    node = helper.make_node("Add", ["in0", "in1"], ["out0"])
    return onnx_model([node], [("in0", (1, 1)), ("in1", (1, 1))], [("out0", (1, 1))],
                      name="add")


# -- cases ----------------------------------------------------------------------------


@dataclass
class Case:
    """One fusion case: its inputs, how its ONNX file is made, how it is timed."""

    name: str
    description: str
    inputs: list[np.ndarray]
    make_onnx: Callable  # (torch module, inputs, path) -> path
    number: int = 1  # calls per timed sample
    unit: str = "ms"


def saved(build: Callable) -> Callable:
    """A make_onnx that saves a model built with onnx.helper."""
    def make(module, inputs, path: Path) -> Path:
        import onnx

        onnx.save(build(), str(path))
        return path

    return make


def cases() -> list[Case]:
    """The four cases, with fixed random inputs. `number` keeps a sample near a
    millisecond or more, so the timer's resolution does not matter."""
    rng = np.random.default_rng(SEED)

    def randn(*shape):
        return rng.standard_normal(shape, dtype=np.float32)

    return [
        Case("softmax", "exp/sum/div, 64x4096", [randn(*SOFTMAX_SHAPE)],
             saved(softmax_onnx), number=5),
        Case("mlp", "4x(LayerNorm, Linear 768, GELU, residual), batch 32",
             [randn(MLP_BATCH, MLP_FEATURES)], runtimes.export_onnx),
        Case("chain", f"{len(CHAIN)} elementwise ops, 2^20 floats", [randn(CHAIN_ELEMENTS)],
             saved(chain_onnx)),
        Case("add", "one Add, 1x1 (per-call overhead)", [randn(1, 1), randn(1, 1)],
             saved(add_onnx), number=200, unit="us"),
    ]


def case_runtimes(module, case: Case, onnx_path: Path, cpus=(),
                  only=()) -> list[common.Runtime]:
    """The runtimes compared on one case (torch eager first: the reference), braze also
    built for each CPU in `cpus`; only those named by `only` (substrings), if given."""
    return runtimes.chosen([
        runtimes.torch_eager(module, case.inputs),
        runtimes.torch_compiled(module, case.inputs, "torch.compile (inductor)",
                                dynamic=False),
        runtimes.onnxruntime(onnx_path, case.inputs),
        runtimes.braze_onnx(onnx_path, case.inputs),
        *(runtimes.braze_onnx(onnx_path, case.inputs, t) for t in runtimes.cpu_targets(cpus)),
    ], only)


def run_case(case: Case, module, warmup: int, rounds: int, workdir: Path, cpus=(),
             only=()) -> dict:
    """Build the ONNX file, then set up and time every runtime on one case."""
    import torch

    torch._dynamo.reset()
    onnx_path = case.make_onnx(module, case.inputs, workdir / f"{case.name}.onnx")
    # Calls here take microseconds to a few milliseconds: wake the pools before a sample.
    settings = Settings(warmup=warmup, rounds=rounds, number=case.number, lead_in=1)
    result = common.measure(case.name, case_runtimes(module, case, onnx_path, cpus, only),
                            settings, unit=case.unit)
    result["description"] = case.description
    return result


# -- report ---------------------------------------------------------------------------


EAGER, INDUCTOR, ORT, BRAZE = ("torch eager", "torch.compile (inductor)", "onnxruntime",
                               "braze (compile_onnx)")


def time_cell(case: dict, runtime: str) -> str:
    """A runtime's median in the case's unit, or 'n/a'."""
    r = common.result_for(case, runtime)
    if r is None or r["status"] != "ok":
        return "n/a"
    return fmt(r["median_ms"], common.UNIT_SCALE[case["unit"]])


def ratio_cell(case: dict, num: str, den: str) -> str:
    """median(num) / median(den), or '-' when either is n/a."""
    value = common.ratio(case, num, den)
    return "-" if value is None else f"{value:.2f}"


def report(payload: dict) -> str:
    """The table of medians and ratios, then why any runtime was n/a."""
    others = list(dict.fromkeys(r["runtime"] for c in payload["cases"] for r in c["results"]
                                if r["runtime"].startswith(BRAZE[:-1] + ", ")))
    headers = ["case", "unit", "torch eager", "inductor", "onnxruntime", "braze",
               *(o[len(BRAZE) + 1:-1] for o in others),  # braze built for another CPU
               "braze/ORT", "braze/eager", "braze max rel err"]
    rows = []
    for c in payload["cases"]:
        braze = common.result_for(c, BRAZE) or {}
        rows.append([f"{c['case']}: {c['description']}", c["unit"],
                     *(time_cell(c, rt) for rt in (EAGER, INDUCTOR, ORT, BRAZE, *others)),
                     ratio_cell(c, BRAZE, ORT), ratio_cell(c, BRAZE, EAGER),
                     fmt_err(braze.get("max_rel_err"))])
    return common.markdown_table(headers, rows) + failures(payload)


def failures(payload: dict) -> str:
    """'case, runtime: reason' lines for every n/a cell, or ''."""
    lines = [f"- {c['case']}, {r['runtime']}: {r['reason']}"
             for c in payload["cases"] for r in c["results"] if r["status"] != "ok"]
    return "\n\nn/a:\n" + "\n".join(lines) if lines else ""


def results_section(payload: dict, note: str | None = None) -> str:
    """The fusion section of RESULTS.md: machine, settings, table."""
    s = payload["settings"]
    lines = [f"Machine: {common.machine_line(payload['machine'])}.",
             f"Settings: {s['threads']} threads, {s['warmup']} warm-up sample(s), "
             f"{s['rounds']} interleaved rounds; medians."]
    if note:
        lines.append(f"Note: {note}")
    return "\n".join(lines) + "\n\n" + report(payload)


def parse_args(argv):
    """The command line; --quick overrides warm-up and rounds."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.fusion", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help="untimed samples each")
    p.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="timed rounds")
    p.add_argument("--case", nargs="+", help="run only these cases")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 warm-up, 3 rounds")
    p.add_argument("--out", type=Path, default=OUT_DIR, help="folder for the JSON")
    p.add_argument("--update-results", action="store_true",
                   help="rewrite the fusion section of benchmarks/RESULTS.md")
    p.add_argument("--note", help="a sentence to print under the machine in RESULTS.md")
    common.add_target_args(p)
    args = p.parse_args(argv)
    if args.quick:
        args.warmup, args.rounds = QUICK["warmup"], QUICK["rounds"]
    return args


def main(argv=None) -> dict:
    """Run the chosen cases, print the table, write JSON; returns the payload."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    faulthandler.enable()
    common.configure_threads()
    modules = torch_modules()
    chosen = [c for c in cases() if not args.case or c.name in args.case]
    with tempfile.TemporaryDirectory(prefix="braze-fusion-") as tmp, \
            common.fresh_compile_caches(Path(tmp)):
        results = [run_case(c, modules[c.name], args.warmup, args.rounds, Path(tmp), args.cpu,
                            args.only) for c in chosen]
    payload = {"benchmark": "fusion", "machine": common.machine_info(),
               "settings": {"threads": common.THREADS, "warmup": args.warmup,
                            "rounds": args.rounds},
               "cases": results}
    print(report(payload))
    path = common.write_json(payload, args.out / "fusion.json")
    common.progress(f"wrote {path}")
    if args.update_results:
        common.replace_section(RESULTS_MD, "fusion", results_section(payload, args.note))
        common.progress(f"updated {RESULTS_MD}")
    return payload


if __name__ == "__main__":
    main()
