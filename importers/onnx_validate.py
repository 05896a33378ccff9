"""Checks of one ONNX node before it converts: what onnxruntime refuses, braze refuses.

Each check raises InvalidModelError naming the node: the ONNX checker's node rules
(attributes known and of the right type, required ones present, input and output
counts), 0/1 flags holding 0 or 1, the ONNX type constraints on its input types, the window attributes of
convolutions and pools (kernel_shape, strides, dilations positive; a pool's
kernel_shape present and of the input's spatial rank), and integer Div / Mod by a
constant divisor holding a zero (onnxruntime raises on each of these; braze's kernels
would otherwise run them and answer garbage).
"""

from __future__ import annotations

import onnx
import onnx.checker
from onnx import NodeProto, TypeProto, shape_inference

from compiler.errors import InvalidModelError
from importers.onnx_host import subgraphs

# attributes that size a window: every entry must be at least 1
WINDOW_ATTRS = ("kernel_shape", "strides", "dilations")
WINDOW_OPS = frozenset({"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "MaxPool",
                        "AveragePool", "LpPool", "MaxUnpool", "MaxRoiPool", "DeformConv"})
# ops whose kernel_shape the spec requires (the checker lets its absence through where
# the schema marks it optional; converters would then index None)
NEEDS_KERNEL = frozenset({"MaxPool", "AveragePool", "LpPool", "MaxUnpool"})
INT_DIVIDES = frozenset({"Div", "Mod"})
# 0/1 flags: runtimes disagree on other values (onnxruntime reads keepdims=-1 as 0)
FLAGS = frozenset({"keepdims", "transA", "transB", "ceil_mode", "count_include_pad",
                   "noop_with_empty_axes", "allowzero", "fmod", "select_last_index",
                   "storage_order", "exclusive", "reverse", "largest", "sorted"})


class NodeChecker:
    """The checks above for the nodes of one model (its opsets and IR version)."""

    def __init__(self, model: onnx.ModelProto):
        self.ctx = onnx.checker.C.CheckerContext()
        self.ctx.ir_version = max(model.ir_version, 3)
        self.ctx.opset_imports = {op.domain: op.version for op in model.opset_import}
        self.opset_imports = list(model.opset_import)
        self.ir_version = max(model.ir_version, 8)

    def check(self, node: NodeProto, desc: str, schema, in_types: dict[str, TypeProto],
              const_of) -> None:
        """Raise InvalidModelError if `node` is invalid. `schema` is its ONNX schema (None
        for ops only onnxruntime knows), `in_types` its inputs' ONNX types where known,
        `const_of(name)` an input's constant array or None."""
        if not subgraphs(node):  # a subgraph reads outer names the checker cannot see
            try:
                onnx.checker.check_node(node, self.ctx)
            except onnx.checker.ValidationError as e:
                raise InvalidModelError(f"{desc}: {_first_line(e)}") from None
        if schema is not None:
            self._types(node, desc, schema, in_types)
        if node.domain in ("", "ai.onnx"):
            _flags(node, desc)
            _window(node, desc, in_types)
            _constant_divisor(node, desc, const_of)

    def _types(self, node, desc, schema, in_types) -> None:
        """The schema's type constraints on the input types (ONNX inference checks them)."""
        known = {n: t for n, t in in_types.items() if t.WhichOneof("value")}
        names = [n for n in node.input if n]
        if not names or any(n not in known for n in names) or subgraphs(node):
            return
        try:
            shape_inference.infer_node_outputs(schema, node, known, {},
                                               opset_imports=self.opset_imports,
                                               ir_version=self.ir_version)
        except Exception as e:  # onnx raises InferenceError and assorted RuntimeErrors
            text = str(e)
            if "type" in text.lower() and ("bound to different types" in text
                                           or "Type Error" in text
                                           or "is not a valid type" in text):
                raise InvalidModelError(f"{desc}: {_first_line(text)}") from None


def _flags(node: NodeProto, desc: str) -> None:
    for a in node.attribute:
        if a.name in FLAGS and a.type == onnx.AttributeProto.INT and a.i not in (0, 1):
            raise InvalidModelError(f"{desc}: attribute {a.name} is {a.i}; it must be 0 or 1")


def _window(node: NodeProto, desc: str, in_types: dict[str, TypeProto]) -> None:
    if node.op_type not in WINDOW_OPS:
        return
    attrs = {a.name: list(a.ints) for a in node.attribute if a.name in WINDOW_ATTRS}
    for name, values in attrs.items():
        if any(v < 1 for v in values):
            raise InvalidModelError(f"{desc}: {name} {values} must hold positive sizes")
    if node.op_type in NEEDS_KERNEL and "kernel_shape" not in attrs:
        raise InvalidModelError(f"{desc}: the required attribute kernel_shape is missing")
    rank = _rank(in_types.get(node.input[0]) if node.input else None)
    for name, values in attrs.items():
        if rank is not None and rank >= 2 and len(values) != rank - 2:
            raise InvalidModelError(f"{desc}: {name} {values} has {len(values)} entries; "
                                    f"the input has {rank - 2} spatial dims")


def _constant_divisor(node: NodeProto, desc: str, const_of) -> None:
    if node.op_type not in INT_DIVIDES or len(node.input) < 2:
        return
    divisor = const_of(node.input[1])
    if divisor is not None and divisor.dtype.kind in "iub" and not divisor.all():
        raise InvalidModelError(f"{desc}: integer {node.op_type} by a constant divisor "
                                f"holding 0 (integer division by zero)")


def _rank(tp: TypeProto | None) -> int | None:
    if tp is None or tp.WhichOneof("value") != "tensor_type":
        return None
    return len(tp.tensor_type.shape.dim) if tp.tensor_type.HasField("shape") else None


def _first_line(e) -> str:
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__
