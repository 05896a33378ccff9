"""A dynamic sequence length (bridge/dynamic.py): lengths share power-of-two buckets, every
output matches onnxruntime (1, bucket sizes and lengths between), a model padding cannot
serve compiles exact shapes with the reason logged, and an artifact serves the lengths of
its buckets without compiling."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import bridge
from benchmarks.seqlen_sweep import encoder, export
from bridge.dynamic import bucket_of, symbolic_dims
from tests.tolerances import assert_close

D = 32
RNG = np.random.default_rng(0)


@pytest.fixture(scope="module", params=[False, True], ids=["bidirectional", "causal"])
def encoder_path(request, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("enc") / "enc.onnx")
    export(encoder(2, request.param, d=D, heads=4, feed_forward=64), path, d=D)
    return path


def _check(m, path, lengths):
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for n in lengths:
        x = RNG.standard_normal((1, n, D)).astype(np.float32)
        got = m(x)[0]
        assert got.shape == (1, n, D)
        assert_close(got, sess.run(None, {"x": x})[0])


def test_buckets():
    assert [bucket_of(n) for n in (1, 3, 4, 5, 8, 9, 300, 512)] == [4, 4, 4, 8, 8, 16, 512, 512]
    assert len({bucket_of(n) for n in range(1, 513)}) == 8


def test_symbolic_dims_name_the_dynamic_axes(encoder_path):
    assert symbolic_dims(onnx.load(encoder_path)) == {"seq": [("x", 1)]}


def test_lengths_share_buckets_and_match_onnxruntime(encoder_path):
    m = bridge.compile_onnx(encoder_path)  # dynamic="auto"
    lengths = [5, 1, 2, 3, 4, 7, 8, 9, 16, 17, 5]
    _check(m, encoder_path, lengths)
    # the first two lengths exactly; then the buckets 4, 8, 16, 32 (5 again: exact code)
    assert m.compiles == 6
    padded = [s for s in m.saved_specializations() if s.pad_plan is not None]
    assert sorted(s.pad_plan.padding.length for s in padded) == [4, 8, 16, 32]
    assert {tuple(s.pad_plan.padding.inputs.items()) for s in padded} == {(("x", (1,)),)}
    assert all(s.pad_plan.padding.outputs == [(1,)] for s in padded)


def test_two_lengths_keep_exact_code(encoder_path):
    m = bridge.compile_onnx(encoder_path)
    _check(m, encoder_path, [5, 9, 5, 9])
    assert m.compiles == 2
    assert all(s.pad_plan is None for s in m.saved_specializations())


def test_named_dim_buckets_from_the_first_call(encoder_path):
    m = bridge.compile_onnx(encoder_path, dynamic="seq")
    _check(m, encoder_path, [6, 1, 4, 8, 13, 32, 33])
    assert m.compiles == 5  # 4, 8, 16, 32, 64


def test_off_compiles_every_length(encoder_path):
    m = bridge.compile_onnx(encoder_path, dynamic="off")
    _check(m, encoder_path, [3, 5, 6])
    assert m.compiles == 3


def test_unknown_dim_name_is_an_error(encoder_path):
    with pytest.raises(bridge.BrazeError, match="names no symbolic input dim.*seq"):
        bridge.compile_onnx(encoder_path, dynamic="batch")


def test_artifact_serves_its_buckets_without_compiling(encoder_path, tmp_path, monkeypatch):
    m = bridge.compile_onnx(encoder_path, dynamic="seq")
    _check(m, encoder_path, [3, 7])  # buckets 4 and 8
    m.save(tmp_path / "m.braze")

    def no_compile(*a, **k):
        raise AssertionError("a loaded model compiled")

    monkeypatch.setattr("bridge.steps.Steps.compile", no_compile)
    loaded = bridge.load(tmp_path / "m.braze")
    assert sorted(s["x"][1] for s in loaded.saved_shapes) == [4, 8]
    _check(loaded, encoder_path, [1, 2, 3, 4, 5, 6, 7, 8])
    with pytest.raises(bridge.InputError, match="holds no code"):
        loaded(np.zeros((1, 9, D), np.float32))


def _mean_over_length() -> onnx.ModelProto:
    """ReduceMean over the symbolic axis: its 1/n depends on the length."""
    w = numpy_helper.from_array(RNG.standard_normal((D, D)).astype(np.float32), "w")
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]),
         helper.make_node("ReduceMean", ["h"], ["y"], axes=[1], keepdims=1)],
        "mean", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", D])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, D])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_refused_model_compiles_exact_shapes_with_a_reason(caplog, tmp_path):
    path = str(tmp_path / "mean.onnx")
    onnx.save(_mean_over_length(), path)
    m = bridge.compile_onnx(path, dynamic="seq")
    with caplog.at_level(logging.INFO, logger="braze"):
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        for n in (3, 4, 3):
            x = RNG.standard_normal((1, n, D)).astype(np.float32)
            assert_close(m(x)[0], sess.run(None, {"x": x})[0])
    assert m.compiles == 2  # 3 and 4 exactly, 3 again from its cache
    assert all(s.pad_plan is None for s in m.saved_specializations())
    # 1/n is a multiply at 4 (a power of two) and a divide at 3: not one graph
    assert "seq: lengths in the bucket of 4 compile exactly (padding refused: the passes " \
        "made a different graph" in caplog.text


# -- torch.compile: dynamo's dynamic graphs run in buckets (bridge/torch_dynamic.py) ------

def _torch_lengths(module, lengths, caplog, **compile_kw):
    import torch

    compiled = torch.compile(module, backend="braze", **compile_kw)
    with caplog.at_level(logging.INFO, logger="braze"), torch.no_grad():
        for n in lengths:
            x = torch.randn(1, n, D)
            got, want = compiled(x), module(x)
            assert got.shape == want.shape
            assert_close(got.numpy(), want.numpy())
    return [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_torch_dynamic_graph_compiles_per_bucket(causal, caplog):
    import torch._dynamo

    torch._dynamo.reset()
    module = encoder(2, causal, d=D, heads=4, feed_forward=64)
    lengths = [5, 1, 2, 3, 4, 6, 8, 9, 16, 17]
    messages = _torch_lengths(module, lengths, caplog)
    buckets = [m for m in messages if "for lengths up to" in m]
    # 5 and 1 are dynamo's static graphs; the dynamic graph from 2 on: buckets 4..32
    assert [m.rsplit(" ", 1)[1] for m in buckets] == ["4", "8", "16", "32"]
    assert not [m for m in messages if "refused" in m]


def test_torch_refused_length_compiles_exactly_with_a_reason(caplog):
    import torch
    import torch._dynamo

    class Mean(torch.nn.Module):  # the mean's 1/n changes with the length
        def forward(self, x):
            return torch.tanh(x).mean(dim=1)

    torch._dynamo.reset()
    messages = _torch_lengths(Mean(), [5, 6, 7, 9], caplog)
    assert any("length 6 compiles exactly: padding to 8 refused" in m for m in messages)


def test_hf_bert_with_attention_mask_and_pooler(tmp_path):
    """A tiny random BERT (transformers): token ids gathered from an embedding, a user
    attention mask expanded by an index gather, a [CLS] pooler without a length axis."""
    transformers = pytest.importorskip("transformers")
    import warnings

    import torch

    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=D, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=64)
    bert = transformers.BertModel(cfg).eval()

    class Outputs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, ids, mask):
            out = self.bert(input_ids=ids, attention_mask=mask)
            return out.last_hidden_state, out.pooler_output

    path = str(tmp_path / "bert.onnx")
    axes = {0: "batch", 1: "seq"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Outputs().eval(), (torch.ones(1, 7, dtype=torch.int64),) * 2, path,
                          input_names=["ids", "mask"], output_names=["last", "pooled"],
                          dynamic_axes={"ids": axes, "mask": axes, "last": axes,
                                        "pooled": {0: "batch"}},
                          opset_version=17, dynamo=False)
    m = bridge.compile_onnx(path, dynamic="seq")
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for n in (7, 1, 4, 12):
        ids = RNG.integers(0, 100, (1, n)).astype(np.int64)
        mask = np.ones((1, n), np.int64)
        mask[0, n // 2 + 1:] = RNG.integers(0, 2, n - n // 2 - 1)
        for got, want in zip(m(ids, mask), sess.run(None, {"ids": ids, "mask": mask})):
            assert_close(got, want)
    assert m.compiles == 3  # buckets 4, 8, 16
    assert all(s.pad_plan is not None for s in m.saved_specializations())


def test_cli_compiles_every_bucket_into_one_artifact(encoder_path, tmp_path, capsys):
    from bridge.cli import main

    out = tmp_path / "m.braze"
    assert main(["compile", encoder_path, "-o", str(out), "--shape", f"x=1,20,{D}",
                 "--dynamic", "seq"]) == 0
    assert "seq: buckets 4, 8, 16, 32" in capsys.readouterr().out
    loaded = bridge.load(out)
    assert sorted(s["x"][1] for s in loaded.saved_shapes) == [4, 8, 16, 32]
    _check(loaded, encoder_path, [1, 4, 5, 20, 32])
    with pytest.raises(bridge.BrazeError, match="no symbolic input dim"):
        bridge.compile_onnx(encoder_path).compile_lengths("batch", {"x": (1, 8, D)})


def test_recurrence_is_refused_and_compiles_exact_lengths(tmp_path, caplog):
    """An LSTM over the length (compiled: one projection GEMM over the T*B rows, then the
    recurrence) is refused: its projection merges the length with the batch and the
    recurrence would run over padded steps, so every length compiles exactly."""
    import warnings

    import torch

    class Lstm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(D, D, batch_first=True)

        def forward(self, x):
            return self.lstm(x)[0]

    path = str(tmp_path / "lstm.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Lstm().eval(), (torch.randn(1, 7, D),), path, input_names=["x"],
                          output_names=["y"], dynamic_axes={"x": {1: "seq"}, "y": {1: "seq"}},
                          opset_version=17, dynamo=False)
    m = bridge.compile_onnx(path, dynamic="seq")
    with caplog.at_level(logging.INFO, logger="braze"):
        _check(m, path, [7, 3, 12])
    assert m.compiles == 3 and all(s.pad_plan is None for s in m.saved_specializations())
    assert "compile exactly (padding refused" in caplog.text
    assert "merged with another axis" in caplog.text
