"""LSTM, GRU and RNN through both front ends: ONNX's ops (bridge.compile_onnx) against
onnxruntime, torch's nn.LSTM / nn.GRU / nn.RNN under torch.compile (dynamo's allow_rnn)
against eager torch; compiled without host nodes, the input projection one GEMM."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import bridge

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def _model(op, direction="forward", *, t=6, batch=3, width=5, hid=7, layout=0, lens=False,
           initial=False, bias=True, clip=None, lbr=None, peep=False, const_weights=True,
           activations=None, seed=0):
    """(model, feeds) of one ONNX recurrent node, all its outputs requested."""
    rng = np.random.default_rng(seed)
    dirs = 2 if direction == "bidirectional" else 1
    gh = GATES[op] * hid
    f32 = lambda *s: (rng.standard_normal(s) * 0.5).astype(np.float32)  # noqa: E731
    x = f32(batch, t, width) if layout else f32(t, batch, width)
    # R scaled by 1/sqrt(H): a contracting recurrence (a chaotic one amplifies float32
    # rounding over the steps, whoever computes it)
    arrays = {"X": x, "W": f32(dirs, gh, width), "R": f32(dirs, gh, hid) * hid ** -0.5}
    names = ["X", "W", "R", "", "", "", "", ""]
    if bias:
        arrays["B"], names[3] = f32(dirs, 2 * gh), "B"
    if lens:
        arrays["L"], names[4] = rng.integers(1, t + 1, batch).astype(np.int32), "L"
    state = (batch, dirs, hid) if layout else (dirs, batch, hid)
    if initial:
        arrays["H0"], names[5] = f32(*state), "H0"
        if op == "LSTM":
            arrays["C0"], names[6] = f32(*state), "C0"
    if peep:
        arrays["P"], names[7] = f32(dirs, 3 * hid), "P"
    while names[-1] == "":
        names.pop()
    outs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    attrs = {"hidden_size": hid, "direction": direction}
    if layout:
        attrs["layout"] = 1
    if clip is not None:
        attrs["clip"] = clip
    if lbr is not None:
        attrs["linear_before_reset"] = lbr
    if activations is not None:
        attrs["activations"] = activations
    node = helper.make_node(op, names, outs, **attrs)
    consts = {"W", "R", "B", "P"} if const_weights else set()
    kind = {"L": TensorProto.INT32}
    inputs = [helper.make_tensor_value_info(n, kind.get(n, TensorProto.FLOAT), a.shape)
              for n, a in arrays.items() if n not in consts]
    inits = [numpy_helper.from_array(a, n) for n, a in arrays.items() if n in consts]
    outputs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs]
    graph = helper.make_graph([node], "rnn", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    feeds = {n: a for n, a in arrays.items() if n not in consts}
    return model, feeds


def _op_counts(text: str) -> dict:
    """op -> count over the compiled clusters of an explain() or clusters dump text
    ("cluster 0 (compiled, ...): matmul x2, add, recurrence x2")."""
    counts: dict = {}
    for line in text.splitlines():
        if "(compiled" not in line or "): " not in line:
            continue
        for item in line.split("): ", 1)[1].split(", "):
            op, _, n = item.strip().partition(" x")
            counts[op] = counts.get(op, 0) + (int(n) if n.isdigit() else 1)
    return counts


def _ort(model, feeds) -> list:
    """onnxruntime's outputs; a layout-1 model runs as its layout-0 twin (onnxruntime
    implements layout 0 only), inputs and outputs transposed."""
    node = model.graph.node[0]
    layout = next((a.i for a in node.attribute if a.name == "layout"), 0)
    if layout:
        model = onnx.ModelProto.FromString(model.SerializeToString())
        node = model.graph.node[0]
        node.attribute.remove(next(a for a in node.attribute if a.name == "layout"))
        feeds = {n: (a.transpose(1, 0, 2) if n in ("X", "H0", "C0") else a)
                 for n, a in feeds.items()}
        for v in model.graph.input:
            if v.name in ("X", "H0", "C0"):
                dims = v.type.tensor_type.shape.dim
                dims[0].dim_value, dims[1].dim_value = dims[1].dim_value, dims[0].dim_value
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    outs = sess.run(None, feeds)
    if layout:
        outs = [outs[0].transpose(2, 0, 1, 3)] + [o.transpose(1, 0, 2) for o in outs[1:]]
    return outs


ONNX_CASES = [(op, d, {}) for op in GATES for d in ("forward", "reverse", "bidirectional")] + [
    ("LSTM", "bidirectional", {"lens": True, "initial": True, "batch": 13}),
    ("LSTM", "forward", {"peep": True, "initial": True, "clip": 0.3}),
    ("LSTM", "reverse", {"layout": 1, "lens": True, "initial": True, "peep": True}),
    ("LSTM", "forward", {"const_weights": False, "bias": False}),
    ("GRU", "bidirectional", {"lbr": 1, "lens": True, "initial": True}),
    ("GRU", "reverse", {"lbr": 0, "clip": 0.2, "hid": 33}),
    ("GRU", "forward", {"lbr": 1, "layout": 1, "const_weights": False}),
    ("GRU", "bidirectional", {"lbr": 0, "layout": 1, "lens": True, "batch": 2}),
    ("RNN", "bidirectional", {"lens": True, "initial": True, "clip": 0.4, "layout": 1}),
    ("RNN", "forward", {"batch": 1, "t": 40, "hid": 64, "width": 32}),
]


@pytest.mark.parametrize("op,direction,kw", ONNX_CASES)
def test_onnx_op_matches_onnxruntime(op, direction, kw):
    model, feeds = _model(op, direction, **kw)
    cm = bridge.compile_onnx(model, allow_fallback=False)
    got = cm(**feeds)
    for g, w in zip(got, _ort(model, feeds)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_onnx_op_is_one_gemm_and_one_recurrence():
    model, feeds = _model("LSTM", "bidirectional", t=16, batch=2, hid=32, width=24)
    cm = bridge.compile_onnx(model, allow_fallback=False)
    text = cm.explain()
    counts = _op_counts(text)
    assert counts["recurrence"] == 1 and counts["matmul"] == 1 and "host" not in text
    spec = next(iter(cm._specs.values())) if cm._specs else None
    if spec is None:
        cm(**feeds)
        spec = next(iter(cm._specs.values()))
    [cg] = [p.compiled for p in spec.parts if p.compiled is not None]
    impls = [k.impl.name for k in cg.kernels if k.impl is not None]
    assert impls == ["gemm", "recurrence"], impls
    # the recurrence reads the GEMM's result in place (no copy kernel between them)
    assert [k.impl.name if k.impl else k.kind for k in cg.kernels][:2] == impls


@pytest.mark.parametrize("kw,reason", [
    ({"op": "GRU", "activations": ["Sigmoid", "Relu"]}, "default gates"),
    ({"op": "RNN", "activations": ["Relu"]}, "default gates")])
def test_other_activations_run_on_the_host_with_a_reason(kw, reason):
    model, feeds = _model(**kw)
    cm = bridge.compile_onnx(model)
    assert reason in cm.explain()
    for g, w in zip(cm(**feeds), _ort(model, feeds)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def _torch_case(kind, layers, bidirectional, batch_first, states, bias=True):
    torch.manual_seed(layers * 7 + bidirectional)
    m = getattr(torch.nn, kind)(6, 12, num_layers=layers, bidirectional=bidirectional,
                                batch_first=batch_first, bias=bias).eval()
    x = torch.randn(3, 5, 6)
    args = [x]
    if states:
        h = torch.randn(layers * (1 + bidirectional), 3 if batch_first else 5, 12)
        if batch_first:
            args.append((h, torch.randn_like(h)) if kind == "LSTM" else h)
        else:
            x = torch.randn(5, 3, 6)
            h = torch.randn(layers * (1 + bidirectional), 3, 12)
            args = [x, (h, torch.randn_like(h)) if kind == "LSTM" else h]
    return m, args


TORCH_CASES = [("LSTM", 1, False, False, False), ("LSTM", 2, True, True, True),
               ("GRU", 2, False, True, False), ("GRU", 1, True, False, True),
               ("RNN", 2, True, False, False)]


@pytest.mark.parametrize("kind,layers,bidirectional,batch_first,states", TORCH_CASES)
@torch._dynamo.config.patch(allow_rnn=True)
def test_torch_rnn_modules_compile(kind, layers, bidirectional, batch_first, states,
                                   tmp_path):
    torch._dynamo.reset()
    m, args = _torch_case(kind, layers, bidirectional, batch_first, states)
    compiled = torch.compile(m, backend="braze", options={
        "allow_fallback": False, "strict": True, "dump_dir": str(tmp_path)})
    with torch.no_grad():
        got, want = compiled(*args), m(*args)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    clusters = "".join(p.read_text() for p in tmp_path.glob("*clusters*"))
    counts = _op_counts(clusters)
    assert counts["recurrence"] == layers and counts["matmul"] == layers, clusters


@torch._dynamo.config.patch(allow_rnn=True)
def test_torch_gru_without_bias():
    torch._dynamo.reset()
    m, args = _torch_case("GRU", 1, False, True, False, bias=False)
    compiled = torch.compile(m, backend="braze", options={"allow_fallback": False})
    with torch.no_grad():
        torch.testing.assert_close(compiled(*args), m(*args), rtol=1e-5, atol=1e-5)


@torch._dynamo.config.patch(allow_rnn=True)
def test_torch_lstm_with_projections_runs_on_torch(tmp_path):
    """proj_size adds weights the recurrence does not take: the op runs on torch (its
    braze:: wrapper calls torch.lstm), with the reason in the dump."""
    torch._dynamo.reset()
    m = torch.nn.LSTM(6, 12, proj_size=4).eval()
    x = torch.randn(5, 2, 6)
    compiled = torch.compile(m, backend="braze", options={"dump_dir": str(tmp_path)})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), m(x), rtol=1e-5, atol=1e-6)
    dumped = "".join(p.read_text() for p in tmp_path.iterdir() if p.is_file())
    assert "proj_size" in dumped


@pytest.mark.parametrize("op,direction,kw", [
    ("LSTM", "bidirectional", {"initial": True, "peep": True}),
    ("GRU", "forward", {"lbr": 1, "lens": True}), ("GRU", "reverse", {"lbr": 0}),
    ("RNN", "forward", {"bias": False})])
def test_optimize_writes_the_recurrent_op_back(op, direction, kw):
    """`braze optimize` exports a recurrence whose projection has constant weights as the
    ONNX op on X again (its matmul and bias absorbed): no MatMul, same numbers."""
    from bridge.onnx_optimize import optimize_model

    model, feeds = _model(op, direction, **kw)
    shapes = {n: a.shape for n, a in feeds.items()}
    out = optimize_model(model, shapes)
    ops = [n.op_type for n in out.graph.node]
    assert ops.count(op) == 1 and "MatMul" not in ops, ops
    sess = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    for g, w in zip(sess.run(None, feeds), _ort(model, feeds)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def _lstm_with_lengths(hidden: int = 4, width: int = 3, steps: int = 5, batch: int = 2):
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((1, 4 * hidden, width)).astype(np.float32),
                                "W")
    r = numpy_helper.from_array(rng.standard_normal((1, 4 * hidden, hidden)).astype(np.float32),
                                "R")
    node = helper.make_node("LSTM", ["x", "W", "R", "", "L"], ["y", "yh"], hidden_size=hidden,
                            name="lstm")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, batch, width]),
                      helper.make_tensor_value_info("L", TensorProto.INT32, [batch])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("yh", TensorProto.FLOAT, None)], [w, r])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_sequence_lengths_out_of_range_raise_as_onnxruntime_refuses_them():
    """sequence_lens given at run time: lengths in [0, T] equal onnxruntime; a length
    outside (onnxruntime: InvalidArgument) raises InputError naming the node, never a
    clamped answer."""
    model = _lstm_with_lengths()
    x = np.random.default_rng(4).standard_normal((5, 2, 3)).astype(np.float32)
    m = bridge.compile_onnx(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for lens in ([3, 5], [0, 5]):
        lens = np.array(lens, np.int32)
        for got, want in zip(m(x, lens), sess.run(None, {"x": x, "L": lens})):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for lens in ([6, 2], [-1, 2]):
        with pytest.raises(bridge.InputError, match=r"sequence length outside .* \"lstm\""):
            m(x, np.array(lens, np.int32))
        with pytest.raises(Exception):
            sess.run(None, {"x": x, "L": np.array(lens, np.int32)})


class _RowLoop(torch.nn.Module):
    """A recurrence written as a Python loop that stores each step's output in place,
    out[:, t] = h (RWKV's CPU path, hand-written RNN cells): torch.compile sees a chain
    of select_scatters, the ONNX exporter a chain of ScatterNDs."""

    def __init__(self, width=16):
        super().__init__()
        self.proj = torch.nn.Linear(width, width)
        self.decay = torch.nn.Parameter(torch.rand(width) * 0.5 + 0.25)

    def forward(self, x):
        k = self.proj(x)
        out = torch.zeros_like(k)
        h = torch.zeros_like(k[:, 0])
        for t in range(k.shape[1]):
            h = h * self.decay + torch.tanh(k[:, t])
            out[:, t] = h
        return out * torch.sigmoid(k)


def _compiled_nodes(compiled) -> list:
    spec = next(iter(compiled._specs.values()))
    return [n for p in spec.parts if p.compiled is not None
            for k in p.compiled.kernels for n in k.nodes]


def _chained_writes(nodes) -> list:
    """Nodes of a chain of writes left as it came: a gather from a concat, or a select
    (torch's own decomposition of select_scatter, which braze's table drops)."""
    return [n for n in nodes if n.op == "select" or (
        n.op == "gather" and n.inputs[0].producer is not None
        and n.inputs[0].producer.op == "concat")]


def test_a_loop_of_row_writes_compiles_to_one_concat_of_rows(tmp_path, monkeypatch):
    """Both front ends: the chain of writes becomes the concat of the rows
    (identities.constant_gather; torch.compile's select_scatter converted by braze, not
    decomposed by torch): no chained write left (k[:, t]'s gathers stay), numbers as
    eager."""
    from bridge import torch_backend

    runners = []
    init = torch_backend.GraphRunner.__init__

    def record(self, *a, **k):
        init(self, *a, **k)
        runners.append(self)

    monkeypatch.setattr(torch_backend.GraphRunner, "__init__", record)
    torch.manual_seed(0)
    module = _RowLoop().eval()
    x = torch.randn(2, 24, 16)
    with torch.no_grad():
        want = module(x).numpy()
        got = torch.compile(module, backend="braze", options={"allow_fallback": False})(x)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
    traced = [n for r in runners for spec in r._specs.values() if spec is not None
              for c in spec.clusters for n in c.nodes]
    assert traced and not _chained_writes(traced)
    path = tmp_path / "loop.onnx"
    torch.onnx.export(module, (x,), str(path), input_names=["x"], output_names=["y"],
                      opset_version=17, dynamo=False)
    compiled = bridge.compile_onnx(str(path), allow_fallback=False)
    np.testing.assert_allclose(compiled(x.numpy())[0], want, rtol=1e-5, atol=1e-5)
    nodes = _compiled_nodes(compiled)
    assert not _chained_writes(nodes)
    assert max(len(n.inputs) for n in nodes if n.op == "concat") >= 24  # the rows
