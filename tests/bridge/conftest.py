"""Fixtures shared by the torch front end's tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def fresh_dynamo():
    """A reset dynamo (no graphs compiled by earlier tests) and a fixed torch seed."""
    import torch

    torch._dynamo.reset()
    torch.manual_seed(0)
    yield
    torch._dynamo.reset()
