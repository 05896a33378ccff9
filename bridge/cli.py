"""The `braze` command line: optimize, explain, compile, run and bench ONNX models.

Every command turns a braze error into one clear line on stderr and exit
status 1 (2 for bad usage, as argparse does); `--debug` shows the traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback

from compiler.errors import BrazeError


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")


def _add_shapes(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shape", action="append", default=[], metavar="NAME=D1,D2,...",
                   help="concrete shape for an input with symbolic dimensions (repeatable)")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="braze",
        description="braze: a graph compiler for ONNX and PyTorch models.")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("optimize", help="apply braze's graph passes, write a standard ONNX model",
                       description="Fold constants and shape chains, remove dead code and "
                       "no-ops, fold BatchNormalization into Conv/Gemm, and write the result "
                       "as a standard ONNX model that stock onnxruntime loads. The result is "
                       "checked against onnxruntime on random inputs.")
    p.add_argument("input", help="the ONNX model to optimize")
    p.add_argument("-o", "--output", required=True, help="where to write the optimized model")
    p.add_argument("--no-check", action="store_true",
                   help="skip the numeric check against onnxruntime")
    p.add_argument("--rtol", type=float, default=1e-4,
                   help="largest accepted max-relative difference (default 1e-4)")
    _add_shapes(p)
    _add_common(p)

    p = sub.add_parser("explain", help="show clusters and why nodes are not compiled",
                       description="Import the model, run braze's passes and clustering, and "
                       "print the clusters and, for every node braze does not compile, why.")
    p.add_argument("input", help="an ONNX model")
    p.add_argument("--target", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("-v", "--kernels", action="store_true",
                   help="also print each compiled cluster's fusion plan: every kernel, its "
                   "ops, its implementation (GEMM, Winograd, direct conv, ...) and why")
    _add_shapes(p)
    _add_common(p)

    p = sub.add_parser("compile", help="compile an ONNX model into a .braze artifact "
                       "(or PTX for CUDA)",
                       description="Compile the model for this machine's CPU at its static "
                       "input shapes (or those given with --shape) and write one file "
                       "that `braze run` and bridge.load() run without recompiling. The "
                       "artifact only loads with this braze version on this CPU. With "
                       "--target cuda --emit ptx, write one .ptx file per compiled "
                       "cluster into the output directory instead (no GPU needed). With "
                       "--emit c, write a C header and library (NAME.h, libNAME.a, "
                       "libNAME.so, README.txt) that run the model with no Python.")
    p.add_argument("input", help="the ONNX model to compile")
    p.add_argument("-o", "--output", required=True,
                   help="where to write the .braze artifact (--emit ptx or c: a directory)")
    p.add_argument("--target", default="cpu", choices=["cpu", "cuda"],
                   help="what to compile for (default cpu)")
    p.add_argument("--emit", choices=["artifact", "ptx", "c"], default=None,
                   help="what to write: a .braze artifact (cpu, the default there), PTX "
                   "(cuda, the default there) or a C library (cpu)")
    p.add_argument("--name", default=None,
                   help="--emit c: the library's name (NAME.h, NAME_run; default the "
                   "model's graph name)")
    p.add_argument("--arch", default=None, metavar="SM",
                   help="CUDA architecture of the PTX, e.g. sm_80 (default) or sm_90")
    p.add_argument("--no-fallback", action="store_true",
                   help="fail instead of leaving any node to onnxruntime")
    p.add_argument("--threads", type=int, default=None,
                   help="threads the artifact runs with (default 2; --emit c: default 1, "
                   "which needs no libgomp)")
    p.add_argument("--cpu", default=None, metavar="NAME[,+F,-F]",
                   help="compile for this LLVM CPU (e.g. znver3, haswell, x86-64-v2, "
                   "neoverse-n1), features turned on or off after it; default: this machine")
    p.add_argument("--triple", default=None,
                   help="LLVM target triple (default: this machine's, or the one that knows "
                   "--cpu, e.g. aarch64-unknown-linux-gnu for neoverse-n1)")
    p.add_argument("--dynamic", default=None, metavar="DIM",
                   help="compile every power-of-two bucket of the symbolic input dim DIM "
                   "(e.g. seq) up to its --shape size: the artifact serves every length "
                   "from 1 to that size, inputs padded")
    _add_shapes(p)
    _add_common(p)

    p = sub.add_parser("run", help="run a model (ONNX or a .braze artifact) on .npy inputs",
                       description="Run a model and print each output's name, shape, dtype "
                       "and a short summary. Inputs come from .npy files. An ONNX model is "
                       "compiled first; a .braze artifact (`braze compile`) runs as saved.")
    p.add_argument("input", help="an ONNX model or a compiled .braze artifact")
    p.add_argument("--input", dest="inputs", action="append", default=[],
                   metavar="NAME=FILE.npy", help="an input value (repeatable)")
    p.add_argument("--random", action="store_true",
                   help="fill inputs not given with seeded random data")
    p.add_argument("--output-dir", help="save each output as NAME.npy in this directory")
    p.add_argument("--no-fallback", action="store_true",
                   help="fail instead of running any node on onnxruntime")
    p.add_argument("--threads", type=int, default=None,
                   help="threads (default 2; for an artifact, the threads it was compiled for)")
    _add_common(p)

    p = sub.add_parser("bench", help="time braze against onnxruntime (and OpenVINO) on a model",
                       description="Compile the model with braze and time it against "
                       "onnxruntime (and OpenVINO when installed) in this process, with the "
                       "same threads, on seeded random inputs: interleaved rounds after a "
                       "warm-up, median and interquartile range per call. Prints a table and "
                       "whether braze is faster than the fastest other runtime.")
    p.add_argument("input", help="the ONNX model")
    p.add_argument("--threads", type=int, default=2, help="threads for every runtime (default 2)")
    p.add_argument("--rounds", type=int, default=20, help="timed rounds at most (default 20)")
    p.add_argument("--budget", type=float, default=30.0,
                   help="seconds of timed rounds at most (default 30)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls each (default 3)")
    _add_shapes(p)
    _add_common(p)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="braze: %(levelname)s: %(message)s")
    from bridge import cli_commands

    handler = getattr(cli_commands, f"cmd_{args.command}")
    try:
        return handler(args) or 0
    except BrazeError as e:
        if args.debug:
            traceback.print_exc()
        print(f"braze {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("braze: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug in braze: say so plainly, keep the trace behind --debug
        if args.debug:
            traceback.print_exc()
        print(f"braze {args.command}: internal error: {type(e).__name__}: {e} "
              f"(rerun with --debug for the traceback)", file=sys.stderr)
        return 3


def parse_shapes(items: list[str]) -> dict[str, tuple[int, ...]]:
    """'name=1,3,224,224' items -> {name: shape}; BrazeError on bad syntax."""
    shapes = {}
    for item in items:
        name, sep, dims = item.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = tuple(int(d) for d in dims.split(",") if d.strip() != "")
        except ValueError:
            raise BrazeError(f"bad --shape {item!r}: expected NAME=D1,D2,...") from None
    return shapes


if __name__ == "__main__":
    sys.exit(main())
