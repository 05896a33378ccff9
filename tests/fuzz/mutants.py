"""Mutants of the seed models, reproducible from one seed: byte flips, truncations, and
semantic edits through the onnx helper API (wrong or missing attributes, zero and
negative dims, missing or dangling inputs, wrong dtypes, swapped ops, dropped nodes)."""

from __future__ import annotations

import random

import onnx
from onnx import TensorProto, helper

from tests.fuzz.seeds import seed_models

# attribute values a fuzzer tries where a node has ints attributes
BAD_INTS = ([0, 0], [-1, -1], [0], [1], [100, 100], [-3], [1, 2, 3, 4, 5, 6, 7, 8], [])
BAD_INT = (0, -1, -7, 7, 100, 1 << 40)
ELEM_TYPES = (0, TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64, TensorProto.DOUBLE,
              TensorProto.FLOAT16, TensorProto.BOOL, TensorProto.STRING, TensorProto.UINT8, 99)
OPS = ("Relu", "Add", "MatMul", "Conv", "MaxPool", "Gather", "Div", "Reshape", "Concat",
       "Softmax", "Transpose", "Cast", "Slice", "Pad", "ReduceSum", "Where", "Identity", "Foo")


def _flip(m: onnx.ModelProto, r: random.Random) -> bytes:
    data = bytearray(m.SerializeToString())
    for _ in range(r.randint(1, 8)):
        data[r.randrange(len(data))] = r.randrange(256)
    return bytes(data)


def _truncate(m: onnx.ModelProto, r: random.Random) -> bytes:
    data = m.SerializeToString()
    return data[:r.randrange(len(data))]


def _attr(m, r):
    node = r.choice(m.graph.node)
    ints = [a for a in node.attribute if a.type in (onnx.AttributeProto.INTS,
                                                     onnx.AttributeProto.INT)]
    if not ints or r.random() < 0.2:  # remove or add an attribute instead
        if node.attribute and r.random() < 0.5:
            del node.attribute[r.randrange(len(node.attribute))]
        else:
            node.attribute.append(helper.make_attribute(
                r.choice(("axis", "kernel_shape", "strides", "perm", "to", "keepdims")),
                r.choice(BAD_INT)))
        return
    a = r.choice(ints)
    if a.type == onnx.AttributeProto.INTS:
        del a.ints[:]
        a.ints.extend(r.choice(BAD_INTS))
    else:
        a.i = r.choice(BAD_INT)


def _dim(m, r):
    vi = r.choice(list(m.graph.input) + list(m.graph.output))
    dims = vi.type.tensor_type.shape.dim
    if dims:
        d = r.choice(dims)
        choice = r.random()
        if choice < 0.4:
            d.dim_value = r.choice((0, -1, -5))
        elif choice < 0.6:
            d.dim_param = "N"
        else:
            d.dim_value = r.randint(1, 9)


def _input(m, r):
    node = r.choice(m.graph.node)
    if not node.input:
        return
    i = r.randrange(len(node.input))
    choice = r.random()
    if choice < 0.4:
        del node.input[i]
    elif choice < 0.7:
        node.input[i] = ""
    else:
        node.input[i] = "nowhere"


def _dtype(m, r):
    targets = list(m.graph.input) + list(m.graph.output)
    if r.random() < 0.4 and m.graph.initializer:
        t = r.choice(m.graph.initializer)
        t.data_type = r.choice(ELEM_TYPES[1:-1])
        return
    r.choice(targets).type.tensor_type.elem_type = r.choice(ELEM_TYPES)


def _op(m, r):
    r.choice(m.graph.node).op_type = r.choice(OPS)


def _drop(m, r):
    if len(m.graph.node) > 1:
        del m.graph.node[r.randrange(len(m.graph.node))]


def _initializer(m, r):
    if not m.graph.initializer:
        return
    t = r.choice(m.graph.initializer)
    if t.dims and r.random() < 0.5:
        t.dims[r.randrange(len(t.dims))] = r.choice((0, 1, 2, -1, 1000))
    elif t.data_type in (TensorProto.INT64, TensorProto.INT32) and t.raw_data:
        data = bytearray(t.raw_data)
        data[r.randrange(len(data))] = r.choice((0, 0x80, 0xFF, 7))
        t.raw_data = bytes(data)
    else:
        t.raw_data = t.raw_data[: len(t.raw_data) // 2]


def _opset(m, r):
    m.opset_import[0].version = r.choice((1, 6, 9, 11, 13, 18, 21, 99))


SEMANTIC = (_attr, _dim, _input, _dtype, _op, _drop, _initializer, _opset)


def _semantic(m: onnx.ModelProto, r: random.Random) -> bytes:
    for _ in range(r.choice((1, 1, 1, 2))):
        r.choice(SEMANTIC)(m, r)
    return m.SerializeToString()


KINDS = {"flip": _flip, "truncate": _truncate, "semantic": _semantic}
WEIGHTS = {"flip": 2, "truncate": 1, "semantic": 7}


def mutants(count: int, seed: int = 1234) -> list[tuple[str, bytes]]:
    """`count` (name, model bytes) mutants, dealt round-robin over the seed models."""
    seeds = seed_models()
    names = sorted(seeds)
    r = random.Random(seed)
    kinds = [k for k, w in WEIGHTS.items() for _ in range(w)]
    out = []
    for i in range(count):
        base = names[i % len(names)]
        kind = r.choice(kinds)
        m = onnx.ModelProto()
        m.CopyFrom(seeds[base])
        out.append((f"{i:04d}-{base}-{kind}", KINDS[kind](m, r)))
    return out
