"""RotaryEmbedding, AffineGrid and the Blackman, Hamming and Hann windows: converted with
nothing on the host (slices, mul-adds and a concat; a constant base grid times theta^T,
one matmul; constants), and their numbers against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import bridge

RNG = np.random.default_rng(23)


def _run(node, feeds: dict, opset: int, inits=(), out_type=TensorProto.FLOAT):
    """(braze with allow_fallback=False, onnxruntime, the compiled graph's ops) on a
    one-node model whose graph inputs are `feeds`."""
    inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype),
                                            v.shape) for k, v in feeds.items()]
    g = helper.make_graph([node], "g", inputs,
                          [helper.make_tensor_value_info("y", out_type, None)], list(inits))
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m = bridge.compile_onnx(model, allow_fallback=False)
    got = m(*feeds.values())[0]
    ops = {n.op for n in list(m._specs.values())[-1].plan.graph.nodes}  # the one that ran
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    return got, want, ops


@pytest.mark.parametrize("rank", [3, 4])
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rotary_dim", [0, 4])
@pytest.mark.parametrize("positions", [True, False])
def test_rotary_embedding(rank, interleaved, rotary_dim, positions):
    """Halves or interleaved pairs, the whole head (0) or its first 4 channels (the rest
    passing through), 3-D [B, S, heads * D] with num_heads or 4-D [B, heads, S, D], and
    caches gathered at run-time position_ids or given per token."""
    b, heads, s, d = 2, 3, 5, 8
    half = (rotary_dim or d) // 2
    x = RNG.standard_normal((b, s, heads * d) if rank == 3 else (b, heads, s, d))
    cache = (16, half) if positions else (b, s, half)
    feeds = {"x": x.astype(np.float32),
             "cos": RNG.standard_normal(cache).astype(np.float32),
             "sin": RNG.standard_normal(cache).astype(np.float32)}
    if positions:
        feeds["pos"] = RNG.integers(0, 16, (b, s)).astype(np.int64)
    attrs = {"interleaved": interleaved, "rotary_embedding_dim": rotary_dim}
    if rank == 3:
        attrs["num_heads"] = heads
    node = helper.make_node("RotaryEmbedding", list(feeds), ["y"], **attrs)
    got, want, ops = _run(node, feeds, 23)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert "host" not in ops and ("gather" in ops) == positions
    if rotary_dim:  # the channels past the rotary dim are x's own
        tail = x.reshape(b, s, heads, d) if rank == 3 else x
        np.testing.assert_array_equal(got.reshape(tail.shape)[..., rotary_dim:],
                                      tail[..., rotary_dim:].astype(np.float32))


@pytest.mark.parametrize("size", [[2, 3, 4, 5], [2, 3, 3, 4, 5], [2, 1, 1, 3]])
@pytest.mark.parametrize("align_corners", [0, 1])
def test_affine_grid(size, align_corners):
    """2-d and 3-d, one row of pixels included (with align_corners onnxruntime puts it
    at 1), theta a run-time input."""
    r = len(size) - 2
    theta = RNG.standard_normal((size[0], r, r + 1)).astype(np.float32)
    node = helper.make_node("AffineGrid", ["theta", "size"], ["y"],
                            align_corners=align_corners)
    got, want, ops = _run(node, {"theta": theta}, 20,
                          [numpy_helper.from_array(np.array(size, np.int64), "size")])
    assert got.shape == tuple(size[:1] + size[2:] + [r])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert "matmul" in ops and "host" not in ops


@pytest.mark.parametrize("op", ["BlackmanWindow", "HammingWindow", "HannWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.DOUBLE])
def test_window(op, periodic, dtype):
    """The size a graph input (braze specializes on its value): a constant window."""
    node = helper.make_node(op, ["size"], ["y"], periodic=periodic, output_datatype=dtype)
    got, want, ops = _run(node, {"size": np.array(10, np.int64)}, 17, out_type=dtype)
    assert got.dtype == want.dtype and got.shape == (10,)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert ops <= {"const"}


def test_symmetric_window_of_one():
    """N - 1 = 0: a NaN, as onnxruntime gives."""
    node = helper.make_node("HannWindow", ["size"], ["y"], periodic=0)
    got, want, _ = _run(node, {"size": np.array(1, np.int64)}, 17)
    assert np.isnan(got).all() and np.isnan(want).all()
