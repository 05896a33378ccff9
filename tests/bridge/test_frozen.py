"""Frozen weights changed after compiling (issue 16, item 2): every in-place update is
seen, including those through `.data` that bump no version counter, and the graph is
compiled again with the new weights; the answer no longer depends on call history."""

import logging

import pytest
import torch
import torch.nn as nn

from bridge.frozen import SAMPLES, Fingerprint, FrozenWeights

RTOL, ATOL = 1e-4, 1e-5

DATA_WRITES = {
    "mul_": lambda p: p.data.mul_(2),
    "copy_": lambda p: p.data.copy_(torch.randn_like(p)),
    "setitem": lambda p: p.data.__setitem__(slice(None), torch.randn_like(p)),
    "ema": lambda p: p.data.mul_(0.99).add_(0.01 * torch.randn_like(p)),
    "zero_": lambda p: p.data.zero_(),
}


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _compiled(m):
    return torch.compile(m, backend="braze", options={"strict": True})


@pytest.mark.parametrize("write", list(DATA_WRITES))
@pytest.mark.parametrize("which", ["weight", "bias"])
def test_writes_through_data_recompile(write, which, caplog):
    m = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 8)).eval()
    c = _compiled(m)
    x = torch.randn(2, 16)
    with torch.no_grad():
        torch.testing.assert_close(c(x), m(x), rtol=RTOL, atol=ATOL)
        p = getattr(m[0], which)
        version = p._version
        DATA_WRITES[write](p)
        assert p._version == version  # torch's counter did not see it: the fingerprint must
        with caplog.at_level(logging.INFO, logger="braze"):
            torch.testing.assert_close(c(x), m(x), rtol=RTOL, atol=ATOL)
    assert any("frozen weights" in r.getMessage() for r in caplog.records)


def test_answer_does_not_depend_on_call_history():
    """Before: a new input shape recompiled with the new weights, the old shape kept the
    old ones, so two calls with the same weights gave different answers."""
    m = nn.Sequential(nn.Linear(8, 8), nn.Tanh()).eval()
    c = _compiled(m)
    a, b = torch.randn(2, 8), torch.randn(3, 8)
    with torch.no_grad():
        c(a)
        m[0].weight.data.mul_(-1.5)
        torch.testing.assert_close(c(b), m(b), rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(c(a), m(a), rtol=RTOL, atol=ATOL)


def test_channels_last_conv_weights_and_batch_norm_buffers():
    m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU()).eval()
    m = m.to(memory_format=torch.channels_last)
    assert not m[0].weight.is_contiguous()
    c = _compiled(m)
    x = torch.randn(1, 3, 10, 10)
    with torch.no_grad():
        c(x)
        m[0].weight.data.mul_(0.5)
        torch.testing.assert_close(c(x), m(x), rtol=RTOL, atol=ATOL)
        m[1].running_var.data.copy_(torch.rand(8) + 0.5)
        torch.testing.assert_close(c(x), m(x), rtol=RTOL, atol=ATOL)


def test_unchanged_weights_do_not_recompile(caplog):
    """NaN weights compare equal to themselves (bitwise), so nothing recompiles per call."""
    m = nn.Sequential(nn.Linear(4, 4)).eval()
    with torch.no_grad():
        m[0].bias[1] = float("nan")
    c = _compiled(m)
    x = torch.randn(2, 4)
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="braze"):
        for _ in range(3):
            torch.testing.assert_close(c(x), m(x), equal_nan=True)
    assert not any("frozen weights" in r.getMessage() for r in caplog.records)


# -- the fingerprint itself -----------------------------------------------------

@pytest.mark.parametrize("t", [
    torch.randn(1000), torch.randn(6, 5, 3, 3).to(memory_format=torch.channels_last),
    torch.arange(40, dtype=torch.int64), torch.rand(33) > 0.5,
    torch.randn(7, dtype=torch.float64), torch.randn(20, 20).t(),
    torch.randn(30)[::2],  # not one dense block: sampled through a copy
], ids=["f32", "channels_last", "i64", "bool", "f64", "transposed", "gapped"])
def test_fingerprint_sees_whole_tensor_writes_in_place(t):
    fp = Fingerprint([t, torch.zeros(0)])
    assert fp.same()
    if t.dtype == torch.bool:
        t.logical_not_()
    else:
        t.mul_(3).add_(1)
    assert not fp.same()


