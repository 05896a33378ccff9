"""The per-call cost of the frozen-weights check: `python -m benchmarks.frozen_check`.

ResNet-50 at batch 1 through torch.compile(backend="braze") with freezing on (the
default), in one process: the check alone (bridge/frozen.py: storage and version
counters, then the sampled fingerprint), timed over many calls on the graph's real
arguments, and whole calls with the fingerprint on and off (Fingerprint.same patched
to answer True: what the check was before it), in interleaved rounds.
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks import common
from benchmarks.resnet50 import build_model, make_input


def _captured_runner(compiled, x):
    """The GraphRunner behind `compiled` and the arguments of its latest call."""
    from bridge.torch_backend import GraphRunner

    seen = {}
    check = GraphRunner._check_frozen

    def spy(self, args):
        seen["runner"], seen["args"] = self, args
        return check(self, args)

    GraphRunner._check_frozen = spy
    try:
        compiled(x)
    finally:
        GraphRunner._check_frozen = check
    return seen["runner"], seen["args"]


def _us_per_call(fn, number: int) -> float:
    return common.time_call(fn, number) * 1e3


def check_alone(runner, args, number: int) -> dict:
    """Microseconds per call of the whole check and of its fingerprint part."""
    from bridge import frozen

    fw = runner._frozen
    weights = [args[i] for i in fw.indices]
    return {"weights": len(weights),
            "check_us": _us_per_call(lambda: fw.changed(args), number),
            "state_us": _us_per_call(lambda: frozen._state(weights), number),
            "fingerprint_us": _us_per_call(fw._fingerprint.same, number)}


def whole_calls(compiled, x, rounds: int, calls: int) -> dict:
    """Median ms per call with the fingerprint on and off, rounds interleaved."""
    from bridge.frozen import Fingerprint

    same = Fingerprint.same
    times: dict = {"on": [], "off": []}
    for r in range(rounds):
        for mode in (("on", "off") if r % 2 == 0 else ("off", "on")):
            Fingerprint.same = same if mode == "on" else (lambda self: True)
            try:
                compiled(x)  # lead-in
                times[mode].append(common.time_call(lambda: compiled(x), calls))
            finally:
                Fingerprint.same = same
    return {m: statistics.median(v) for m, v in times.items()}


def main(argv=None) -> dict:
    import torch

    p = argparse.ArgumentParser(prog="python -m benchmarks.frozen_check", description=__doc__)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--calls", type=int, default=10, help="calls per timed round")
    p.add_argument("--number", type=int, default=2000, help="repetitions of the check alone")
    a = p.parse_args(argv)
    common.configure_threads()
    model = build_model()
    x = torch.from_numpy(make_input(1))
    compiled = torch.compile(model, backend="braze")
    with torch.no_grad():
        t0 = time.perf_counter()
        compiled(x)
        common.progress(f"compiled in {time.perf_counter() - t0:.1f} s")
        runner, args = _captured_runner(compiled, x)
        alone = check_alone(runner, args, a.number)
        calls = whole_calls(compiled, x, a.rounds, a.calls)
    out = {**alone, "call_ms_with": calls["on"], "call_ms_without": calls["off"]}
    print(f"ResNet-50 batch 1, {alone['weights']} frozen tensors, "
          f"{common.machine_line(common.machine_info())}")
    print(f"check alone: {alone['check_us']:.1f} us per call (storage and versions "
          f"{alone['state_us']:.1f} us, fingerprint {alone['fingerprint_us']:.1f} us): "
          f"{alone['check_us'] / (calls['on'] * 1e3) * 100:.2f}% of a call")
    print(f"whole call, median of {a.rounds} interleaved rounds of {a.calls}: "
          f"{calls['on']:.2f} ms with the fingerprint, {calls['off']:.2f} ms without")
    return out


if __name__ == "__main__":
    main()
