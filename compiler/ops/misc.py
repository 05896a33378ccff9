"""`const` (a tensor literal) and `host` (an opaque framework op).

A host node carries what the host framework needs to run the op: `framework`
("onnx" or "torch"), the op's `domain` and `op_type`, an opaque serialized
`payload` (for ONNX: a NodeProto plus opset imports, see importers.onnx) and the
`reason` braze did not translate it. Its output types are whatever the
importer determined; the IR cannot infer them.
"""

from __future__ import annotations

import numpy as np

from compiler import dtypes
from compiler.ir import IRError, TensorType
from compiler.ops import REQUIRED, Family, OpDef, register


def _const_check(node):
    v = node.attrs["value"]
    if not isinstance(v, np.ndarray):
        raise IRError(f"{node.describe()}: value must be a numpy array")


def _const_infer(node):
    v = node.attrs["value"]
    return [TensorType(dtypes.from_numpy(v.dtype), v.shape)]


register(OpDef("const", Family.CONST, (0, 0), _const_infer,
               lambda node: [node.attrs["value"]],
               attrs={"value": ("array", REQUIRED)}, check_fn=_const_check))


def _host_infer(node):
    if not node.outputs:
        raise IRError(f"{node.describe()}: host nodes need explicit output types")
    return [o.type for o in node.outputs]


register(OpDef("host", Family.HOST, (0, None), _host_infer, None,
               attrs={"framework": ("str", REQUIRED), "domain": ("str", ""),
                      "op_type": ("str", REQUIRED), "payload": ("bytes", b""),
                      "reason": ("str", "")}))
