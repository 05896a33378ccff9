"""Host nodes: ONNX nodes braze leaves to onnxruntime.

The payload follows docs/CONTRACTS.md: a serialized FunctionProto holding the
one original NodeProto (subgraphs included), the model's opset imports, inputs
= the ONNX names of the IR node's inputs (the node's own non-empty inputs, then
outer-scope names its subgraphs capture) and outputs = the node's non-empty
outputs. Its `value_info` carries the ONNX types of those inputs and outputs
where known, so a runner can rebuild a one-node model without guessing.

Output types come from ONNX shape inference run on this one node with the
exact (bound) input types and constant inputs; where that cannot say (subgraph
ops reading outer names, contrib ops), from inference over the whole model with
the bound input shapes; dims that stay unknown are None (data-dependent).
"""

from __future__ import annotations

import onnx
import onnx.defs
from onnx import (AttributeProto, FunctionProto, GraphProto, NodeProto, TypeProto, helper,
                  shape_inference)

from importers.onnx_load import DEFAULT_DOMAINS

HOST_FUNCTION_DOMAIN = "braze.host"

# Initializers up to this many elements keep their data in the model given to
# whole-model shape inference (shape constants matter to data propagation);
# bigger ones are declared by type only, which keeps that model small.
INFERENCE_DATA_LIMIT = 1024


def subgraphs(node: NodeProto) -> list[GraphProto]:
    """The graphs held by the node's attributes (If branches, Loop/Scan bodies): those of
    GRAPH or GRAPHS type, or of none (the oldest models name no type; a graph in an
    attribute of another type is malformed, which the ONNX checker refuses:
    onnx_validate.py)."""
    out = []
    for attr in node.attribute:
        if attr.HasField("g") and attr.type in (AttributeProto.GRAPH, AttributeProto.UNDEFINED):
            out.append(attr.g)
        if attr.type in (AttributeProto.GRAPHS, AttributeProto.UNDEFINED):
            out.extend(attr.graphs)
    return out


def captured_names(node: NodeProto) -> list[str]:
    """Outer-scope names read inside the node's subgraphs, in first-use order."""
    names: list[str] = []
    for g in subgraphs(node):
        for name in _free_names(g):
            if name not in names:
                names.append(name)
    return names


def _free_names(g: GraphProto) -> list[str]:
    defined = {v.name for v in g.input} | {t.name for t in g.initializer}
    defined |= {t.values.name for t in g.sparse_initializer}
    free: list[str] = []
    for n in g.node:
        for name in list(n.input) + captured_names(n):
            if name and name not in defined and name not in free:
                free.append(name)
        defined.update(n.output)
    free.extend(o.name for o in g.output if o.name not in defined and o.name not in free)
    return free


def make_payload(node: NodeProto, inputs: list[str], outputs: list[str],
                 opset_import, types: dict[str, TypeProto]) -> bytes:
    """The serialized FunctionProto of a host node (see the module docstring)."""
    fn = FunctionProto(name=node.op_type or "host", domain=HOST_FUNCTION_DOMAIN)
    fn.input.extend(inputs)
    fn.output.extend(outputs)
    fn.node.append(node)
    fn.opset_import.extend(opset_import)
    for name in inputs + outputs:
        if name in types:
            fn.value_info.append(helper.make_value_info(name, types[name]))
    return fn.SerializeToString()


def onnx_schema(node: NodeProto, opsets: dict[str, int]):
    """The ONNX schema of the node at the model's opset, or None (contrib ops, unknown)."""
    domain = "" if node.domain in DEFAULT_DOMAINS else node.domain
    if domain not in opsets:
        return None
    try:
        return onnx.defs.get_schema(node.op_type, opsets[domain], domain)
    except onnx.defs.SchemaError:
        return None


class HostTyper:
    """Output TypeProtos of host nodes: per-node inference, whole-model inference as backup."""

    def __init__(self, model: onnx.ModelProto, opsets: dict[str, int],
                 bound_inputs: dict[str, TypeProto]):
        self.model = model
        self.opsets = opsets
        self.bound_inputs = bound_inputs
        self._global: dict[str, TypeProto] | None = None

    def infer(self, node: NodeProto, in_types: dict[str, TypeProto],
              in_data: dict) -> tuple[dict[str, TypeProto], str]:
        """(output name -> TypeProto where known, the per-node inference error or "")."""
        found, error = self._infer_node(node, in_types, in_data)
        for name in node.output:
            if name and not _complete(found.get(name)):
                better = self._whole_model().get(name)
                if better is not None and _more_known(better, found.get(name)):
                    found[name] = better
        return found, error

    def _infer_node(self, node, in_types, in_data):
        schema = onnx_schema(node, self.opsets)
        if schema is None:
            return {}, ""
        try:
            out = shape_inference.infer_node_outputs(
                schema, node, in_types, in_data,
                opset_imports=list(self.model.opset_import),
                ir_version=max(self.model.ir_version, 8))
        except Exception as e:  # onnx raises InferenceError and assorted RuntimeErrors
            return {}, str(e).strip()
        return dict(out), ""

    def _whole_model(self) -> dict[str, TypeProto]:
        if self._global is None:
            self._global = whole_model_types(self.model, self.bound_inputs)
        return self._global


def whole_model_types(model: onnx.ModelProto, bound_inputs: dict[str, TypeProto]):
    """Value name -> TypeProto from shape inference over a small skeleton of the model."""
    g = GraphProto(name=model.graph.name)
    g.node.extend(model.graph.node)
    for name, tp in bound_inputs.items():
        g.input.append(helper.make_value_info(name, tp))
    for t in model.graph.initializer:
        if _numel(t.dims) <= INFERENCE_DATA_LIMIT:
            g.initializer.append(t)
        else:
            tp = helper.make_tensor_type_proto(t.data_type, list(t.dims))
            g.input.append(helper.make_value_info(t.name, tp))
    g.output.extend(model.graph.output)
    skeleton = helper.make_model(g, opset_imports=list(model.opset_import),
                                 ir_version=max(model.ir_version, 8))
    skeleton.functions.extend(model.functions)
    try:
        inferred = shape_inference.infer_shapes(skeleton, check_type=False, strict_mode=False,
                                                data_prop=True)
    except Exception:  # inference is best effort here: unknown stays unknown
        return {}
    values = list(inferred.graph.value_info) + list(inferred.graph.output)
    return {v.name: v.type for v in values if v.type.WhichOneof("value")}


def _numel(dims) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def _known_dims(tp: TypeProto | None) -> int:
    """How much a TypeProto says: -1 nothing, else 1 + the number of known dims."""
    if tp is None or not tp.WhichOneof("value"):
        return -1
    if tp.WhichOneof("value") != "tensor_type":
        return 1
    tt = tp.tensor_type
    if not tt.elem_type:
        return -1
    if not tt.HasField("shape"):
        return 0
    return 1 + sum(1 for d in tt.shape.dim if d.HasField("dim_value"))


def _complete(tp: TypeProto | None) -> bool:
    if tp is None or tp.WhichOneof("value") != "tensor_type":
        return tp is not None and bool(tp.WhichOneof("value"))
    tt = tp.tensor_type
    return bool(tt.elem_type) and tt.HasField("shape") and all(
        d.HasField("dim_value") for d in tt.shape.dim)


def _more_known(a: TypeProto, b: TypeProto | None) -> bool:
    return _known_dims(a) > _known_dims(b)
