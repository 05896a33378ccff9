"""The torch front end's direct run (bridge/torch_backend.py, _DirectTensors): a graph
compiled whole reads the call's tensors in place through their data pointers; any
tensor it cannot read so (layout, dtype, a negated view) takes the usual path, and the
answers are the same either way."""

import pytest
import torch
import torch.nn as nn

import bridge.torch_backend as tb

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


@pytest.fixture
def taken(monkeypatch):
    """Counts of calls the direct path ran and declined."""
    counts = {"direct": 0, "declined": 0}
    run = tb._DirectTensors.run

    def counted(self, args):
        out = run(self, args)
        counts["direct" if out is not None else "declined"] += 1
        return out

    monkeypatch.setattr(tb._DirectTensors, "run", counted)
    return counts


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(8 * 6 * 6, 5)).eval()


def test_whole_graph_runs_on_the_tensors_in_place(taken):
    m = _model()
    c = torch.compile(m, backend="braze", options={"strict": True})
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(c(x), m(x), rtol=1e-4, atol=1e-5)
    assert taken == {"direct": 2, "declined": 0}


@pytest.mark.parametrize("make", [
    lambda x: x.to(memory_format=torch.channels_last),  # not C order
    lambda x: torch._neg_view(-x),  # a negated view: its memory holds -x
    lambda x: x.clone().requires_grad_(False)[:, :, :, :],  # a plain view: direct
], ids=["channels_last", "neg_view", "view"])
def test_tensors_it_cannot_read_in_place_take_the_usual_path(make, taken):
    m = _model()
    c = torch.compile(m, backend="braze", options={"strict": True})
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        c(x)
        given = make(x)
        assert torch.equal(given, x)
        torch.testing.assert_close(c(given), m(x), rtol=1e-4, atol=1e-5)
    direct = given.is_contiguous() and not given.is_neg()
    assert taken == {"direct": 1 + direct, "declined": 1 - direct}


def test_results_held_are_not_overwritten_by_the_next_call():
    m = _model()
    c = torch.compile(m, backend="braze", options={"strict": True})
    x1, x2 = torch.randn(2, 3, 6, 6), torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        y1 = c(x1)
        kept = y1.clone()
        y2 = c(x2)
        assert torch.equal(y1, kept)
        torch.testing.assert_close(y2, m(x2), rtol=1e-4, atol=1e-5)
