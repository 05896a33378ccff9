"""An IR graph run by each host the runtime falls back to: onnxruntime (through the
graph's ONNX export, runtime/fallback_onnx.py) and eager torch (runtime/fallback_torch.py),
for tests that compare both with a reference."""

from __future__ import annotations

import numpy as np
import pytest


def host_results(g, arrays) -> tuple[np.ndarray, np.ndarray]:
    """(onnxruntime's first output, torch's first output) for `g` on numpy `arrays`."""
    ort = pytest.importorskip("onnxruntime")
    torch = pytest.importorskip("torch")
    from runtime.fallback_onnx import export_onnx
    from runtime.fallback_torch import TorchHostStep

    sess = ort.InferenceSession(export_onnx(g).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    on_ort, = sess.run(None, {v.name: a for v, a in zip(g.inputs, arrays)})
    on_torch, = TorchHostStep(g, {})([torch.from_numpy(a) for a in arrays])
    return on_ort, on_torch.numpy()
