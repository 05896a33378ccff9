"""braze's options, one type for every front end, checked once when made.

`Options` holds what every front end honours (compile_onnx, onnx_backend.prepare,
the torch backend, the CLI, artifacts); `TorchOptions` extends it with what only
the torch backend has. Each front end names the targets it compiles for
(`TARGETS`); `check_target` is the one place a target string is read.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from compiler.errors import BrazeError

# Each thread is an OS thread (onnxruntime's pool, braze's kernels): a count beyond
# any machine's cores is a typo that would start that many threads.
MAX_THREADS = 256


def check_threads(threads) -> int:
    """`threads` if it is a whole number from 1 to MAX_THREADS, else a BrazeError."""
    if (isinstance(threads, bool) or not isinstance(threads, int)
            or not 1 <= threads <= MAX_THREADS):
        raise BrazeError(f"threads must be a positive integer up to {MAX_THREADS}, "
                         f"got {threads!r}")
    return threads


@dataclass(frozen=True)
class Options:
    """Options shared by compile_onnx, onnx_backend.prepare, the torch backend, the CLI
    and artifacts: `target` (a compiler.target spec: "cpu", "cpu:<LLVM CPU name>...",
    "cuda", of a kind in TARGETS), `allow_fallback` (False: a node braze
    cannot compile is a CompileError, not a host step), `threads` (for braze's kernels
    and onnxruntime's host steps), `dynamic` (ONNX inputs' symbolic dims: "auto" compiles the
    first two distinct values of a symbolic dim exactly, then buckets it: a power-of-two
    bucket per compile, padded inputs, sliced outputs, so that lengths 1..512 compile at
    most 10 times (bridge/dynamic.py); "off": every shape compiles exactly; a dim name,
    e.g. "seq": bucket that dim from the first call; the torch backend buckets the
    dynamic graphs dynamo hands it unless "off")."""

    TARGETS = ("cpu", "cuda")  # the target kinds (compiler.target.kind) it compiles for

    target: str = "cpu"
    allow_fallback: bool = True
    threads: int = 2
    dynamic: str = "auto"

    def __post_init__(self):
        check_threads(self.threads)
        self.check_target()
        if not isinstance(self.dynamic, str) or not self.dynamic:
            raise BrazeError(f"dynamic must be 'auto', 'off' or the name of a symbolic input "
                             f"dim, got {self.dynamic!r}")

    def check_target(self) -> None:
        """BrazeError (TargetError for a spec LLVM does not know) unless this front end
        compiles for `target`."""
        from compiler.target import kind, parse

        found = kind(self.target)  # TargetError for an unknown spelling
        if found not in self.TARGETS:
            raise BrazeError(f"unknown target {self.target!r}; braze compiles for "
                             f"{', '.join(self.TARGETS)}")
        if found == "cpu":
            parse(self.target)  # TargetError for an unknown CPU or feature

    @classmethod
    def from_dict(cls, options: dict | None, **given) -> Options:
        """Options from user keywords (`given`: what the front end takes as arguments,
        e.g. compile_onnx's target); an unknown name is a BrazeError listing the known."""
        options = dict(options or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise BrazeError(f"unknown braze option(s) {', '.join(unknown)}; "
                             f"known options: {', '.join(sorted(known - set(given)))}")
        return cls(**options, **given)

    def saved(self) -> dict:
        """What an artifact's manifest records (model.options)."""
        return {"allow_fallback": self.allow_fallback, "threads": self.threads}


@dataclass(frozen=True)
class TorchOptions(Options):
    """`options=` of torch.compile(backend="braze"): Options, plus `dump_dir` (IR text,
    clusters and LLVM IR of each graph written there), `freeze` (parameters and buffers
    of inference graphs become constants), `strict` (an error in braze raises instead
    of running the graph eagerly) and `fast_guards` (turn on dynamo's recursive
    dict-tag guards, process-wide: bridge/torch_backend.use_fast_guards). Here dynamo
    decides which dims are dynamic; an inference graph with one symbolic length runs in
    buckets (bridge/torch_dynamic.py) unless `dynamic` is "off"."""

    TARGETS = ("cpu",)

    dump_dir: str | None = None
    freeze: bool = True
    strict: bool = False
    fast_guards: bool = True
