"""Builders of bad ONNX inputs, shared by the CLI and API error tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _vi(name, shape=(2, 3), elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, list(shape))


def good_model(opset: int = 17) -> onnx.ModelProto:
    """y = relu(x + b): the well-formed baseline the bad ones are made from."""
    b = numpy_helper.from_array(np.ones((2, 3), np.float32), "b")
    nodes = [helper.make_node("Add", ["x", "b"], ["s"], name="add0"),
             helper.make_node("Relu", ["s"], ["y"], name="relu0")]
    g = helper.make_graph(nodes, "g", [_vi("x")], [_vi("y")], [b])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def cycle_model() -> onnx.ModelProto:
    nodes = [helper.make_node("Add", ["x", "t"], ["s"], name="add0"),
             helper.make_node("Relu", ["s"], ["t"], name="relu0"),
             helper.make_node("Identity", ["t"], ["y"], name="out0")]
    g = helper.make_graph(nodes, "g", [_vi("x")], [_vi("y")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def dangling_model() -> onnx.ModelProto:
    nodes = [helper.make_node("Add", ["x", "nowhere"], ["y"], name="add0")]
    g = helper.make_graph(nodes, "g", [_vi("x")], [_vi("y")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def unknown_domain_model() -> onnx.ModelProto:
    nodes = [helper.make_node("Frob", ["x"], ["y"], name="frob0", domain="com.example.nope")]
    g = helper.make_graph(nodes, "g", [_vi("x")], [_vi("y")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid("com.example.nope", 1)])


def unknown_op_model() -> onnx.ModelProto:
    nodes = [helper.make_node("Frobnicate", ["x"], ["y"], name="frob0")]
    g = helper.make_graph(nodes, "g", [_vi("x")], [_vi("y")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def future_opset_model() -> onnx.ModelProto:
    return good_model(opset=onnx.defs.onnx_opset_version() + 5)


def _one_node(node, x=(1, 1, 4, 4), y=(1, 1, 4, 4), elem=TensorProto.FLOAT, inits=()):
    g = helper.make_graph([node], "g", [_vi("x", x, elem)], [_vi("y", y, elem)], list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def zero_kernel_model() -> onnx.ModelProto:
    """MaxPool with kernel_shape [0, 0] (onnxruntime refuses; braze returned all -inf)."""
    return _one_node(helper.make_node("MaxPool", ["x"], ["y"], name="pool0",
                                      kernel_shape=[0, 0]))


def no_kernel_model() -> onnx.ModelProto:
    """MaxPool without kernel_shape (was: TypeError: 'NoneType' object is not iterable)."""
    return _one_node(helper.make_node("MaxPool", ["x"], ["y"], name="pool0"))


def zero_stride_model() -> onnx.ModelProto:
    return _one_node(helper.make_node("AveragePool", ["x"], ["y"], name="pool0",
                                      kernel_shape=[2, 2], strides=[0, 1]))


def divide_by_zero_model(op: str = "Div") -> onnx.ModelProto:
    """Integer Div (or Mod) by a constant holding 0 (braze returned x and 0)."""
    k = numpy_helper.from_array(np.array([2, 0, 1], np.int32), "k")
    return _one_node(helper.make_node(op, ["x", "k"], ["y"], name="div0"), x=(3,), y=(3,),
                     elem=TensorProto.INT32, inits=[k])


def undefined_elem_model() -> onnx.ModelProto:
    """An input of element type 0 (`run --random` failed with KeyError)."""
    m = good_model()
    m.graph.input[0].type.tensor_type.elem_type = 0
    return m


def negative_dim_model() -> onnx.ModelProto:
    """An input declaring dim -2 (accepted at load, then demanded at call time)."""
    m = good_model()
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = -2
    return m


def write(model: onnx.ModelProto, path: Path) -> Path:
    """Serialize without the checker (the point is to write invalid models)."""
    path.write_bytes(model.SerializeToString())
    return path


def write_bad_files(d: Path) -> dict[str, Path]:
    """Every bad file the error tests use, by case name."""
    d.mkdir(parents=True, exist_ok=True)
    good = good_model().SerializeToString()
    files = {
        "missing": d / "does_not_exist.onnx",
        "directory": d,
        "not_onnx": d / "notes.onnx",
        "empty": d / "empty.onnx",
        "truncated": d / "truncated.onnx",
        "cycle": write(cycle_model(), d / "cycle.onnx"),
        "dangling": write(dangling_model(), d / "dangling.onnx"),
        "unknown_domain": write(unknown_domain_model(), d / "unknown_domain.onnx"),
        "unknown_op": write(unknown_op_model(), d / "unknown_op.onnx"),
        "future_opset": write(future_opset_model(), d / "future_opset.onnx"),
        "zero_kernel": write(zero_kernel_model(), d / "zero_kernel.onnx"),
        "no_kernel": write(no_kernel_model(), d / "no_kernel.onnx"),
        "zero_stride": write(zero_stride_model(), d / "zero_stride.onnx"),
        "div_by_zero": write(divide_by_zero_model(), d / "div_by_zero.onnx"),
        "mod_by_zero": write(divide_by_zero_model("Mod"), d / "mod_by_zero.onnx"),
        "undefined_elem": write(undefined_elem_model(), d / "undefined_elem.onnx"),
        "negative_dim": write(negative_dim_model(), d / "negative_dim.onnx"),
    }
    files["not_onnx"].write_text("this is a text file, not a model\n" * 20)
    files["empty"].write_bytes(b"")
    files["truncated"].write_bytes(good[: len(good) // 2])
    return files
