"""torch convolutions whose weight is a run-time value (importers/fx_windows.py through
importers/runtime_conv.py, the ONNX importer's im2col and matmul): no conv node and
nothing on torch, numbers against eager; a frozen weight keeps the packed conv node."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from importers.fx import import_fx

OPTS = {"allow_fallback": False, "strict": True}


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="braze", dynamic=False, fullgraph=True, options=OPTS)


def _ops(fn, args, frozen=None) -> list[str]:
    gm = make_fx(fn)(*args)
    return [n.op for n in import_fx(gm, list(args), frozen=frozen).graph.nodes]


# (conv, x shape, weight shape, bias, kwargs)
CONV_CASES = [
    (F.conv2d, (2, 6, 9, 8), (4, 6, 3, 3), True, dict(stride=(2, 1), padding=1)),
    (F.conv2d, (1, 4, 10, 9), (6, 2, 3, 2), True, dict(dilation=(2, 3), groups=2, padding=1)),
    (F.conv2d, (1, 6, 7, 7), (6, 1, 3, 3), False, dict(groups=6, padding=1)),  # depthwise
    (F.conv2d, (6, 7, 7), (4, 6, 3, 3), True, dict(padding=2)),  # unbatched
    (F.conv1d, (2, 3, 11), (4, 3, 3), True, dict(stride=2, padding=1, dilation=2)),
    (F.conv3d, (1, 2, 5, 6, 4), (3, 2, 2, 3, 2), True, dict(padding=1)),
    (F.conv_transpose2d, (2, 4, 5, 6), (4, 3, 3, 3), True,
     dict(stride=2, padding=1, output_padding=1)),
    (F.conv_transpose2d, (1, 4, 5, 5), (4, 2, 3, 2), True, dict(groups=2, dilation=(1, 2))),
    (F.conv_transpose2d, (1, 3, 4, 5), (3, 5, 2, 2), True, dict(stride=2)),  # depth-to-space
    (F.conv_transpose1d, (2, 3, 7), (3, 2, 3), False, dict(stride=3, padding=2)),
    (F.conv_transpose3d, (1, 2, 3, 4, 3), (2, 2, 2, 3, 2), True, dict(stride=(1, 2, 1))),
]


def _data(x_shape, w_shape, bias, transposed, groups):
    torch.manual_seed(0)
    outs = w_shape[1] * groups if transposed else w_shape[0]
    args = [torch.randn(x_shape), torch.randn(w_shape)]
    return args + ([torch.randn(outs)] if bias else [])


@pytest.mark.parametrize("conv,x_shape,w_shape,bias,kw", CONV_CASES)
def test_runtime_weight_compiles_and_matches_eager(conv, x_shape, w_shape, bias, kw):
    transposed = conv in (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)
    args = _data(x_shape, w_shape, bias, transposed, kw.get("groups", 1))

    def fn(x, w, *b):
        return conv(x, w, *b, **kw)

    torch.testing.assert_close(_compiled(fn)(*args), fn(*args), rtol=1e-4, atol=1e-4)
    ops = _ops(fn, args)
    assert "conv" not in ops and "host" not in ops and "matmul" in ops


def test_runtime_bias_on_a_frozen_weight_is_added_after_the_packed_conv():
    x, w, b = torch.randn(1, 3, 6, 6), torch.randn(4, 3, 3, 3), torch.randn(4)
    ops = _ops(lambda w, x, b: F.conv2d(x, w, b), [w, x, b], frozen={0: w.numpy()})
    assert "conv" in ops and "matmul" not in ops and "add" in ops


def test_frozen_resnet_block_keeps_the_packed_conv():
    """Parameters (make_fx's get_attr constants, or frozen inputs) stay the IR's conv."""
    block = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1, bias=False),
                                torch.nn.BatchNorm2d(8), torch.nn.ReLU()).eval()
    x = torch.randn(1, 3, 8, 8)
    ops = _ops(block, [x])
    assert ops.count("conv") == 1 and "matmul" not in ops
    w = torch.randn(8, 3, 3, 3)
    ops = _ops(lambda w, x: F.conv2d(x, w, padding=1), [w, x], frozen={0: w.numpy()})
    assert ops.count("conv") == 1 and "matmul" not in ops


def test_frozen_conv_transpose_keeps_the_direct_conv():
    w, x = torch.randn(4, 3, 3, 3), torch.randn(1, 4, 5, 5)
    ops = _ops(lambda w, x: F.conv_transpose2d(x, w, stride=2), [w, x],
               frozen={0: w.numpy()})
    assert "conv" in ops and "matmul" not in ops


def test_float64_runtime_weight():
    x, w = torch.randn(1, 4, 6, 6, dtype=torch.float64), torch.randn(6, 2, 3, 3,
                                                                      dtype=torch.float64)

    def fn(x, w):
        return F.conv2d(x, w, groups=2, padding=1, stride=(2, 1))

    torch.testing.assert_close(_compiled(fn)(x, w), fn(x, w), rtol=1e-10, atol=1e-10)
