"""`braze optimize`: braze's graph passes on an ONNX model, written back as standard ONNX.

The model is imported at concrete input shapes, run through the pass pipeline
(constant and shape-chain folding, identities, CSE, batch norm folded into
Conv/Gemm weights, dead code) and exported with runtime.fallback_onnx's
exporter: default-domain ops only, ops braze does not convert kept as they were,
the model's input and output names kept.
"""

from __future__ import annotations

import onnx

from compiler.passes.pipeline import run_passes
from importers.onnx import import_onnx
from runtime.fallback_onnx import export_onnx


def optimize_model(model: onnx.ModelProto, shapes: dict) -> onnx.ModelProto:
    """The optimized model (shapes: concrete shape of every input)."""
    imported = import_onnx(model, input_shapes=shapes)
    run_passes(imported.graph)
    out = export_onnx(imported.graph, output_names=imported.output_names,
                      opset=imported.opset, name=model.graph.name or "braze")
    out.producer_name = "braze optimize"
    out.doc_string = model.doc_string
    out.metadata_props.extend(model.metadata_props)
    return out
