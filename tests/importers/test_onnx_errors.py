"""Bad ONNX input gives a precise braze error naming the file, node, op or value."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from compiler.errors import (CompileError, InputError, InvalidModelError, ModelLoadError,
                             UnsupportedModelError)
from importers.onnx import import_onnx, load_model
from tests.bridge import badmodels

# case -> (error class, regexes the message must match)
FILE_CASES = {
    "missing": (ModelLoadError, [r"no such file: .*does_not_exist\.onnx"]),
    "directory": (ModelLoadError, [r"is a directory"]),
    "not_onnx": (ModelLoadError, [r"notes\.onnx is not an ONNX model"]),
    "empty": (ModelLoadError, [r"empty\.onnx is empty"]),
    "truncated": (ModelLoadError, [r"truncated\.onnx"]),
    "cycle": (InvalidModelError, [r"cycle", r'node "(add0|relu0|out0)"']),
    "dangling": (InvalidModelError, [r'node "add0" \(Add\) reads \'nowhere\'']),
    "unknown_domain": (InvalidModelError, [r'node "frob0"', r"unknown op Frob in domain "
                                           r"'com\.example\.nope'"]),
    "unknown_op": (InvalidModelError, [r'node "frob0"', r"unknown op Frobnicate in domain ''"]),
    "future_opset": (UnsupportedModelError, [r"opset 33 of domain 'ai\.onnx'", r"knows opsets "
                                             r"up to 28"]),
}


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    return badmodels.write_bad_files(tmp_path_factory.mktemp("bad"))


@pytest.mark.parametrize("case", sorted(FILE_CASES))
def test_bad_file(bad_files, case):
    cls, patterns = FILE_CASES[case]
    with pytest.raises(cls) as info:
        import_onnx(bad_files[case])
    for p in patterns:
        assert re.search(p, str(info.value)), (p, str(info.value))


def _model(nodes, inputs, outputs, inits=(), opset=17, extra_opsets=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v)
                                                 for d, v in extra_opsets]
    return helper.make_model(g, opset_imports=opsets)


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def test_unnamed_node_is_named_by_index_and_op():
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "gone"], ["y"])]
    with pytest.raises(InvalidModelError, match=r"node #1 \(Add\) reads 'gone'"):
        import_onnx(_model(nodes, [_vi("x", [2])], [_vi("y", [2])]))


def test_op_missing_at_the_models_opset():
    nodes = [helper.make_node("Gelu", ["x"], ["y"], name="g0")]
    with pytest.raises(InvalidModelError, match=r'node "g0" \(Gelu\).*does not exist at opset 17'):
        import_onnx(_model(nodes, [_vi("x", [2])], [_vi("y", [2])]))


def test_symbolic_dim_needs_input_shapes():
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    model = _model(nodes, [_vi("x", ["N", 3])], [_vi("y", ["N", 3])])
    with pytest.raises(InvalidModelError, match=r"input 'x' has shape \(N, 3\).*input_shapes"):
        import_onnx(model)
    assert import_onnx(model, {"x": (5, 3)}).graph.outputs[0].shape == (5, 3)


@pytest.mark.parametrize("shapes,pattern", [
    ({"x": (5, 4)}, r"input 'x' has shape \(N, 3\); input_shapes gives \(5, 4\)"),
    ({"x": (5,)}, r"has rank 2"),
    ({"z": (1, 3)}, r"not model inputs"),
])
def test_bad_input_shapes(shapes, pattern):
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["N", 3])],
                   [_vi("y", ["N", 3])])
    with pytest.raises(InputError, match=pattern):
        import_onnx(model, shapes)


def test_conflicting_bindings_of_one_dim():
    nodes = [helper.make_node("Add", ["a", "b"], ["y"])]
    model = _model(nodes, [_vi("a", ["N"]), _vi("b", ["N"])], [_vi("y", ["N"])])
    with pytest.raises(InputError, match=r"dim 'N' is bound to both 2 and 3"):
        import_onnx(model, {"a": (2,), "b": (3,)})


def test_duplicate_definition():
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="r0"),
             helper.make_node("Neg", ["x"], ["y"], name="n0")]
    with pytest.raises(InvalidModelError, match=r'node "n0" \(Neg\) defines \'y\''):
        import_onnx(_model(nodes, [_vi("x", [2])], [_vi("y", [2])]))


def test_a_graph_without_outputs_is_refused():
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    with pytest.raises(InvalidModelError, match=r"declares no outputs"):
        import_onnx(_model(nodes, [_vi("x", [2])], []))


def test_an_attribute_of_int_type_holding_a_graph_is_refused():
    """A flipped byte left ArgMax's keepdims (type INT) holding a graph: the ONNX checker
    and onnxruntime refuse it; the node is not taken for one with a subgraph."""
    node = helper.make_node("ArgMax", ["x"], ["y"], name="a0", axis=0)
    keep = helper.make_attribute("keepdims", 0)
    keep.graphs.add()
    node.attribute.append(keep)
    with pytest.raises(InvalidModelError, match=r'"a0".*keepdims'):
        import_onnx(_model([node], [_vi("x", [2, 3])],
                           [helper.make_tensor_value_info("y", TensorProto.INT64, [3])]))


def test_output_defined_nowhere():
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    with pytest.raises(InvalidModelError, match=r"graph output 'z'"):
        import_onnx(_model(nodes, [_vi("x", [2])], [_vi("z", [2])]))


def test_inconsistent_shapes_are_invalid():
    nodes = [helper.make_node("Add", ["a", "b"], ["y"], name="add0")]
    model = _model(nodes, [_vi("a", [2, 3]), _vi("b", [4, 3])], [_vi("y", [2, 3])])
    with pytest.raises(InvalidModelError, match=r'node "add0" \(Add\).*Incompatible dimensions'):
        import_onnx(model)


def test_missing_external_data_file(tmp_path):
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    model = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_vi("x", [2, 4])],
                   [_vi("y", [2, 4])], [w])
    path = tmp_path / "m.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="w.bin",
                    size_threshold=0)
    (tmp_path / "w.bin").unlink()
    with pytest.raises(ModelLoadError, match=r"external data file 'w.bin' of tensor 'w'"):
        load_model(path)


def test_not_a_model_object():
    with pytest.raises(ModelLoadError, match=r"got int"):
        load_model(3)


def test_contrib_op_is_a_host_node_not_an_error():
    nodes = [helper.make_node("FastGelu", ["x"], ["y"], name="fg", domain="com.microsoft")]
    model = _model(nodes, [_vi("x", [2, 3])], [_vi("y", [2, 3])],
                   extra_opsets=[("com.microsoft", 1)])
    (node,) = import_onnx(model).graph.nodes
    assert node.op == "host" and node.attrs["reason"] == "no braze converter for " \
        "com.microsoft.FastGelu"


def test_transpose_with_an_empty_perm_given_is_refused_unless_a_scalar():
    """perm given as an empty list is not the default (the axes reversed): onnxruntime
    refuses it for a tensor of rank > 0, and so does braze; for a scalar it is the one
    permutation there is."""
    def model(rank):
        node = helper.make_node("Transpose", ["x"], ["y"], name="t0")
        node.attribute.append(helper.make_attribute("perm", [], attr_type=AttributeProto.INTS))
        shape = [2, 3][:rank]
        return _model([node], [_vi("x", shape)], [_vi("y", shape[::-1])])

    with pytest.raises(InvalidModelError, match=r"perm \[\] is not a permutation of the 2"):
        import_onnx(model(2))
    assert import_onnx(model(0)) is not None


def test_a_tensor_larger_than_the_memory_available_is_refused_at_compile():
    """A Pad asking for 2^40 rows (a fuzzed model's pads) is a CompileError naming the
    node and the size, not an allocation that fails, or gets the process killed, at run."""
    pads = numpy_helper.from_array(np.array([1 << 40, 0, 0, 0], np.int64), "pads")
    nodes = [helper.make_node("Pad", ["x", "pads"], ["y"], name="p0")]
    model = _model(nodes, [_vi("x", [2, 3])], [_vi("y", None)], [pads])
    with pytest.raises(CompileError, match=r'"p0".*GiB, more than the .* GiB of memory '
                                           r'this machine has available'):
        import_onnx(model)