def test_fingerprint_samples_the_ends_of_each_tensor():
    """SAMPLES elements, half at each end (two cache lines a weight, whatever its
    size); what is not seen (README says so): an element in between."""
    t = torch.zeros(1000)
    fp = Fingerprint([t])
    assert fp.sampled_bytes() == 4 * SAMPLES  # 4 bytes per float32 sampled
    t[500] = 5.0
    assert fp.same()
    for i in (0, SAMPLES // 2 - 1, 1000 - SAMPLES // 2, 999):
        t.zero_()
        fp = Fingerprint([t])
        t[i] = 5.0
        assert not fp.same(), i


def test_fingerprint_of_a_small_tensor_samples_every_element():
    t = torch.zeros(SAMPLES - 1)
    fp = Fingerprint([t])
    assert fp.sampled_bytes() == 4 * (SAMPLES - 1)
    for i in range(SAMPLES - 1):
        t.zero_()
        fp = Fingerprint([t])
        t[i] = 1.0
        assert not fp.same(), i


def test_frozen_weights_first_call_then_changes():
    w = [torch.randn(5), torch.randn(3)]
    fw = FrozenWeights([0, 2])
    args = [w[0], torch.randn(2), w[1]]
    assert not fw.changed(args) and not fw.changed(args)
    w[1].data.mul_(2)
    assert fw.changed(args) and not fw.changed(args)
    args[0] = torch.randn(5)  # another tensor: another storage
    assert fw.changed(args)


@pytest.mark.parametrize("dtype,n", [(torch.float16, 3), (torch.int8, 5), (torch.int8, 100),
                                     (torch.float64, 9), (torch.uint8, 12)])
def test_fingerprint_words_cover_each_end_and_stay_inside(dtype, n):
    """Words at each end (bytes only under 8), none past the end: a change to any
    element among the first and the last SAMPLES / 2 is seen."""
    t = torch.zeros(n, dtype=dtype)
    half = min(SAMPLES // 2, n)
    for i in list(range(half)) + list(range(n - half, n)):
        t.zero_()
        fp = Fingerprint([t])
        t[i] = 1
        assert not fp.same(), i
    fp = Fingerprint([t])
    assert fp.sampled_bytes() <= n * t.element_size()
    assert all(int(a) + 8 <= t.data_ptr() + n * t.element_size() for a in fp._words)


# -- the compiled state check ---------------------------------------------------

def test_probe_finds_every_field_on_this_torch():
    from bridge.frozen import _state_fields

    assert _state_fields() is not None


@pytest.mark.parametrize("write,seen", [
    (lambda ws: ws[0].__setitem__((1, 2), 7.0), True),  # middle element: the version
    (lambda ws: setattr(ws[1], "data", torch.randn(6)), True),  # new storage
    (lambda ws: ws[1].data.mul_(2), False),  # no version bump: the fingerprint's job
], ids=["setitem", "data=", "data.mul_"])
def test_tensor_state_sees_versions_and_storage(write, seen):
    from bridge.frozen import TensorState

    ws = (nn.Parameter(torch.randn(4, 4)), nn.Parameter(torch.randn(6)), torch.randn(3))
    state = TensorState.of(ws)
    assert state is not None and state.same(ws)
    with torch.no_grad():
        write(ws)
    assert state.same(ws) is not seen
    assert not state.same((ws[0], ws[1], torch.randn(3)))  # another object


def test_tensor_state_refuses_what_it_cannot_read():
    from bridge.frozen import TensorState

    with torch.inference_mode():
        inference = torch.randn(3)  # no version counter
    class Sub(torch.Tensor):
        pass
    assert TensorState.of((torch.randn(2), inference)) is None
    assert TensorState.of((torch.randn(2).as_subclass(Sub),)) is None
    assert TensorState.of((torch.randn(2), 3)) is None


@pytest.mark.parametrize("write", [
    lambda p: p.__setitem__(50, 1.0),  # between the fingerprint's samples
    lambda p: setattr(p, "data", torch.randn_like(p)),
    lambda p: p.data.mul_(2),
], ids=["setitem", "data=", "data.mul_"])
def test_frozen_weights_check_in_compiled_code(write):
    """After the first call the check runs compiled (`_native`); every kind of write is
    still seen, and the next call is quiet again."""
    w = [nn.Parameter(torch.randn(100)), nn.Parameter(torch.randn(2, 3))]
    fw = FrozenWeights([0, 2])
    args = [w[0], torch.randn(2), w[1]]
    assert not fw.changed(args)
    assert fw._native is not None and not fw.changed(args)
    with torch.no_grad():
        write(w[0])
    assert fw.changed(args) and not fw.changed(args)


def test_a_tensor_whose_storage_refuses_access_is_a_change_not_a_crash():
    """torch's accessors throw on such a storage (FakeTensor's, say); the compiled check
    calls none of them: the weight given one reads as changed, and the Python path then
    raises torch's RuntimeError (run in a child: a C++ exception through compiled code
    would end the process)."""
    import subprocess
    import sys

    code = """
import torch
from bridge.frozen import TensorState
p = torch.nn.Parameter(torch.randn(4))
state = TensorState.of((p,))
refusing = torch.randn(4)
torch._C._set_throw_on_mutable_data_ptr(refusing)
p.data = refusing
print(state.same((p,)))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-500:]
    assert out.stdout.strip().splitlines()[-1] in ("True", "False")
