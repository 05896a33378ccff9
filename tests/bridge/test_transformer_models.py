"""Whole transformer blocks through compile_onnx, at small sizes: what their kernels
become and their numbers against torch eager. GPT-2 (transformers, random config): the
tanh GELU (x ** 3 inside) on the c_fc GEMM's registers and the causal attention fused;
Swin's shifted-window attention (torchvision): every window's attention one kernel,
the roll and window partition/reverse as index arithmetic."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import pytest
import torch

import bridge


def _export(module, args, names) -> onnx.ModelProto:
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, f, dynamo=False, opset_version=17,
                          input_names=list(names))
    return onnx.load_from_string(f.getvalue())


def _kernels(cm) -> list:
    spec = next(iter(cm._specs.values()))
    (cg,) = [p.compiled for p in spec.parts if p.compiled is not None]
    return cg.kernels


def test_gpt2_block_gelu_in_the_gemm_and_attention_fused():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=64, n_head=4, n_positions=32,
                                     vocab_size=100, bos_token_id=0, eos_token_id=0,
                                     attn_implementation="eager",
                                     use_cache=False)

    class First(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = transformers.GPT2Model(config)

        def forward(self, ids, mask):
            return self.inner(input_ids=ids, attention_mask=mask).last_hidden_state

    ids = torch.randint(0, 100, (1, 24))
    mask = torch.ones(1, 24, dtype=torch.int64)
    module = First().eval()
    model = _export(module, (ids, mask), ["ids", "mask"])
    cm = bridge.compile_onnx(model, allow_fallback=False)
    got = np.asarray(cm(ids=ids.numpy(), mask=mask.numpy())[0])
    want = module(ids, mask).detach().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    ops = [[n.op for n in k.nodes] for k in _kernels(cm)]
    assert not any("pow" in k for k in ops), ops  # x ** 3 became multiplies
    gelu = [k for k in ops if "matmul" in k and "tanh" in k]
    assert len(gelu) == 1, ops  # the tanh GELU is the c_fc GEMM's epilogue
    assert sum("attention" in k for k in ops) == 1, ops


@pytest.mark.parametrize("shift", [0, 2])
def test_swin_window_attention_fused_without_copies(shift):
    from torchvision.models.swin_transformer import ShiftedWindowAttention
    torch.manual_seed(0)
    # 28 x 28 in 4 x 4 windows of 7 x 7: a mask per window when shifted
    block = ShiftedWindowAttention(32, [7, 7], [shift, shift], 2).eval()
    x = torch.randn(1, 28, 28, 32)
    model = _export(block, (x,), ["x"])
    cm = bridge.compile_onnx(model, allow_fallback=False)
    got = np.asarray(cm(x=x.numpy())[0])
    np.testing.assert_allclose(got, block(x).detach().numpy(), rtol=1e-4, atol=1e-5)
    ops = [[n.op for n in k.nodes] for k in _kernels(cm)]
    assert sum("attention" in k for k in ops) == 1, ops
    assert not any("reduce_max" in k or "exp" in k for k in ops), ops  # no softmax left
    # the qkv bias is the GEMM's epilogue, not added on every read of q, k and v
    (att,) = [k for k in ops if "attention" in k]
    assert "add" not in att, att


def test_swin_shifted_window_attention_through_torch_compile_has_no_gathers(tmp_path):
    """torch.compile: torch's roll reaches importers/fx_movement.py as roll (its core
    decomposition is an index_select: a gather per element), so the shifted block's
    kernels gather nothing but the relative-position bias inside the attention kernel."""
    from torchvision.models.swin_transformer import ShiftedWindowAttention
    torch.manual_seed(0)
    block = ShiftedWindowAttention(32, [7, 7], [3, 3], 2).eval()
    x = torch.randn(1, 28, 28, 32)
    c = torch.compile(block, backend="braze",
                      options={"strict": True, "dump_dir": str(tmp_path)})
    with torch.no_grad():
        torch.testing.assert_close(c(x), block(x), rtol=1e-4, atol=1e-5)
    (kernels,) = tmp_path.glob("*kernels.txt")
    lines = [ln for ln in kernels.read_text().splitlines() if ln.startswith("  kernel")]
    assert any("concat" in ln for ln in lines), lines  # the rolls
    assert not any("gather" in ln and "attention" not in ln for ln in lines), lines
