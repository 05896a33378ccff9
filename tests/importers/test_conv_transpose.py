"""Transposed convolution (importers/transposed.py) through both front ends: the
non-overlapping case is one 1x1 conv and a depth-to-space, the rest a direct conv over
a zero-spread input; numbers against torch's conv_transpose in float64, compiled with
nothing on the host."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import bridge

RNG = np.random.default_rng(0)

# (x shape, out channels, kernel, stride, padding, output padding, dilation, groups, bias)
CASES = [
    ((1, 8, 5, 6), 4, (2, 2), (2, 2), (0, 0), (0, 0), (1, 1), 1, True),  # U-Net's
    ((2, 6, 4, 4), 6, (2, 2), (2, 2), (0, 0), (0, 0), (1, 1), 3, False),
    ((1, 4, 5, 5), 3, (3, 3), (2, 2), (1, 1), (1, 1), (1, 1), 1, True),
    ((1, 4, 6, 5), 8, (4, 4), (2, 2), (1, 1), (0, 0), (1, 1), 2, True),  # DCGAN's
    ((1, 3, 5, 7), 5, (3, 2), (1, 3), (0, 1), (0, 2), (2, 1), 1, True),
    ((1, 4, 7), 6, (3,), (2,), (1,), (1,), (1,), 2, True),  # 1-d
    ((1, 4, 3, 4, 4), 4, (2, 2, 2), (2, 2, 2), (0, 0, 0), (0, 0, 0), (1, 1, 1), 1, True),
    ((1, 2, 3, 4, 3), 3, (3, 3, 3), (1, 2, 2), (1, 1, 1), (0, 1, 0), (1, 1, 1), 1, False),
]


def _torch_reference(x, w, b, stride, padding, out_pad, dil, groups):
    f = {3: torch.nn.functional.conv_transpose1d, 4: torch.nn.functional.conv_transpose2d,
         5: torch.nn.functional.conv_transpose3d}[x.ndim]
    t = lambda a: None if a is None else torch.from_numpy(a).double()  # noqa: E731
    return f(t(x), t(w), t(b), stride, padding, out_pad, groups, dil).numpy()


def _data(x_shape, cout, k, groups, bias):
    x = RNG.standard_normal(x_shape).astype(np.float32)
    w = RNG.standard_normal((x_shape[1], cout // groups) + k).astype(np.float32)
    b = RNG.standard_normal(cout).astype(np.float32) if bias else None
    return x, w, b


@pytest.mark.parametrize("x_shape,cout,k,stride,pad,out_pad,dil,groups,bias", CASES)
def test_onnx_conv_transpose_matches_torch(x_shape, cout, k, stride, pad, out_pad, dil,
                                           groups, bias):
    x, w, b = _data(x_shape, cout, k, groups, bias)
    inits = [numpy_helper.from_array(w, "w")] + ([numpy_helper.from_array(b, "b")] if bias
                                                 else [])
    node = helper.make_node("ConvTranspose", ["x", "w"] + (["b"] if bias else []), ["y"],
                            strides=list(stride), pads=list(pad) * 2,
                            output_padding=list(out_pad), dilations=list(dil), group=groups)
    model = helper.make_model(helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits),
        opset_imports=[helper.make_opsetid("", 17)])
    got = bridge.compile_onnx(model, allow_fallback=False)(x)[0]
    want = _torch_reference(x, w, b, stride, pad, out_pad, dil, groups)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_onnx_output_shape_and_auto_pad():
    x, w, b = _data((1, 3, 4, 5), 2, (3, 3), 1, True)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    for attrs, pads in ((dict(output_shape=[10, 12]), (1, 1, 0, 1)),
                        (dict(auto_pad="SAME_UPPER"), (0, 0, 1, 1))):
        node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2],
                                **attrs)
        model = helper.make_model(helper.make_graph(
            [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 5])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits),
            opset_imports=[helper.make_opsetid("", 17)])
        import onnxruntime as ort
        want = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        got = bridge.compile_onnx(model, allow_fallback=False)(x)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_the_non_overlapping_case_is_one_1x1_conv():
    x, w, b = _data((1, 8, 5, 6), 4, (2, 2), 1, True)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2])
    model = helper.make_model(helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 5, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]),
        opset_imports=[helper.make_opsetid("", 17)])
    m = bridge.compile_onnx(model, allow_fallback=False)
    m(x)
    graph = next(iter(m._specs.values())).plan.graph
    convs = [n for n in graph.nodes if n.op == "conv"]
    assert len(convs) == 1 and convs[0].inputs[1].shape[2:] == (1, 1)
    assert convs[0].inputs[1].shape[0] == 4 * 4  # Cout x the 2x2 taps


class _Decoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.up2 = torch.nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1)

    def forward(self, x):
        return self.up2(torch.relu(self.up(x)))


def test_torch_compile_runs_conv_transpose_compiled():
    torch.manual_seed(0)
    model = _Decoder().eval()
    x = torch.randn(1, 8, 5, 6)
    with torch.no_grad():
        want = model(x)
        got = torch.compile(model, backend="braze",
                            options={"allow_fallback": False, "strict": True})(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
