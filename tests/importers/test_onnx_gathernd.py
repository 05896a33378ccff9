"""ONNX GatherND (importers/onnx_ops/movement.py): indices known only at run time, one
flat gather with nothing on the host, against onnxruntime exactly: batch_dims, index
tuples that pick elements or whole slices, negative indices, and an index out of range
raising braze's IndexError (also where its flat position would land inside data)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

import bridge
from importers.onnx import import_onnx

RNG = np.random.default_rng(0)


def _vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
                                         shape)


def _model(data_shape, idx_shape, dtype=np.float32, batch_dims=None, opset=13):
    attrs = {} if batch_dims is None else {"batch_dims": batch_dims}
    node = helper.make_node("GatherND", ["data", "indices"], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [_vi("data", dtype, data_shape),
                                            _vi("indices", np.int64, idx_shape)],
                              [helper.make_empty_tensor_value_info("y")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _indices(data_shape, idx_shape, batch_dims):
    """Random indices in [-n, n) for each position of the index tuple."""
    k = idx_shape[-1]
    dims = np.array(data_shape[batch_dims:batch_dims + k])
    return RNG.integers(-dims, dims, size=idx_shape).astype(np.int64)


CASES = [  # data shape, indices shape, batch_dims
    ((5,), (3, 1), 0),
    ((3, 4), (2, 2), 0),  # elements
    ((3, 4), (2, 1), 0),  # rows
    ((2, 3, 4), (4, 2, 1), 0),  # slices of slices, indices of rank 3
    ((2, 3, 4), (2,), 0),  # one index tuple: indices of rank 1
    ((2, 3, 4), (2, 1), 1),  # one row per batch
    ((2, 3, 4), (2, 5, 2), 1),  # several elements per batch
    ((2, 3, 4, 2), (2, 3, 1), 2),
    ((2, 3, 4, 2), (2, 3, 6, 2), 2),
]


@pytest.mark.parametrize("data_shape,idx_shape,b", CASES)
def test_gathernd_matches_onnxruntime(data_shape, idx_shape, b):
    model = _model(data_shape, idx_shape, batch_dims=b if b else None,
                   opset=12 if b else 11)
    compiled = bridge.compile_onnx(model, allow_fallback=False)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for _ in range(5):
        feeds = {"data": RNG.standard_normal(data_shape).astype(np.float32),
                 "indices": _indices(data_shape, idx_shape, b)}
        (got,), (want,) = compiled(**feeds), sess.run(None, feeds)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64])
def test_gathernd_dtypes_and_opsets(dtype):
    for opset in (11, 12, 13, 18):
        model = _model((3, 4, 2), (5, 2), dtype, opset=opset)
        compiled = bridge.compile_onnx(model, allow_fallback=False)
        sess = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"])
        feeds = {"data": (RNG.standard_normal((3, 4, 2)) * 100).astype(dtype),
                 "indices": _indices((3, 4, 2), (5, 2), 0)}
        np.testing.assert_array_equal(compiled(**feeds)[0], sess.run(None, feeds)[0])


def test_gathernd_is_one_gather_on_the_device():
    ops = [n.op for n in import_onnx(_model((2, 3, 4), (2, 5, 2), batch_dims=1),
                                     {"data": (2, 3, 4), "indices": (2, 5, 2)}).graph.nodes]
    assert "host" not in ops and ops.count("gather") == 1


def test_gathernd_negative_indices_count_from_the_end():
    model = _model((3, 4), (3, 2))
    compiled = bridge.compile_onnx(model, allow_fallback=False)
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    idx = np.array([[-1, -1], [-3, 0], [1, -4]], np.int64)
    np.testing.assert_array_equal(compiled(data=data, indices=idx)[0], [11, 0, 4])


@pytest.mark.parametrize("bad", [
    [[0, 4]],  # past its dim, but flat position 4 is inside data
    [[3, 0]],
    [[-4, 0]],
    [[0, -5]],  # before its dim, flat position -1 inside data counted from the end
    [[2, 9223372036854775807]],
])
def test_gathernd_out_of_range_raises_index_error(bad):
    model = _model((3, 4), (1, 2))
    compiled = bridge.compile_onnx(model, allow_fallback=False)
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    with pytest.raises(IndexError):
        compiled(data=data, indices=np.array(bad, np.int64))
    with pytest.raises(Exception):  # onnxruntime refuses it too
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]
                             ).run(None, {"data": data, "indices": np.array(bad, np.int64)})


def test_gathernd_batch_out_of_range_raises_index_error():
    """An index past its dim in one batch must not read the next batch's rows."""
    model = _model((2, 3, 4), (2, 1), batch_dims=1, opset=12)
    compiled = bridge.compile_onnx(model, allow_fallback=False)
    data = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    np.testing.assert_array_equal(compiled(data=data, indices=np.array([[2], [-3]]))[0],
                                  [data[0, 2], data[1, 0]])
    with pytest.raises(IndexError):
        compiled(data=data, indices=np.array([[3], [0]], np.int64))


def test_gathernd_constant_indices_out_of_range_stay_on_onnxruntime():
    """Known bad at import: onnxruntime runs the node and reports the index itself."""
    node = helper.make_node("GatherND", ["data", "indices"], ["y"])
    graph = helper.make_graph(
        [node], "g", [_vi("data", np.float32, (4, 8))],
        [helper.make_empty_tensor_value_info("y")],
        [helper.make_tensor("indices", 7, (1, 1), [9])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    (host,) = [n for n in import_onnx(model, {"data": (4, 8)}).graph.nodes if n.op == "host"]
    assert "GatherND index out of range" in host.attrs["reason"]
