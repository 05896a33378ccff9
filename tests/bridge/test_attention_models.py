"""Attention through both front ends: which form each model reaches braze in, that it
becomes one attention kernel, and its numbers against onnxruntime / torch eager.

Forms: the decomposed MatMul-Mul-Add-Softmax-MatMul of the TorchScript ONNX exporter
(SDPA and nn.TransformerEncoder), the ONNX Attention op (opset 23), and torch's SDPA
under torch.compile (aten._scaled_dot_product_flash_attention_for_cpu)."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

import bridge


def _export(module, args, opset=17) -> onnx.ModelProto:
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, f, dynamo=False, opset_version=opset,
                          input_names=[f"in{i}" for i in range(len(args))])
    return onnx.load_from_string(f.getvalue())


def _ort(model, feeds: dict) -> list:
    return ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)


class _Sdpa(torch.nn.Module):
    def __init__(self, causal: bool, masked: bool):
        super().__init__()
        self.causal, self.masked = causal, masked

    def forward(self, q, k, v, m):
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=m if self.masked else None, is_causal=self.causal)


def _qkvm(t=33, d=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 4, t, d, generator=g) for _ in range(3)] + [
        torch.randn(t, t, generator=g)]


@pytest.mark.parametrize("causal,masked", [(False, False), (True, False), (False, True)])
def test_exported_sdpa_is_one_attention_kernel(causal, masked):
    args = _qkvm()
    model = _export(_Sdpa(causal, masked), tuple(args))
    cm = bridge.compile_onnx(model, allow_fallback=False)
    text = cm.explain()
    assert "cluster 0 (compiled, 1 nodes" in text and ": attention" in text
    feeds = {f"in{i}": a.numpy() for i, a in enumerate(args)
             if f"in{i}" in [x.name for x in model.graph.input]}
    got, = cm(**feeds)
    want, = _ort(model, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)


def _attention_op(three_d: bool, causal: bool, mask: str | None, t=7, d=32, h=2):
    shape = [1, t, h * d] if three_d else [1, h, t, d]
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in "QKV"]
    names = ["Q", "K", "V"]
    if mask:
        kind = TensorProto.BOOL if mask == "bool" else TensorProto.FLOAT
        ins.append(helper.make_tensor_value_info("M", kind, [t, t]))
        names.append("M")
    attrs = {"is_causal": int(causal)}
    if three_d:
        attrs.update(q_num_heads=h, kv_num_heads=h)
    node = helper.make_node("Attention", names, ["Y"], **attrs)
    out = helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)
    return helper.make_model(helper.make_graph([node], "attn", ins, [out]),
                             opset_imports=[helper.make_opsetid("", 23)])


@pytest.mark.parametrize("three_d,causal,mask", [(False, False, None), (False, True, None),
                                                 (True, False, "f32"), (False, False, "bool")])
def test_onnx_attention_op(three_d, causal, mask):
    model = _attention_op(three_d, causal, mask)
    rng = np.random.default_rng(1)
    shape = (1, 7, 64) if three_d else (1, 2, 7, 32)
    feeds = {n: rng.standard_normal(shape).astype(np.float32) for n in "QKV"}
    if mask == "bool":
        feeds["M"] = np.tril(np.ones((7, 7), bool)) | (rng.random((7, 7)) < 0.5)
    elif mask:
        feeds["M"] = rng.standard_normal((7, 7)).astype(np.float32)
    cm = bridge.compile_onnx(model, allow_fallback=False)
    assert ": attention" in cm.explain().replace(", attention", ": attention")
    got, = cm(**feeds)
    want, = _ort(model, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("causal,window,softcap,short_mask", [
    (True, None, 0.0, False),  # a decoder step with its KV cache: causal bottom-right
    (False, (2, 0), 0.0, True),  # a sliding window; a mask over fewer keys (padded)
    (True, None, 30.0, False),  # Gemma-2's softcap: written out as matmuls and a softmax
])
def test_onnx_attention_op_with_a_kv_cache(causal, window, softcap, short_mask):
    """past_key/past_value ahead of K and V, present_key/present_value as outputs, the
    attention over both, compiled whole and matching onnxruntime."""
    model = _attention_op(False, causal, "f32" if short_mask else None)
    node = model.graph.node[0]
    while len(node.input) < 4:
        node.input.append("")
    node.input.extend(["PK", "PV"])
    node.output.extend(["present_k", "present_v"])
    if window:  # (opset 25 on)
        node.attribute.extend([helper.make_attribute("left_window_size", window[0]),
                               helper.make_attribute("right_window_size", window[1])])
        model.opset_import[0].version = 25
    if softcap:
        node.attribute.append(helper.make_attribute("softcap", softcap))
    model.graph.input.extend([helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 2, 3, 32])
                              for n in ("PK", "PV")])
    model.graph.output.extend([helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                               for n in ("present_k", "present_v")])
    if short_mask:  # 7 queries, 10 keys (3 past), the mask over the first 8 keys only
        model.graph.input[3].type.tensor_type.shape.dim[1].dim_value = 8
    rng = np.random.default_rng(2)
    feeds = {n: rng.standard_normal((1, 2, 7, 32)).astype(np.float32) for n in "QKV"}
    feeds.update({n: rng.standard_normal((1, 2, 3, 32)).astype(np.float32)
                  for n in ("PK", "PV")})
    if short_mask:
        feeds["M"] = rng.standard_normal((7, 8)).astype(np.float32)
    cm = bridge.compile_onnx(model, allow_fallback=False)
    got, want = cm(**feeds), _ort(model, feeds)
    assert len(got) == 3
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("causal,masked", [(False, False), (True, False), (False, True)])
def test_torch_compile_sdpa_is_one_attention_kernel(causal, masked, tmp_path):
    torch._dynamo.reset()
    mod = _Sdpa(causal, masked)
    args = _qkvm(t=20, seed=2)
    compiled = torch.compile(mod, backend="braze", options={
        "allow_fallback": False, "strict": True, "dump_dir": str(tmp_path)})
    got = compiled(*args)
    clusters = "".join(p.read_text() for p in tmp_path.glob("*clusters*"))
    assert "(compiled, 1 nodes" in clusters and "attention" in clusters
    torch.testing.assert_close(got, mod(*args), rtol=1e-5, atol=2e-6)


def test_transformer_encoder_attention_is_fused():
    """nn.TransformerEncoder (fast path off: training-mode flag cleared by eval and
    enable_nested_tensor=False; the exporter decomposes its SDPA): every layer's
    attention becomes one attention node."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(1, 24, 64)
    model = _export(enc, (x,))
    cm = bridge.compile_onnx(model, allow_fallback=False)
    assert "attention x2" in cm.explain()
    got, = cm(in0=x.numpy())
    want, = _ort(model, {"in0": x.numpy()})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


