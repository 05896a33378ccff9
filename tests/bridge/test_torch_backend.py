"""torch.compile(model, backend="braze"): models against eager, training, fallbacks, options.

Tolerances: float32 outputs within RTOL/ATOL of eager (braze's kernels reassociate
sums and use their own exp/erf; convolutions and matmuls run in torch).
"""

import importlib.metadata
import logging
import os

import pytest
import torch
import torch.nn as nn

from bridge import CompileError
from compiler.codegen import cpu
from tests.bridge.torch_models import LSTMTagger, SmallResNet, randomize_bn

RTOL, ATOL = 1e-4, 1e-5


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def compiled(model, **options):
    return torch.compile(model, backend="braze", options={"strict": True, **options})


def check_inference(model, *inputs, **options):
    c = compiled(model, **options)
    with torch.no_grad():
        for _ in range(2):  # the second call reuses the specialization
            torch.testing.assert_close(c(*inputs), model(*inputs), rtol=RTOL, atol=ATOL)


def test_registered_by_entry_point():
    eps = importlib.metadata.entry_points(group="torch_dynamo_backends")
    assert eps["braze"].value == "bridge.torch_backend:braze"
    assert "braze" in torch._dynamo.list_backends()


def test_backend_found_without_importing_braze(tmp_path):
    """A fresh interpreter, outside the repository: torch finds braze by its entry point."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "assert not any(m.split('.')[0] == 'bridge' for m in sys.modules)\n"
        "m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.GELU())\n"
        "x = torch.randn(2, 4)\n"
        "with torch.no_grad():\n"
        "    y = torch.compile(m, backend='braze', options={'strict': True})(x)\n"
        "torch.testing.assert_close(y, m(x))\n"
        "assert 'bridge.torch_backend' in sys.modules\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_mlp_inference_dumps_ir_and_llvm(tmp_path):
    m = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 4),
                      nn.Softmax(-1)).eval()
    check_inference(m, torch.randn(5, 8), dump_dir=str(tmp_path))
    names = os.listdir(tmp_path)
    assert any(n.endswith(".import.ir") for n in names)
    assert any(n.endswith(".ll") for n in names), "no cluster was compiled by braze"
    clusters = next(n for n in names if n.endswith("clusters.txt"))
    assert "compiled" in (tmp_path / clusters).read_text()


def test_small_resnet_folds_batch_norm(tmp_path):
    m = randomize_bn(SmallResNet()).eval()
    check_inference(m, torch.randn(2, 3, 16, 16), dump_dir=str(tmp_path))
    opt = next(p for p in tmp_path.iterdir() if p.name.endswith(".opt.ir")).read_text()
    header = opt.splitlines()[0]
    assert header.count("%") == 2, f"weights should be constants (frozen): {header}"
    assert "reciprocal" not in opt and "sqrt" not in opt, "batch norm was not folded"


def test_freeze_false_keeps_weights_as_inputs(tmp_path):
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval()
    check_inference(m, torch.randn(2, 4), freeze=False, dump_dir=str(tmp_path))
    ir = next(p for p in tmp_path.iterdir() if p.name.endswith(".import.ir")).read_text()
    assert ir.splitlines()[0].count("%") >= 4  # weight, bias, x, output


def test_frozen_weights_changed_in_place_recompile():
    m = nn.Sequential(nn.Linear(4, 4), nn.Tanh()).eval()
    c = compiled(m)
    x = torch.randn(3, 4)
    with torch.no_grad():
        c(x)
        m[0].weight.mul_(2.0)
        torch.testing.assert_close(c(x), m(x), rtol=RTOL, atol=ATOL)


def test_transformer_encoder_layer():
    m = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True).eval()
    enabled = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)  # the decomposable path, not one fused op
    try:
        check_inference(m, torch.randn(2, 5, 16))
    finally:
        torch.backends.mha.set_fastpath_enabled(enabled)


def test_lstm(monkeypatch):
    monkeypatch.setattr(torch._dynamo.config, "allow_rnn", True)
    check_inference(LSTMTagger().eval(), torch.randn(2, 5, 6))


def test_non_contiguous_input():
    m = nn.Sequential(nn.Linear(6, 3), nn.Sigmoid())
    check_inference(m, torch.randn(6, 4).t())


def _training_losses(make, batch_shape, **options) -> tuple[list, list]:
    """Losses of 20 SGD steps: eager, and a second copy (same seed) under braze."""
    data = [(torch.randn(*batch_shape), torch.randn(batch_shape[0], 1)) for _ in range(20)]

    def losses(model, step_fn):
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        out = []
        for x, y in data:
            opt.zero_grad()
            loss = nn.functional.mse_loss(step_fn(x), y)
            loss.backward()
            opt.step()
            out.append(loss.item())
        return out

    eager = make()
    ours = make()
    return losses(eager, eager), losses(ours, compiled(ours, **options))


def test_mlp_training_loop_matches_eager():
    def make():
        torch.manual_seed(3)
        return nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(),
                             nn.Linear(32, 1))

    expected, got = _training_losses(make, (16, 10))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=0)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("batch", [1, 16])
def test_stacked_relu_layers_training_loop_matches_eager(monkeypatch, batch, threads):
    """Linear+ReLU layers of equal output widths and different depths (issue 16, item 0:
    their row kernels were taken for twins and the second ran with the first's depth,
    giving NaN or 1e12), with twins trusted as in production."""
    monkeypatch.setattr(cpu, "VERIFY_TWINS", False)

    def make():
        torch.manual_seed(3)
        return nn.Sequential(nn.Linear(10, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(),
                             nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))

    expected, got = _training_losses(make, (batch, 10), threads=threads)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)


def test_small_cnn_training_loop_matches_eager():
    """Conv, batch norm in training mode (running statistics updated), max pooling."""
    def make():
        torch.manual_seed(3)
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                             nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 1))

    expected, got = _training_losses(make, (4, 3, 16, 16))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=0)


def test_sdpa_training_gradients_match_eager():
    """torch's decomposition of the CPU flash-attention op returns the attention weights
    where its backward expects the logsumexp: braze keeps the op whole."""
    def f(q, k, v):
        return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    q, k, v = (torch.randn(2, 4, 5, 8, requires_grad=True) for _ in range(3))
    f(q, k, v).square().sum().backward()
    expected = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    compiled(f)(q, k, v).square().sum().backward()
    for t, e in zip((q, k, v), expected):
        torch.testing.assert_close(t.grad, e, rtol=RTOL, atol=ATOL)


def test_dtype_without_ir_type_runs_graph_on_torch(caplog):
    """complex32 has no IR type (not even for a host node): the graph runs on torch,
    logged at INFO, also under strict; allow_fallback=False refuses it."""
    def f(x):
        return (x * 2).chalf()

    x = torch.randn(3, 4)
    with caplog.at_level(logging.INFO, logger="braze"):
        torch.testing.assert_close(compiled(f)(x), f(x))
    assert any("complex32" in r.getMessage() and r.levelno == logging.INFO
               for r in caplog.records)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="complex32.*allow_fallback=False"):
        compiled(f, allow_fallback=False)(x)


def test_unsupported_op_runs_on_torch_and_is_logged(caplog):
    def f(x):
        return torch.special.airy_ai(torch.relu(x)) * 2

    x = torch.randn(4, 5)
    with caplog.at_level(logging.INFO, logger="braze"):
        torch.testing.assert_close(compiled(f)(x), f(x))
    msg = " ".join(r.getMessage() for r in caplog.records)
    assert "aten.special_airy_ai.default" in msg and "no braze converter" in msg


def test_fake_example_inputs_are_never_read():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from bridge.torch_backend import braze

    class TupleOut(nn.Module):  # dynamo's graphs return tuples
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x):
            return (torch.relu(self.fc(x)),)

    m = TupleOut()
    gm = torch.fx.symbolic_trace(m)
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(torch.empty(2, 4))
    fn = braze(gm, [fake], options={"strict": True})
    x = torch.randn(2, 4)
    torch.testing.assert_close(fn(x)[0], m(x)[0])


def test_dynamic_shapes_specialize_per_shape():
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    c = torch.compile(m, backend="braze", dynamic=True, options={"strict": True})
    with torch.no_grad():
        for batch in (2, 3, 7, 3):
            x = torch.randn(batch, 4)
            torch.testing.assert_close(c(x), m(x), rtol=RTOL, atol=ATOL)


def test_specializations_are_bounded():
    from torch.fx.experimental.proxy_tensor import make_fx

    from bridge.options import TorchOptions
    from bridge.specializations import MAX_SPECIALIZATIONS
    from bridge.torch_backend import GraphRunner

    gm = make_fx(lambda x: (torch.exp(x) + 1,), tracing_mode="symbolic")(torch.randn(3))
    runner = GraphRunner(gm, "t", (), TorchOptions(strict=True))
    assert runner.dynamic
    for n in range(1, MAX_SPECIALIZATIONS + 4):
        x = torch.randn(n)
        torch.testing.assert_close(runner(x)[0], torch.exp(x) + 1)
    assert len(runner._specs) == MAX_SPECIALIZATIONS


def test_compile_failure_warns_and_runs_eagerly(monkeypatch, caplog):
    import importers.fx

    def broken(*args, **kwargs):
        raise RuntimeError("simulated importer bug")

    monkeypatch.setattr(importers.fx, "import_fx", broken)
    m = nn.Sequential(nn.Linear(4, 2))
    x = torch.randn(3, 4)
    c = torch.compile(m, backend="braze")
    with caplog.at_level(logging.WARNING, logger="braze"), torch.no_grad():
        torch.testing.assert_close(c(x), m(x))
    assert any("simulated importer bug" in r.getMessage() and r.levelno == logging.WARNING
               for r in caplog.records)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="simulated importer bug"), torch.no_grad():
        compiled(m)(x)


def test_allow_fallback_false_refuses_host_nodes():
    def f(x):
        return torch.special.airy_ai(x)

    with pytest.raises(Exception, match="allow_fallback=False"):
        compiled(f, allow_fallback=False)(torch.randn(3))


def test_a_size_only_a_host_op_knows_is_a_clear_error():
    """nonzero's row count is known only when it runs (an unbacked size): with no host
    fallback, the error names the host op; with it, the graph runs and is right."""
    def f(x):
        return torch.nonzero(x) + 1

    x = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
    with pytest.raises(CompileError, match=r"known only at run time.*nonzero"):
        torch.compile(f, backend="braze", dynamic=False, fullgraph=True,
                      options={"allow_fallback": False, "strict": True})(x)
    torch._dynamo.reset()
    assert torch.equal(compiled(f)(x), f(x))


@pytest.mark.parametrize("options, message", [
    ({"bogus": 1}, "unknown braze option"),
    ({"target": "tpu"}, "unknown target"),
])
def test_bad_options_are_clear_errors(options, message):
    with pytest.raises(Exception, match=message):
        torch.compile(nn.ReLU(), backend="braze", options=options)(torch.randn(2))


def test_mode_is_accepted():
    m = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    x = torch.randn(2, 3)
    torch.testing.assert_close(torch.compile(m, backend="braze", mode="max-autotune")(x), m(x))


def test_frozen_weights_replaced_or_reassigned_recompile():
    """A weight swapped for a new tensor, or given new storage through .data (no version
    bump), is seen too: the data pointers are part of what is checked."""
    m = nn.Sequential(nn.Linear(4, 4), nn.Tanh()).eval()
    c = compiled(m)
    x = torch.randn(3, 4)
    with torch.no_grad():
        c(x)
        m[0].weight.data = torch.randn(4, 4)
        torch.testing.assert_close(c(x), m(x), rtol=RTOL, atol=ATOL)
        m[0].bias = nn.Parameter(torch.randn(4))
        torch.testing.assert_close(c(x), m(x), rtol=RTOL, atol=ATOL)


@pytest.fixture
def dict_tag_guards():
    """torch's setting for recursive dict-tag guards, restored after the test."""
    import torch._dynamo.config as dynamo_config

    before = dynamo_config.use_recursive_dict_tags_for_guards
    dynamo_config.use_recursive_dict_tags_for_guards = False
    yield dynamo_config
    dynamo_config.use_recursive_dict_tags_for_guards = before


