"""The IR's text form: deterministic printing and a parser that reads it back.

    graph main(%x: f32[2,3], %b: f32[3]) -> (%y) {
      %t = add(%x, %b) : f32[2,3]
      %y = max(%t, %zero) : f32[2,3]
      %zero = ...
    }

`parse_graph(print_graph(g), constants(g)) == g`. Constants up to
INLINE_LIMIT elements print inline as `dense<f32[2]: [1.0, 2.0]>`; larger ones
print as `@name` and come from a side table (`constants(g)`), so golden tests
stay readable. Node names (the framework's) print as a trailing `loc("...")`.
"""

from __future__ import annotations

import base64
import json
import math
import re

import numpy as np

from compiler import dtypes
from compiler.ir import Graph, IRError, Node, TensorType, Value

INLINE_LIMIT = 16  # elements; larger constants go to the side table
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")


# -- printing -------------------------------------------------------------

def _name(v: Value, sigil: str = "%") -> str:
    return sigil + (v.name if _IDENT.match(v.name) else json.dumps(v.name))


def _float(x: float) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    r = repr(float(x))
    return r if any(c in r for c in ".e") else r + ".0"


def _scalar(x) -> str:
    if isinstance(x, (bool, np.bool_)):
        return "true" if x else "false"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    if isinstance(x, (float, np.floating)):
        return _float(float(x))
    if isinstance(x, str):
        return json.dumps(x)
    if isinstance(x, bytes):
        return 'b64"' + base64.b64encode(x).decode() + '"'
    raise IRError(f"cannot print attribute value {x!r}")


def _array(arr: np.ndarray) -> str:
    t = TensorType(dtypes.from_numpy(arr.dtype), arr.shape)
    flat = ", ".join(_scalar(x.item() if hasattr(x, "item") else x) for x in arr.reshape(-1))
    return f"dense<{t}: [{flat}]>"


def _attr(key: str, value, node: Node) -> str:
    if isinstance(value, np.ndarray):
        return _name(node.outputs[0], "@") if value.size > INLINE_LIMIT else _array(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(_scalar(x) for x in value) + "]"
    return _scalar(value)


def print_node(n: Node) -> str:
    outs = ", ".join(_name(v) for v in n.outputs)
    ins = ", ".join(_name(v) for v in n.inputs)
    s = f"{outs} = {n.op}({ins})"
    if n.attrs:
        s += " {" + ", ".join(f"{k}={_attr(k, n.attrs[k], n)}" for k in sorted(n.attrs)) + "}"
    s += " : " + ", ".join(str(v.type) for v in n.outputs)
    if n.name:
        s += f" loc({json.dumps(n.name)})"
    return s


def print_graph(g: Graph) -> str:
    params = ", ".join(f"{_name(v)}: {v.type}" for v in g.inputs)
    outs = ", ".join(_name(v) for v in g.outputs)
    lines = [f"graph {g.name}({params}) -> ({outs}) {{"]
    lines += ["  " + print_node(n) for n in g.nodes]
    lines.append("}")
    return "\n".join(lines) + "\n"


def constants(g: Graph) -> dict[str, np.ndarray]:
    """The side table of constants too large to print inline, by value name."""
    return {n.outputs[0].name: n.attrs["value"] for n in g.nodes
            if n.op == "const" and n.attrs["value"].size > INLINE_LIMIT}


def graphs_equal(a: Graph, b: Graph) -> bool:
    if print_graph(a) != print_graph(b):
        return False
    ca, cb = constants(a), constants(b)
    return ca.keys() == cb.keys() and all(
        ca[k].dtype == cb[k].dtype and np.array_equal(ca[k], cb[k], equal_nan=ca[k].dtype.kind
                                                      in "fc") for k in ca)


# -- parsing --------------------------------------------------------------

_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<b64>b64"[A-Za-z0-9+/=]*")
  | (?P<str>"(?:[^"\\]|\\.)*")
  | (?P<val>%(?:[A-Za-z_][A-Za-z0-9_.]*|"(?:[^"\\]|\\.)*"))
  | (?P<ref>@[A-Za-z_][A-Za-z0-9_.]*|@"(?:[^"\\]|\\.)*")
  | (?P<num>-?(?:inf\b|nan\b|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?))
  | (?P<arrow>->)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<punct>[(){}\[\],:=<>?])
