"""Half precision computed in single precision.

braze's kernels compute in f32 (and f64); a float16 graph (an ONNX model exported
for a GPU, a torch module after `.half()`) is compiled by widening: every value an
op computes as f16 is computed as f32 instead, and f16 remains only where the
graph holds it in memory across its edges:

- graph inputs and outputs stay f16 (a cast to f32 after each input, a cast back
  before each output);
- an explicit cast to f16 stays (the graph asked for that rounding; readers get a
  cast back to f32 after it);
- host nodes read and write what the framework expects (f16 in, f16 out, with casts
  around them);
- f16 constants are read through a cast (constant folding makes them f32 constants);
- movement of f16 values (a reshape, transpose, gather of them) moves them as f16,
  unless it mixes them with widened values (a concat): then it is widened too.

So intermediate results are not rounded to f16 after each op: the values are at
least as accurate as per-op f16 rounding (the two differ by an f16 rounding or two;
an intermediate that would overflow f16's range (65504) stays finite here). This is
what onnxruntime does on CPUs for fp16 ops it has no fp16 kernel for (casts around
f32 kernels, redundant cast pairs removed) and what inductor does on CPU.

`widen_half(graph) -> changed`, in place; after it, only `cast`, `bitcast`, `const`,
`host` and movement nodes touch f16 values; compiler/codegen refuses f16 anywhere
else.
"""

from __future__ import annotations

from compiler.ir import Graph, Node, TensorType, Value
from compiler.ops import Family

HALF = "f16"
WIDE = "f32"
# ops that read or write f16 as such: a cast's rounding is its meaning, a bitcast reads
# the bits, a constant is read through a cast, a host node is the framework's
KEEP = frozenset({"cast", "bitcast", "const", "host"})
# ... of which these read their inputs' bits as the graph gave them
READ_AS_IS = frozenset({"bitcast", "host"})


def widen_half(graph: Graph) -> bool:
    if not _touches_half(graph):
        return False
    wide: dict[Value, Value] = {}  # an f16 value -> its f32 cast
    narrow: dict[Value, Value] = {}  # a value widened from f16 -> its f16 cast
    widened: set[Value] = set()
    ordered: list[Node] = []

    def cast(v: Value, to: str, memo: dict) -> Value:
        if v not in memo:
            node = graph.add_node("cast", [v], {"to": to}, name=f"{v.name}.{to}")
            ordered.append(node)
            memo[v] = node.output
        return memo[v]

    for n in list(graph.nodes):
        if n.op in READ_AS_IS:  # handed back the f16 values they were given
            if any(v in widened for v in n.inputs):
                graph.set_inputs(n, [cast(v, HALF, narrow) if v in widened else v
                                     for v in n.inputs])
        elif n.op not in KEEP:
            if _needs_widening(n):
                graph.set_inputs(n, [cast(v, WIDE, wide) if v.dtype == HALF else v
                                     for v in n.inputs])
            # (movement left as it is may read values widened before it)
            for o, t in zip(n.outputs, n.opdef.infer(n)):
                if o.dtype == HALF and t.dtype == WIDE:
                    o.type = TensorType(WIDE, o.shape)
                    widened.add(o)
        ordered.append(n)
    graph.outputs = [cast(v, HALF, narrow) if v in widened else v for v in graph.outputs]
    graph.nodes = ordered  # each cast sits right before its first reader
    return True


def _needs_widening(n: Node) -> bool:
    """Whether `n` computes on f16: any op but those in KEEP that reads or writes it, except
    movement whose float inputs are all f16 (a reshape or gather of f16 values moves them
    as they are; widening it would undo the rules that move reshapes past casts, and the
    two would take turns forever), and movement that mixes f16 with widened f32 inputs."""
    if n.op in KEEP:
        return False
    floats = {v.dtype for v in n.inputs if v.dtype in ("f16", "f32")}
    if n.opdef.family is Family.MOVEMENT:
        return floats == {HALF, WIDE}
    return HALF in floats or any(o.dtype == HALF for o in n.outputs)


def _touches_half(graph: Graph) -> bool:
    """Whether some node computes on f16 (`_needs_widening`)."""
    return any(_needs_widening(n) for n in graph.nodes)
