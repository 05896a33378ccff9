"""Small valid ONNX models the fuzzer mutates: each exercises a different part of braze
(conv/pool, gemm, gather, integer arithmetic, movement, normalization, reductions,
decoder layers, scatters)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper

OPSET = 17


def _model(name, nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    g = helper.make_graph(nodes, name, inputs, outputs,
                          [numpy_helper.from_array(a, n) for n, a in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


def _io(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def cnn(rng) -> onnx.ModelProto:
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1], strides=[1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2],
                              name="pool"),
             helper.make_node("Flatten", ["p"], ["f"], axis=1, name="flat"),
             helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1, name="fc")]
    inits = [("w", _f32(rng, 4, 2, 3, 3)), ("b", _f32(rng, 4)),
             ("wf", _f32(rng, 5, 4 * 4 * 4)), ("bf", _f32(rng, 5))]
    return _model("cnn", nodes, [_io("x", T.FLOAT, [1, 2, 8, 8])],
                  [_io("y", T.FLOAT, [1, 5])], inits)


def mlp(rng) -> onnx.ModelProto:
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Add", ["h", "b1"], ["ha"], name="add1"),
             helper.make_node("Relu", ["ha"], ["hr"], name="relu"),
             helper.make_node("MatMul", ["hr", "w2"], ["o"], name="mm2"),
             helper.make_node("Softmax", ["o"], ["y"], axis=-1, name="softmax")]
    inits = [("w1", _f32(rng, 8, 16)), ("b1", _f32(rng, 16)), ("w2", _f32(rng, 16, 4))]
    return _model("mlp", nodes, [_io("x", T.FLOAT, [3, 8])], [_io("y", T.FLOAT, [3, 4])],
                  inits)


def embed(rng) -> onnx.ModelProto:
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], axis=0, name="lookup"),
             helper.make_node("ReduceMean", ["e"], ["m"], axes=[1], keepdims=1, name="mean"),
             helper.make_node("Sub", ["e", "m"], ["d"], name="center"),
             helper.make_node("Mul", ["d", "d"], ["sq"], name="square"),
             helper.make_node("ReduceSum", ["sq", "axes"], ["y"], keepdims=0, name="sum")]
    inits = [("table", _f32(rng, 10, 6)), ("axes", np.array([1], np.int64))]
    return _model("embed", nodes, [_io("ids", T.INT64, [2, 3])], [_io("y", T.FLOAT, [2, 6])],
                  inits)


def integer(rng) -> onnx.ModelProto:
    nodes = [helper.make_node("Div", ["a", "k"], ["q"], name="div"),
             helper.make_node("Mod", ["a", "k"], ["r"], name="mod"),
             helper.make_node("Add", ["q", "r"], ["s"], name="add"),
             helper.make_node("Cast", ["s"], ["f"], to=T.FLOAT, name="cast"),
             helper.make_node("Greater", ["f", "zero"], ["pos"], name="gt"),
             helper.make_node("Where", ["pos", "f", "zero"], ["y"], name="where")]
    inits = [("k", np.array([3, 5, 7, 2], np.int32)), ("zero", np.array(0, np.float32))]
    return _model("integer", nodes, [_io("a", T.INT32, [3, 4])], [_io("y", T.FLOAT, [3, 4])],
                  inits)


def movement(rng) -> onnx.ModelProto:
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1], name="transpose"),
             helper.make_node("Reshape", ["t", "shape"], ["r"], name="reshape"),
             helper.make_node("Concat", ["r", "r"], ["c"], axis=1, name="concat"),
             helper.make_node("Slice", ["c", "starts", "ends", "axes"], ["s"], name="slice"),
             helper.make_node("Pad", ["s", "pads"], ["y"], mode="constant", name="pad")]
    inits = [("shape", np.array([2, 12], np.int64)), ("starts", np.array([1], np.int64)),
             ("ends", np.array([20], np.int64)), ("axes", np.array([1], np.int64)),
             ("pads", np.array([0, 1, 0, 1], np.int64))]
    return _model("movement", nodes, [_io("x", T.FLOAT, [2, 3, 4])],
                  [_io("y", T.FLOAT, [2, 21])], inits)


def norm(rng) -> onnx.ModelProto:
    nodes = [helper.make_node("BatchNormalization", ["x", "g", "b", "mu", "var"], ["n"],
                              epsilon=1e-5, name="bn"),
             helper.make_node("Sigmoid", ["n"], ["s"], name="sigmoid"),
             helper.make_node("AveragePool", ["s"], ["p"], kernel_shape=[3, 3],
                              strides=[2, 2], pads=[1, 1, 1, 1], name="avgpool"),
             helper.make_node("GlobalAveragePool", ["p"], ["y"], name="gap")]
    inits = [("g", _f32(rng, 3)), ("b", _f32(rng, 3)), ("mu", _f32(rng, 3)),
             ("var", np.abs(_f32(rng, 3)) + 0.5)]
    return _model("norm", nodes, [_io("x", T.FLOAT, [1, 3, 7, 7])],
                  [_io("y", T.FLOAT, [1, 3, 1, 1])], inits)


def reduce(rng) -> onnx.ModelProto:
    nodes = [helper.make_node("Mul", ["x", "scale"], ["m"], name="mul"),
             helper.make_node("Exp", ["m"], ["e"], name="exp"),
             helper.make_node("ReduceMax", ["e"], ["mx"], axes=[-1], keepdims=1, name="max"),
             helper.make_node("Div", ["e", "mx"], ["d"], name="div"),
             helper.make_node("ArgMax", ["d"], ["y"], axis=1, keepdims=0, name="argmax")]
    inits = [("scale", _f32(rng, 1, 6))]
    return _model("reduce", nodes, [_io("x", T.FLOAT, [4, 6])], [_io("y", T.INT64, [4])],
                  inits)


def decoder(rng) -> onnx.ModelProto:
    """Upsampling and volumes: ConvTranspose, Resize, LRN, a 3-d conv and pool, CumSum,
    GatherElements (each lowered onto other IR ops)."""
    nodes = [helper.make_node("ConvTranspose", ["x", "wt"], ["u"], strides=[2, 2],
                              name="up"),
             helper.make_node("Resize", ["u", "", "scales"], ["r"], mode="linear",
                              name="resize"),
             helper.make_node("LRN", ["r"], ["n"], size=3, name="lrn"),
             helper.make_node("Unsqueeze", ["n", "ax0"], ["v"], name="vol"),
             helper.make_node("Conv", ["v", "w3"], ["c"], kernel_shape=[2, 3, 3],
                              pads=[0, 1, 1, 0, 1, 1], name="conv3d"),
             helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[1, 2, 2],
                              strides=[1, 2, 2], name="pool3d"),
             helper.make_node("Squeeze", ["p", "ax2"], ["q"], name="flat"),
             helper.make_node("CumSum", ["q", "ax1"], ["s"], name="cumsum"),
             helper.make_node("GatherElements", ["s", "gi"], ["y"], axis=3, name="pick")]
    inits = [("wt", _f32(rng, 2, 3, 2, 2)), ("scales", np.array([1, 1, 1.5, 1.5], np.float32)),
             ("ax0", np.array([1], np.int64)), ("w3", _f32(rng, 1, 1, 2, 3, 3)),
             ("ax2", np.array([1], np.int64)), ("ax1", np.array([1], np.int64)),
             ("gi", rng.integers(0, 6, (1, 2, 6, 2)).astype(np.int64))]
    return _model("decoder", nodes, [_io("x", T.FLOAT, [1, 2, 4, 4])],
                  [_io("y", T.FLOAT, [1, 2, 6, 2])], inits)


def scatter(rng) -> onnx.ModelProto:
    """Scatters with constant indices (ScatterND with a reduction, ScatterElements):
    gathers from the data and the updates."""
    nodes = [helper.make_node("ScatterND", ["x", "ni", "nu"], ["a"], reduction="add",
                              name="scatter_nd"),
             helper.make_node("ScatterElements", ["a", "ei", "eu"], ["b"], axis=1,
                              name="scatter_elements"),
             helper.make_node("Mul", ["b", "x"], ["y"], name="mul")]
    inits = [("ni", np.array([[1], [3], [1]], np.int64)), ("nu", _f32(rng, 3, 5)),
             ("ei", np.array([[0, 4], [2, 2], [1, 0], [3, 1]], np.int64)),
             ("eu", _f32(rng, 4, 2))]
    return _model("scatter", nodes, [_io("x", T.FLOAT, [4, 5])], [_io("y", T.FLOAT, [4, 5])],
                  inits)


SEEDS = {f.__name__: f for f in (cnn, mlp, embed, integer, movement, norm, reduce,
                                 decoder, scatter)}


def seed_models(seed: int = 0) -> dict[str, onnx.ModelProto]:
    rng = np.random.default_rng(seed)
    return {name: make(rng) for name, make in SEEDS.items()}
