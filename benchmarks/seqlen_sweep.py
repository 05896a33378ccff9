"""A transformer encoder called with 20 sequence lengths: compiles and error against onnxruntime.

    python -m benchmarks.seqlen_sweep [--lengths 7 1 2 ...] [--layers 2] [--timing]

Two encoders (d 256, 8 heads, feed-forward 512, post-norm; one bidirectional, one
with a causal mask built from the length inside the graph) are exported to ONNX with
a symbolic sequence axis ("seq"). Each is compiled twice: with the default options
(dynamic="auto": the first length compiles exactly, buckets after the second) and with
dynamic="seq" (buckets from the first call). For each it prints the compiles, the
largest error over the lengths against onnxruntime, then saves an artifact, loads it
and checks it serves every length (a loaded model never compiles). Then the same
module through torch.compile(backend="braze"): compiles and error against eager. torch's
nn.TransformerEncoder is not used: its TorchScript ONNX export bakes the traced length
into its reshapes, so the exported model only runs at that length.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time

import numpy as np

# the first is the length of the first call; 1, bucket sizes and 512 are included
LENGTHS = [7, 1, 2, 3, 5, 8, 13, 16, 21, 32, 50, 64, 100, 128, 200, 256, 300, 384, 500, 512]
D_MODEL, HEADS, FEED_FORWARD = 256, 8, 512


def encoder(layers: int, causal: bool, d: int = D_MODEL, heads: int = HEADS,
            feed_forward: int = FEED_FORWARD):
    """`layers` post-norm encoder layers (self-attention written out: reshape with -1,
    softmax, optional causal mask from the traced length)."""
    import torch
    import torch.nn.functional as F

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.out = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
            self.ff1, self.ff2 = torch.nn.Linear(d, feed_forward), torch.nn.Linear(feed_forward, d)
            self.n1, self.n2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)

        def forward(self, x):
            b, n, _ = x.shape
            q, k, v = self.qkv(x).split(d, dim=-1)
            q, k, v = (t.reshape(b, -1, heads, d // heads).transpose(1, 2) for t in (q, k, v))
            s = q @ k.transpose(-1, -2) / math.sqrt(d // heads)
            if causal:
                i = torch.arange(n)
                s = s.masked_fill(i[None, :] > i[:, None], float("-inf"))
            a = (s.softmax(-1) @ v).transpose(1, 2).reshape(b, -1, d)
            x = self.n1(x + self.out(a))
            return self.n2(x + self.ff2(F.relu(self.ff1(x))))

    torch.manual_seed(0)
    return torch.nn.Sequential(*[Layer() for _ in range(layers)]).eval()


def export(module, path: str, d: int = D_MODEL) -> None:
    """ONNX with the sequence axis of x and y symbolic ("seq")."""
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (torch.randn(1, 7, d),), path, input_names=["x"],
                          output_names=["y"], dynamic_axes={"x": {1: "seq"}, "y": {1: "seq"}},
                          opset_version=17, dynamo=False)


def sweep(path: str, lengths: list, dynamic: str, rounds: int, tmp: str) -> dict:
    import onnxruntime as ort

    import bridge
    from bridge.artifact import load

    m = bridge.compile_onnx(path, dynamic=dynamic)
    sess = ort.InferenceSession(path)
    rng = np.random.default_rng(0)
    inputs = {n: rng.standard_normal((1, n, D_MODEL)).astype(np.float32) for n in lengths}
    refs = {n: sess.run(None, {"x": x})[0] for n, x in inputs.items()}
    t0 = time.perf_counter()
    err = max(float(np.abs(m(inputs[n])[0] - refs[n]).max()) for n in lengths)
    compile_s = time.perf_counter() - t0
    times = {n: _median_ms(lambda n=n: m(inputs[n]), rounds) for n in lengths} if rounds else {}
    ort_times = {n: _median_ms(lambda n=n: sess.run(None, {"x": inputs[n]}), rounds)
                 for n in lengths} if rounds else {}
    saved = os.path.join(tmp, f"{os.path.basename(path)}.{dynamic}.braze")
    m.save(saved)
    loaded = load(saved)
    loaded_err = max(float(np.abs(loaded(inputs[n])[0] - refs[n]).max()) for n in lengths)
    return {"compiles": m.compiles, "err": err, "first_pass_s": compile_s, "ms": times,
            "ort_ms": ort_times, "saved": len(loaded.saved_shapes), "loaded_err": loaded_err}


def torch_sweep(module, lengths: list) -> dict:
    """torch.compile(backend="braze") over the lengths: compiles (every GraphRunner's,
    over dynamo's graphs) and the largest error against eager."""
    import torch
    import torch._dynamo

    from bridge import torch_backend

    runners = []
    init = torch_backend.GraphRunner.__init__

    def counted(self, *a, **k):
        init(self, *a, **k)
        runners.append(self)

    torch._dynamo.reset()
    torch_backend.GraphRunner.__init__ = counted
    try:
        compiled = torch.compile(module, backend="braze")
        with torch.no_grad():
            xs = {n: torch.randn(1, n, D_MODEL) for n in lengths}
            err = max(float((compiled(xs[n]) - module(xs[n])).abs().max()) for n in lengths)
    finally:
        torch_backend.GraphRunner.__init__ = init
    return {"compiles": sum(r.compiles for r in runners), "graphs": len(runners), "err": err}


def _median_ms(fn, rounds: int) -> float:
    ts = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t) * 1e3)
    return float(np.median(ts))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=LENGTHS)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="timed calls per length")
    ap.add_argument("--timing", action="store_true",
                    help="also print ms per call against onnxruntime (median of --rounds)")
    args = ap.parse_args(argv)
    span = f"{len(args.lengths)} lengths {min(args.lengths)}..{max(args.lengths)}"
    with tempfile.TemporaryDirectory() as tmp:
        for causal in (False, True):
            name = "causal encoder" if causal else "encoder"
            module = encoder(args.layers, causal)
            path = os.path.join(tmp, f"{name.replace(' ', '_')}.onnx")
            export(module, path)
            for dynamic in ("auto", "seq"):
                r = sweep(path, args.lengths, dynamic, args.rounds if args.timing else 0, tmp)
                print(f"ONNX {name} dynamic={dynamic!r}: {span}, {r['compiles']} compiles "
                      f"({r['first_pass_s']:.1f} s first pass), max |err| vs onnxruntime "
                      f"{r['err']:.2e}; artifact: {r['saved']} specializations, loaded max "
                      f"|err| {r['loaded_err']:.2e}")
                if args.timing:
                    print("  ms per call (braze / onnxruntime): " + ", ".join(
                        f"{n}: {r['ms'][n]:.2f}/{r['ort_ms'][n]:.2f}" for n in args.lengths))
            t = torch_sweep(module, args.lengths)
            print(f"torch.compile {name}: {span}, {t['compiles']} compiles over "
                  f"{t['graphs']} dynamo graphs, max |err| vs eager {t['err']:.2e}")


if __name__ == "__main__":
    main()