class _WindowAttention(torch.nn.Module):
    """Swin's attention written out: 4-d q @ k^T (aten: view, bmm, view), scale, an
    additive per-head bias, softmax, @ v."""

    def __init__(self, dim=32, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.bias = torch.nn.Parameter(torch.randn(1, heads, 16, 16))

    def forward(self, x):
        b, t, c = x.shape
        qkv = self.qkv(x).reshape(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        s = (q * (c // self.heads) ** -0.5) @ k.transpose(-2, -1) + self.bias
        return (s.softmax(-1) @ v).transpose(1, 2).reshape(b, t, c)


def _clusters_text(tmp_path) -> str:
    return "".join(p.read_text() for p in tmp_path.glob("*clusters*"))


def test_torch_compile_written_out_attention_is_fused_as_from_onnx(tmp_path):
    """The fx import of a batched q @ k^T (bmm between batch-merging views) reaches the
    attention pass as the ONNX import does: one attention node each."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    mod = _WindowAttention().eval()
    x = torch.randn(4, 16, 32)
    cm = bridge.compile_onnx(_export(mod, (x,)), allow_fallback=False)
    assert "attention" in cm.explain()
    compiled = torch.compile(mod, backend="braze", options={
        "allow_fallback": False, "strict": True, "dump_dir": str(tmp_path)})
    with torch.no_grad():
        got = compiled(x)
        want = mod(x)
    text = _clusters_text(tmp_path)
    assert "attention" in text and "reduce_max" not in text
    # q's scale (applied before aten's batch-merging view) is the node's scale
    opt = "".join(p.read_text() for p in tmp_path.glob("*opt.ir"))
    assert "scale=0.25" in opt and " mul(" not in opt
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-6)


def _fast_path_compiled(mod, x, tmp_path):
    """mod(x) under torch.compile(backend="braze") with torch's MHA fast path on: the
    result, eager's, and the clusters dumped."""
    torch._dynamo.reset()
    before = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(True)
    try:
        compiled = torch.compile(mod, backend="braze", options={
            "allow_fallback": False, "strict": True, "dump_dir": str(tmp_path)})
        with torch.no_grad():
            return compiled(x), mod(x), _clusters_text(tmp_path)
    finally:
        torch.backends.mha.set_fastpath_enabled(before)


@pytest.mark.parametrize("activation,norm_first", [("relu", False), ("gelu", True)])
def test_fast_path_encoder_layers_are_written_out(activation, norm_first, tmp_path):
    """aten._transformer_encoder_layer_fwd (the eval fast path) becomes matmuls, layer
    norms and one attention node per layer, as the ONNX export of the same model does
    (no host node: allow_fallback=False)."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True,
                                             activation=activation, norm_first=norm_first)
    enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(2, 24, 64)
    got, want, clusters = _fast_path_compiled(enc, x, tmp_path)
    import_ir = "".join(p.read_text() for p in tmp_path.glob("*import.ir"))
    assert "_transformer_encoder_layer_fwd" in import_ir  # the fast path was taken
    assert "host" not in clusters and "attention x2" in clusters
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    # no more kernels than the ONNX export's (which torch writes with the fast path off,
    # and with two more transposes: it runs the layers sequence-first at batch > 1)
    from bridge.onnx_api import explain_onnx

    torch_kernels = "".join(p.read_text() for p in tmp_path.glob("*kernels.txt"))
    onnx_kernels = explain_onnx(_export(enc, (x,)), {"in0": tuple(x.shape)}, kernels=True)
    assert torch_kernels.count("  kernel ") <= onnx_kernels.count("  kernel ")
    assert torch_kernels.count("attention [") == onnx_kernels.count("attention [") == 2



def test_onnx_attention_op_with_a_static_cache_length_per_batch_row():
    """nonpad_kv_seqlen (opset 24): batch row b holds lengths[b] valid keys of a static
    cache; the causal frontier sits at lengths[b] - T. A bias built from the lengths at
    run time, compiled whole, matching onnxruntime for two different length vectors."""
    shape = [2, 2, 3, 16]
    kv = [2, 2, 8, 16]
    ins = [helper.make_tensor_value_info("Q", TensorProto.FLOAT, shape)] + [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, kv) for n in "KV"] + [
        helper.make_tensor_value_info("L", TensorProto.INT64, [2])]
    node = helper.make_node("Attention", ["Q", "K", "V", "", "", "", "L"], ["Y"],
                            is_causal=1)
    model = helper.make_model(helper.make_graph(
        [node], "attn", ins, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)]),
        opset_imports=[helper.make_opsetid("", 24)])
    rng = np.random.default_rng(3)
    cm = bridge.compile_onnx(model, allow_fallback=False)
    for lengths in ([5, 8], [3, 6]):
        feeds = {"Q": rng.standard_normal(shape).astype(np.float32),
                 "K": rng.standard_normal(kv).astype(np.float32),
                 "V": rng.standard_normal(kv).astype(np.float32),
                 "L": np.array(lengths, np.int64)}
        got, = cm(**feeds)
        want, = _ort(model, feeds)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)