""", re.VERBOSE)


class _Parser:
    def __init__(self, text: str, consts: dict):
        self.toks = []
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if not m:
                line = text.count("\n", 0, pos) + 1
                raise IRError(f"IR parse error at line {line}: unexpected {text[pos:pos + 20]!r}")
            if m.lastgroup != "ws":
                self.toks.append((m.lastgroup, m.group()))
            pos = m.end()
        self.i = 0
        self.consts = consts

    def peek(self):
        return self.toks[self.i] if self.i < len(self.toks) else ("eof", "")

    def next(self, want: str | None = None):
        kind, text = self.peek()
        if want is not None and text != want and kind != want:
            raise IRError(f"IR parse error: expected {want!r}, got {text!r}")
        self.i += 1
        return kind, text

    def accept(self, text: str) -> bool:
        if self.peek()[1] == text:
            self.i += 1
            return True
        return False

    def name(self, tok: str) -> str:
        body = tok[1:]
        return json.loads(body) if body.startswith('"') else body

    def type(self) -> TensorType:
        _, dt = self.next("ident")
        self.next("[")
        dims = []
        while not self.accept("]"):
            if self.accept("?"):
                dims.append(None)
            else:
                dims.append(int(self.next("num")[1]))
            self.accept(",")
        return TensorType(dt, tuple(dims))

    def scalar(self):
        kind, text = self.next()
        if kind == "num":
            return float(text) if any(c in text for c in ".ein") else int(text)
        if kind == "str":
            return json.loads(text)
        if kind == "b64":
            return base64.b64decode(text[4:-1])
        if text in ("true", "false"):
            return text == "true"
        raise IRError(f"IR parse error: bad attribute value {text!r}")

    def attr_value(self):
        kind, text = self.peek()
        if kind == "ref":
            self.next()
            key = self.name(text)
            if key not in self.consts:
                raise IRError(f"IR parse error: constant @{key} not in the side table")
            return self.consts[key]
        if text == "dense":
            self.next()
            self.next("<")
            t = self.type()
            self.next(":")
            items = self.list()
            self.next(">")
            np_dtype = dtypes.to_numpy(t.dtype)
            arr = np.array(items, dtype=np_dtype).reshape(t.shape)
            arr.setflags(write=False)
            return arr
        if text == "[":
            return tuple(self.list())
        return self.scalar()

    def list(self):
        self.next("[")
        items = []
        while not self.accept("]"):
            items.append(self.scalar())
            self.accept(",")
        return items

    def graph(self) -> Graph:
        self.next("graph")
        g = Graph(self.next("ident")[1])
        env: dict[str, Value] = {}
        self.next("(")
        while not self.accept(")"):
            name = self.name(self.next("val")[1])
            self.next(":")
            env[name] = g.add_input(name, self.type())
            self.accept(",")
        self.next("->")
        self.next("(")
        out_names = []
        while not self.accept(")"):
            out_names.append(self.name(self.next("val")[1]))
            self.accept(",")
        self.next("{")
        while not self.accept("}"):
            self.node(g, env)
        for name in out_names:
            if name not in env:
                raise IRError(f"IR parse error: graph output %{name} is never defined")
            g.outputs.append(env[name])
        return g

    def node(self, g: Graph, env: dict) -> None:
        names = [self.name(self.next("val")[1])]
        while self.accept(","):
            names.append(self.name(self.next("val")[1]))
        self.next("=")
        op = self.next("ident")[1]
        self.next("(")
        inputs = []
        while not self.accept(")"):
            ref = self.name(self.next("val")[1])
            if ref not in env:
                raise IRError(f"IR parse error: %{ref} used before definition in {op}")
            inputs.append(env[ref])
            self.accept(",")
        attrs = {}
        if self.accept("{"):
            while not self.accept("}"):
                key = self.next("ident")[1]
                self.next("=")
                attrs[key] = self.attr_value()
                self.accept(",")
        self.next(":")
        types = [self.type()]
        while self.accept(","):
            types.append(self.type())
        loc = ""
        if self.accept("loc"):
            self.next("(")
            loc = json.loads(self.next("str")[1])
            self.next(")")
        node = g.add_node(op, inputs, attrs, name=loc, out_names=names, out_types=types)
        for want, v in zip(names, node.outputs):
            if v.name != want:
                raise IRError(f"IR parse error: value %{want} defined twice")
            env[want] = v


def parse_graph(text: str, constants: dict | None = None) -> Graph:
    """Parse the text form back into a Graph (the verifier is not run here)."""
    return _Parser(text, constants or {}).graph()
