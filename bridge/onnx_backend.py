"""braze as an `onnx.backend`: the module-level API of onnxruntime.backend.

    import bridge.onnx_backend as backend
    rep = backend.prepare(model, device="CPU", allow_fallback=True)
    outputs = rep.run([x])

so that `onnx.backend.test.BackendTest(bridge.onnx_backend, __name__)` runs
ONNX's own test suite through braze. Options are compile_onnx's.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep

from bridge.onnx_api import CompiledOnnxModel

DEVICES = ("CPU",)


class BrazeRep(BackendRep):
    """A prepared model: `run(inputs)` with a list (model input order) or a dict."""

    def __init__(self, compiled: CompiledOnnxModel):
        self.compiled = compiled

    def run(self, inputs, **kwargs):
        if isinstance(inputs, dict):
            return self.compiled(**inputs)
        if isinstance(inputs, np.ndarray):
            inputs = [inputs]
        return self.compiled(*inputs)


class BrazeBackend(Backend):
    @classmethod
    def is_compatible(cls, model, device: str = "CPU", **kwargs) -> bool:
        return cls.supports_device(device)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper().split(":")[0] in DEVICES

    @classmethod
    def prepare(cls, model, device: str = "CPU", **options) -> BrazeRep:
        if not cls.supports_device(device):
            raise RuntimeError(f"braze's ONNX backend runs on {', '.join(DEVICES)}, "
                               f"not {device}")
        return BrazeRep(CompiledOnnxModel(model, "cpu", **options))

    @classmethod
    def run_model(cls, model, inputs, device: str = "CPU", **options):
        return cls.prepare(model, device, **options).run(inputs)

    @classmethod
    def run_node(cls, node, inputs, device: str = "CPU", outputs_info=None, **kwargs):
        """Run one NodeProto on numpy inputs (types taken from the inputs)."""
        opset = kwargs.pop("opset_version", onnx.defs.onnx_opset_version())
        ins = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype),
                                             list(a.shape))
               for name, a in zip(node.input, inputs) if name]
        outs = [helper.make_empty_tensor_value_info(name) for name in node.output if name]
        graph = helper.make_graph([node], "run_node", ins, outs)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        feeds = [a for name, a in zip(node.input, inputs) if name]
        return cls.run_model(model, feeds, device, **kwargs)


prepare = BrazeBackend.prepare
run_model = BrazeBackend.run_model
run_node = BrazeBackend.run_node
supports_device = BrazeBackend.supports_device
is_compatible = BrazeBackend.is_compatible