@pytest.mark.parametrize("fast", [True, False])
def test_fast_guards_option_sets_dynamo_dict_tags(dict_tag_guards, fast):
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU()).eval()
    check_inference(model, torch.randn(2, 4), fast_guards=fast)
    assert dict_tag_guards.use_recursive_dict_tags_for_guards is fast


def test_fast_guards_still_see_a_replaced_submodule_and_weight(dict_tag_guards):
    """With the dict-tag guards on, a submodule swapped for another recompiles (its
    module dict changed), and a weight given new storage through `.data` (which changes
    no dict) is caught by the frozen-weight check: every call matches eager."""
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)).eval()
    c = compiled(model)
    x = torch.randn(5, 4)
    with torch.no_grad():
        torch.testing.assert_close(c(x), model(x), rtol=RTOL, atol=ATOL)
        assert dict_tag_guards.use_recursive_dict_tags_for_guards
        model[1] = nn.Tanh()
        torch.testing.assert_close(c(x), model(x), rtol=RTOL, atol=ATOL)
        model[2].weight.data = torch.randn(2, 3)
        torch.testing.assert_close(c(x), model(x), rtol=RTOL, atol=ATOL)
        model[0].bias.data.mul_(3)  # in place, through .data: no version bump
        torch.testing.assert_close(c(x), model(x), rtol=RTOL, atol=ATOL)


