"""onnxruntime's errors as braze's one-line messages: which node, and why.

onnxruntime's text carries a status code, often a C++ source location and function
signature, and names the failing node in one of two forms; braze's message keeps the
node (op type and name) and the reason, on one line.
"""

from __future__ import annotations

import re

from compiler.ir import Node

_SHOWN_NODES = 3  # nodes named in an error that onnxruntime did not pin on one node
# "...while running CumSum node. Name:'cs' Status Message: ..." (a call), and
# "...of operator (CumSum) in node (cs)..." (a session's creation)
_ORT_NODE = re.compile(r"running (?P<op>\S+) node\. Name:'(?P<name>[^']*)'")
_ORT_GRAPH_NODE = re.compile(r"operator \((?P<op>[^)\s]+)\) in node \((?P<name>[^)]*)\)")
_ORT_STATUS = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ")
# a C++ source location and function signature ahead of the reason, and the failed check
_ORT_SOURCE = re.compile(r"^\S+\.(?:h|cc|cpp|hpp):\d+ [^(]*\([^)]*\)(?: const)? ")
_ORT_CHECK = re.compile(r"^.*? was false\. ")


def where(e: Exception, nodes: list[Node]) -> str:
    """The node onnxruntime names in `e`; else the one host node among `nodes` (the
    step's), else the first few of them."""
    found = _ORT_NODE.search(str(e)) or _ORT_GRAPH_NODE.search(str(e))
    if found:
        op_type, name = found.group("op"), found.group("name")
        return f'{op_type} node "{name}"' if name else f"{op_type} node"
    host = [n for n in nodes if n.op == "host"]
    nodes = host if len(host) == 1 else nodes
    more = len(nodes) - _SHOWN_NODES
    return ", ".join(n.describe() for n in nodes[:_SHOWN_NODES]) + (
        f" and {more} more" if more > 0 else "")


def ort_message(e: Exception) -> str:
    """onnxruntime's reason for `e` on one line, without its status code, C++ source
    location and node prefix (the caller names the node)."""
    text = _ORT_STATUS.sub("", str(e).strip())
    text = text.split("Status Message: ", 1)[-1]
    text = _ORT_CHECK.sub("", _ORT_SOURCE.sub("", text))
    return " ".join(text.split()) or type(e).__name__
