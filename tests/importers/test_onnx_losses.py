"""ONNX NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (importers/onnx_ops/losses.py):
one gather of the input at the targets, compiled with nothing on the host; numbers
against onnxruntime for every reduction, with and without weight, an ignore_index
inside and outside the class range, 2-d to 5-d inputs and SCE's log_prob output; and
what stays on the host (float16) or fails at run time (a target out of range)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import bridge
from importers.onnx import import_onnx

RNG = np.random.default_rng(0)
NLL, SCE = "NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"


def _model(op, shape, reduction="mean", ignore_index=None, weight=False, log_prob=False,
           elem=TensorProto.FLOAT, target_elem=TensorProto.INT64, opset=13):
    attrs = {"reduction": reduction}
    if ignore_index is not None:
        attrs["ignore_index"] = ignore_index
    inputs = [helper.make_tensor_value_info("x", elem, shape),
              helper.make_tensor_value_info("t", target_elem, shape[:1] + shape[2:])]
    if weight:
        inputs.append(helper.make_tensor_value_info("w", elem, shape[1:2]))
    outs = ["loss", "log_prob"] if log_prob else ["loss"]
    node = helper.make_node(op, [i.name for i in inputs], outs, **attrs)
    graph = helper.make_graph([node], "g", inputs,
                              [helper.make_tensor_value_info(o, elem, None) for o in outs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _feeds(shape, ignore_index=None, weight=False, dtype=np.float32, low=0):
    """Scores, targets in [low, C) with a few set to ignore_index, and weights."""
    x = (RNG.standard_normal(shape) * 3).astype(dtype)
    t = RNG.integers(low, shape[1], shape[:1] + shape[2:]).astype(np.int64)
    if ignore_index is not None:
        t.reshape(-1)[::3] = ignore_index
    feeds = {"x": x, "t": t}
    if weight:
        feeds["w"] = RNG.uniform(0.5, 2, shape[1]).astype(dtype)
    return feeds


def _ort(model, feeds):
    return ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)


def _check(model, feeds):
    got = bridge.compile_onnx(model, allow_fallback=False)(*feeds.values())
    want = _ort(model, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", [NLL, SCE])
def test_one_gather_and_no_host_node(op):
    """The input is read once at the targets (a flat gather), the weight once; SCE's
    log-softmax subtracts the max."""
    imp = import_onnx(_model(op, (4, 5, 3), ignore_index=-100, weight=True))
    ops = [n.op for n in imp.graph.nodes]
    assert "host" not in ops
    assert ops.count("gather") == 2
    assert ("reduce_max" in ops) == (op == SCE)


@pytest.mark.parametrize("op", [NLL, SCE])
@pytest.mark.parametrize("shape,reduction,weight,ignore_index", [
    ((6, 5), "none", False, None),
    ((6, 5), "sum", True, None),
    ((6, 5), "mean", False, 2),  # inside the class range
    ((6, 5), "mean", True, -1),  # outside it
    ((3, 5, 4), "mean", False, None),
    ((3, 5, 4), "none", True, -100),
    ((2, 5, 3, 4), "sum", False, 100),
    ((2, 5, 3, 4), "mean", True, 0),
    ((2, 4, 2, 3, 2), "mean", False, -1),
])
def test_matches_onnxruntime(op, shape, reduction, weight, ignore_index):
    model = _model(op, shape, reduction, ignore_index, weight)
    _check(model, _feeds(shape, ignore_index, weight))


@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_log_prob_output(reduction):
    shape = (3, 6, 5)
    model = _model(SCE, shape, reduction, 1, weight=True, log_prob=True)
    feeds = _feeds(shape, 1, weight=True)
    feeds["x"][0, :, 0] += 1000  # large scores: the max-subtracted form stays finite
    _check(model, feeds)


@pytest.mark.parametrize("op,opset", [(NLL, 12), (NLL, 22), (SCE, 12)])
def test_other_schema_versions(op, opset):
    shape = (4, 5, 3)
    _check(_model(op, shape, "mean", 3, weight=True, opset=opset), _feeds(shape, 3, True))


def test_int32_targets_and_float64():
    shape = (4, 5, 3)
    model = _model(SCE, shape, "sum", 2**40, weight=True, elem=TensorProto.DOUBLE,
                   target_elem=TensorProto.INT32)
    feeds = _feeds(shape, weight=True, dtype=np.float64)
    feeds["t"] = feeds["t"].astype(np.int32)
    _check(model, feeds)


def test_negative_targets_count_from_the_end():
    """As GatherElements in the ONNX function body onnxruntime runs."""
    shape = (4, 5, 3)
    _check(_model(NLL, shape, "none", weight=True), _feeds(shape, weight=True, low=-5))


def test_every_target_ignored_gives_nan_mean():
    shape = (2, 5)
    model = _model(SCE, shape, "mean", 1)
    feeds = {"x": RNG.standard_normal(shape).astype(np.float32), "t": np.ones(2, np.int64)}
    (got,) = bridge.compile_onnx(model, allow_fallback=False)(*feeds.values())
    assert np.isnan(got) and np.isnan(_ort(model, feeds)[0])


@pytest.mark.parametrize("op", [NLL, SCE])
def test_target_out_of_range_raises(op):
    shape = (3, 5)
    feeds = _feeds(shape, weight=True)
    feeds["t"][1] = 5
    model = _model(op, shape, "sum", -1, weight=True)
    with pytest.raises(IndexError):
        bridge.compile_onnx(model, allow_fallback=False)(*feeds.values())
    with pytest.raises(Exception):
        _ort(model, feeds)


def test_float16_stays_on_the_host():
    shape = (4, 5)
    model = _model(SCE, shape, "mean", 1, elem=TensorProto.FLOAT16)
    feeds = _feeds(shape, 1, dtype=np.float16)
    compiled = bridge.compile_onnx(model)
    np.testing.assert_allclose(compiled(*feeds.values())[0], _ort(model, feeds)[0],
                               rtol=1e-3)
    assert "SoftmaxCrossEntropyLoss over f16[4,5]" in compiled.explain()