def _conv_weight_graph():
    """A make_fx graph of conv + bias + relu whose weight and bias are inputs 0 and 1
    (what AOTAutograd's forward graph is for a model called with gradients on)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(w, b, x):
        return (torch.relu(torch.nn.functional.conv2d(x, w, b, padding=1)),)

    w, b, x = torch.randn(8, 3, 3, 3), torch.randn(8), torch.randn(1, 3, 10, 10)
    return make_fx(f)(w, b, x), [w, b, x]


def test_steady_weights_freeze_after_steady_calls_and_thaw_on_change(caplog):
    """Structural: the forward graph runs with weights as inputs (the conv, whose weight
    an optimizer may update, on torch) until they held still STEADY_CALLS calls, then
    frozen (the conv compiled, its weight packed); an in-place change thaws it; after
    MAX_THAWS thaws it stays unfrozen. Numeric: every call matches eager."""
    from bridge.options import TorchOptions
    from bridge.torch_backend import MAX_THAWS, STEADY_CALLS, SteadyWeightsRunner

    gm, (w, b, x) = _conv_weight_graph()
    runner = SteadyWeightsRunner(gm, "t", (0, 1), TorchOptions(strict=True))

    def call():
        torch.testing.assert_close(runner(w, b, x)[0], gm(w, b, x)[0], rtol=RTOL, atol=ATOL)

    for _ in range(STEADY_CALLS):
        call()
    assert (runner.unfrozen.compiles, runner.frozen.compiles) == (1, 0)
    call()
    assert runner.frozen.compiles == 1
    spec = next(iter(runner.frozen._specs.values()))
    assert all(c.compiled for c in spec.clusters)  # the conv with its weight packed
    assert "conv" in [n.op for c in spec.clusters for n in c.nodes]
    unfrozen = next(iter(runner.unfrozen._specs.values())).clusters
    host = {n.attrs["op_type"]: c.reasons[n] for c in unfrozen if not c.compiled
            for n in c.nodes if n.op == "host"}
    assert list(host) == ["aten.convolution.default"]
    assert "optimizer may update" in host["aten.convolution.default"]
    with caplog.at_level(logging.INFO, logger="braze"):
        for thaw in range(MAX_THAWS):
            w.mul_(0.5)  # an optimizer step
            call()
            assert runner.thaws == thaw + 1
            for _ in range(STEADY_CALLS):
                call()
    assert "changed while frozen" in caplog.text
    assert runner.frozen.compiles == MAX_THAWS  # the last thaw compiled nothing more
    calls = runner.calls
    call()  # given up: the weights are no longer checked
    assert len(runner.frozen._specs) == 0 and runner.calls == calls


def test_eval_model_with_gradients_on_matches_eager_outputs_and_gradients():
    """An eval-mode model called without no_grad (its forward graph freezes after two
    calls): outputs and parameter gradients match eager's on every call, and a training
    loop afterwards (weights change each step) too."""
    model = SmallResNet()
    randomize_bn(model)
    model.eval()
    c = compiled(model)
    x = torch.randn(2, 3, 16, 16)
    for _ in range(4):
        y, ref = c(x), model(x)
        torch.testing.assert_close(y, ref, rtol=RTOL, atol=ATOL)
        y.square().sum().backward()
        got = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        ref.square().sum().backward()
        for g, p in zip(got, model.parameters()):
            torch.testing.assert_close(g, p.grad, rtol=1e-3, atol=1e-4)
        model.zero_grad()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(3):
        y, ref = c(x), model(x)
        torch.testing.assert_close(y, ref, rtol=RTOL, atol=ATOL)
        y.sum().backward()
        opt.step()
        opt.zero_grad()


@pytest.mark.parametrize("make", [
    lambda: nn.InstanceNorm2d(6),
    lambda: nn.InstanceNorm2d(6, affine=True),
    lambda: nn.InstanceNorm1d(6, affine=True),
    lambda: nn.BatchNorm2d(6, track_running_stats=False),
], ids=["instance2d", "instance2d_affine", "instance1d_affine", "batch_no_running_stats"])
def test_norms_by_batch_statistics_compile(make, caplog):
    """aten._native_batch_norm_legit.no_stats (instance norm, and batch norm without
    running statistics) is braze's: no host node, numbers as eager's."""
    torch.manual_seed(0)
    norm = make()
    for p in norm.parameters():
        nn.init.normal_(p)
    dims = 1 if isinstance(norm, nn.InstanceNorm1d) else 2
    conv = (nn.Conv1d if dims == 1 else nn.Conv2d)(3, 6, 3, padding=1)
    m = nn.Sequential(conv, norm, nn.ReLU()).eval()
    x = torch.randn((2, 3, 9) if dims == 1 else (2, 3, 7, 5)) * 3 + 1
    with caplog.at_level(logging.INFO, logger="braze"):
        check_inference(m, x, allow_fallback=False)
    assert not [r for r in caplog.records if "runs on torch" in r.getMessage()]


@pytest.mark.parametrize("groups, channels, shape", [
    (4, 8, (2, 8, 5, 6)), (1, 6, (1, 6, 9)), (6, 6, (2, 6, 3, 4)), (2, 4, (1, 4, 3, 4, 5)),
], ids=["2d", "1d_one_group", "2d_per_channel", "3d"])
def test_group_norm_compiles(groups, channels, shape, caplog):
    """aten.native_group_norm is braze's (no host node), numbers as eager's; its mean and
    rstd outputs feed the backward of a training step."""
    torch.manual_seed(0)
    norm = nn.GroupNorm(groups, channels)
    nn.init.normal_(norm.weight)
    nn.init.normal_(norm.bias)
    m = nn.Sequential(norm, nn.SiLU()).eval()
    x = torch.randn(shape) * 2 + 0.5
    with caplog.at_level(logging.INFO, logger="braze"):
        check_inference(m, x, allow_fallback=False)
    assert not [r for r in caplog.records if "runs on torch" in r.getMessage()]


class _PoolMixer(nn.Module):
    """A PoolFormer block's token mixer between convs: GroupNorm(1, C), avg pool - x."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 16, 3, padding=1)
        self.norm = nn.GroupNorm(1, 16)
        self.pool = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
        self.b = nn.Conv2d(16, 16, 1)

    def forward(self, x):
        y = self.a(x)
        z = self.norm(y)
        return self.b(y + self.pool(z) - z)


