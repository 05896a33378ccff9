"""Checks of one ONNX node before it converts: what onnxruntime refuses, braze refuses.

Each check raises InvalidModelError naming the node: the ONNX checker's node rules
(attributes known and of the right type, required ones present, input and output
counts); 0/1 flags holding 0 or 1; the schema's type constraints on the input types
(and the one type of an input the schema fixes, such as an axes input's int64);
the window attributes of convolutions and pools (kernel_shape, strides, dilations
positive; a pool's kernel_shape present and of the input's spatial rank, and its pads
each smaller than the kernel; a conv's
weight of the input's rank and channels; no window larger than its padded input);
and integer Div / Mod by a constant divisor holding a zero. onnxruntime refuses each
of these; braze's kernels would otherwise run them and answer garbage (MaxPool with
kernel_shape [0, 0] gave all -inf, integer Div by a constant 0 gave x).
"""

from __future__ import annotations

import onnx
import onnx.checker
from onnx import NodeProto, TypeProto

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
# pools whose pads must each be smaller than the kernel (onnxruntime's PoolAttributes)
POOLS = frozenset({"MaxPool", "AveragePool", "LpPool"})
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
        """The schema's type constraints on the input types: each input's type allowed,
        and one type per constraint (what onnxruntime checks when it loads the model)."""
        bound: dict[str, str] = {}
        formals = list(schema.inputs)
        allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
        for i, name in enumerate(node.input):
            if not name or not formals:
                continue
            formal = formals[min(i, len(formals) - 1)]
            tp = in_types.get(name)
            if tp is None or tp.WhichOneof("value") != "tensor_type" or \
                    not tp.tensor_type.elem_type:
                continue
            text = f"tensor({_elem_name(tp.tensor_type.elem_type)})"
            param = formal.type_str
            heterogeneous = formal.option == formal.option.Variadic and \
                not formal.is_homogeneous
            if param in allowed and text not in allowed[param] or \
                    param not in allowed and param.startswith("tensor(") and text != param:
                # (a formal of one fixed type, such as Unsqueeze's and ReduceSum's axes,
                # tensor(int64), names it instead of a type parameter)
                raise InvalidModelError(f"{desc}: input {i} ({name!r}) is {text}, which "
                                        f"{node.op_type} does not take there")
            if param in allowed and not heterogeneous and \
                    bound.setdefault(param, text) != text:
                raise InvalidModelError(f"{desc}: input {i} ({name!r}) is {text}, but an "
                                        f"earlier input of the same type is {bound[param]}")


def _elem_name(elem: int) -> str:
    return {onnx.TensorProto.FLOAT: "float", onnx.TensorProto.DOUBLE: "double",
            onnx.TensorProto.FLOAT16: "float16", onnx.TensorProto.BFLOAT16: "bfloat16",
            onnx.TensorProto.BOOL: "bool", onnx.TensorProto.STRING: "string"}.get(
        elem, onnx.TensorProto.DataType.Name(elem).lower())


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
    x = _dims(in_types.get(node.input[0]) if node.input else None)
    for name, values in attrs.items():
        if x is not None and len(x) >= 2 and len(values) != len(x) - 2:
            raise InvalidModelError(f"{desc}: {name} {values} has {len(values)} entries; "
                                    f"the input has {len(x) - 2} spatial dims")
    pads = next((list(a.ints) for a in node.attribute if a.name == "pads"), None)
    kernel = attrs.get("kernel_shape")
    if node.op_type in POOLS and pads and kernel and len(pads) == 2 * len(kernel) and any(
            p >= kernel[i % len(kernel)] for i, p in enumerate(pads)):
        # onnxruntime: "Pad should be smaller than kernel" (a window wholly in the pads
        # would pool nothing)
        raise InvalidModelError(f"{desc}: pads {pads} must each be smaller than the kernel "
                                f"{kernel}")
    if x is not None and (node.op_type == "Conv" or node.op_type in POOLS):
        w = _dims(in_types.get(node.input[1])) if node.op_type == "Conv" and \
            len(node.input) > 1 else None
        _window_fits(node, desc, x, attrs, w)


def _window_fits(node: NodeProto, desc: str, x: list, attrs: dict, w: list | None) -> None:
    """A conv's channels match its weight's times group; no window is larger than its
    padded input (onnxruntime: "Calculated output dimension is negative")."""
    ints = {a.name: (list(a.ints) if a.ints else a.i) for a in node.attribute}
    if w is not None and len(w) != len(x):
        raise InvalidModelError(f"{desc}: the weight has rank {len(w)}; the input has rank "
                                f"{len(x)}")
    if w is not None:
        group = ints.get("group", 1) or 1
        if x[1] is not None and w[1] is not None and x[1] != w[1] * group:
            raise InvalidModelError(f"{desc}: the input has {x[1]} channels; the weight "
                                    f"takes {w[1]} x group {group}")
        if w[0] is not None and w[0] % group:
            raise InvalidModelError(f"{desc}: {w[0]} output channels are not a multiple "
                                    f"of group {group}")
        attrs = {"kernel_shape": w[2:], **attrs}
    auto = ints.get("auto_pad", b"NOTSET")
    if (auto.decode() if isinstance(auto, bytes) else auto) not in ("NOTSET", "VALID"):
        return
    spatial = len(x) - 2
    kernel = attrs.get("kernel_shape")
    pads = ints.get("pads") or [0] * (2 * spatial)
    dil = attrs.get("dilations") or [1] * spatial
    if kernel is None or len(pads) != 2 * spatial or len(dil) != spatial:
        return
    for d in range(spatial):
        size, k = x[2 + d], kernel[d]
        if size is None or k is None:
            continue
        if size + pads[d] + pads[d + spatial] < (k - 1) * dil[d] + 1:
            raise InvalidModelError(f"{desc}: window {kernel} (dilations {dil}) is larger "
                                    f"than the padded input {x[2:]}")


def _constant_divisor(node: NodeProto, desc: str, const_of) -> None:
    if node.op_type not in INT_DIVIDES or len(node.input) < 2:
        return
    divisor = const_of(node.input[1])
    if divisor is not None and divisor.dtype.kind in "iub" and not divisor.all():
        raise InvalidModelError(f"{desc}: integer {node.op_type} by a constant divisor "
                                f"holding 0 (integer division by zero)")


def _dims(tp: TypeProto | None) -> list | None:
    """A tensor type's dims (None for unknown ones), or None for an unknown rank."""
    if tp is None or tp.WhichOneof("value") != "tensor_type" or \
            not tp.tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else None
            for d in tp.tensor_type.shape.dim]


def _first_line(e) -> str:
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__