def test_a_one_group_norm_between_convs_runs_channels_last(tmp_path):
    """Through torch's native_group_norm: the norm, the pool and the convs all run on the
    channels-last values, transposed only at the graph's edges."""
    torch.manual_seed(0)
    m = _PoolMixer().eval()
    nn.init.normal_(m.norm.weight)
    nn.init.normal_(m.norm.bias)
    check_inference(m, torch.randn(2, 3, 10, 12), allow_fallback=False,
                    dump_dir=str(tmp_path))
    opt = next(p for p in tmp_path.iterdir() if p.name.endswith(".opt.ir")).read_text()
    assert opt.count(" = transpose(") == 2, opt


def test_group_norm_training_step_matches_eager():
    torch.manual_seed(0)
    make = lambda: nn.Sequential(nn.Conv2d(3, 8, 3), nn.GroupNorm(2, 8), nn.ReLU())  # noqa: E731
    ref, mine = make(), make()
    mine.load_state_dict(ref.state_dict())
    c = compiled(mine)
    x = torch.randn(2, 3, 8, 8)
    for model in (ref, c):
        model(x).square().mean().backward()
    for a, b in zip(ref.parameters(), mine.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("dims, correction, keepdim", [
    ((1,), 1, False), ((0, 2), 0, True), (None, 1, False), ((-1,), 2, True),
])
def test_var_mean_compiles(dims, correction, keepdim):
    """aten.var_mean.correction (torch.var_mean: hand-written norms) and aten.var."""
    def f(x):
        v, m = torch.var_mean(x, dim=dims, correction=correction, keepdim=keepdim)
        return v * 2 + m, torch.var(x, dim=dims, correction=correction, keepdim=keepdim)

    x = torch.randn(3, 5, 7) * 3 + 1
    check_inference(f, x, allow_fallback=False)


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("dims", [2, 3])
def test_grid_sample_compiles(mode, padding, align, dims):
    """F.grid_sample, linear and nearest with every padding mode, 2-d and 3-d: gathers
    at computed indices (importers/grid_sample.py), no host node, eager's numbers. The
    grid reaches past [-1, 1] (padding decides those taps); in 2-d with zeros padding it
    holds a NaN too: NaN out of a linear sample, 0 out of a nearest one, in both (torch's
    3-d kernel gives 0 for both; under border and reflection padding its clipping turns
    a NaN into an edge pixel, braze's linear sample gives NaN)."""
    torch.manual_seed(0)
    x = torch.randn((2, 3, 5, 7) if dims == 2 else (2, 3, 4, 5, 6))
    grid = torch.rand((2, 6, 4, dims) if dims == 2 else (2, 3, 4, 2, dims)) * 2.8 - 1.4
    if mode == "nearest":  # no position exactly half-way (rounding there is a tie)
        grid = torch.round(grid * 64) / 64 + 1 / 256
    if padding == "zeros" and dims == 2:
        grid.view(-1)[5] = float("nan")

    def f(x, g):
        return torch.nn.functional.grid_sample(x, g, mode=mode, padding_mode=padding,
                                               align_corners=align) * 2

    c = compiled(f, allow_fallback=False)
    with torch.no_grad():
        torch.testing.assert_close(c(x, grid), f(x, grid), rtol=RTOL, atol=ATOL,
                                   equal_nan=True)


@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [False, True])
def test_grid_sample_bicubic_compiles(padding, align):
    torch.manual_seed(0)
    x, grid = torch.randn(2, 3, 5, 6), torch.rand(2, 4, 3, 2) * 2.8 - 1.4

    def f(x, g):
        return torch.nn.functional.grid_sample(x, g, mode="bicubic", padding_mode=padding,
                                               align_corners=align)

    c = compiled(f, allow_fallback=False)
    with torch.no_grad():
        torch.testing.assert_close(c(x, grid), f(x, grid), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("offset, dims", [(0, (0, 1)), (2, (0, 1)), (-1, (2, 0)), (1, (1, -1))])
def test_diagonal_compiles(offset, dims):
    """Tensor.diagonal and torch.diag: one gather of constant indices, no host node."""
    def f(x, m):
        return (x.diagonal(offset, *dims) * 2, torch.diag(m, offset))

    check_inference(f, torch.randn(4, 5, 6), torch.randn(5, 7), allow_fallback=False)


@pytest.mark.parametrize("dim, size, step", [(0, 2, 1), (1, 3, 2), (-1, 4, 4), (2, 1, 3)])
def test_unfold_compiles(dim, size, step):
    """Tensor.unfold: one gather of constant indices (and the window axis moved last)."""
    def f(x):
        return x.unfold(dim, size, step) + 1

    check_inference(f, torch.randn(3, 7, 9), allow_fallback=False)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_gather_compiles(dim):
    """torch.gather, smaller indices than the input off its dim too, and cross-entropy
    (which picks each row's class with it): no host node, eager's numbers."""
    torch.manual_seed(0)
    x = torch.randn(4, 6, 5)
    shape = [3, 4, 2]
    shape[dim] = 7
    index = torch.randint(0, x.shape[dim], shape)

    def f(x, i, logits, target):
        return torch.gather(x, dim, i) * 2, torch.nn.functional.cross_entropy(logits, target)

    check_inference(f, x, index, torch.randn(5, 10), torch.randint(0, 10, (5,)),
                    allow_fallback=False)


def test_gather_out_of_range_index_is_an_error_as_in_eager():
    def f(x, i):
        return torch.gather(x, 1, i)

    x, bad = torch.randn(2, 3), torch.tensor([[0, 3], [1, -1]])
    with pytest.raises(RuntimeError):
        f(x, bad)
    with pytest.raises(Exception, match="(?i)index|range"):
        compiled(f)(x, bad)
