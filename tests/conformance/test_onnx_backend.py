"""ONNX's backend test suite through bridge.onnx_backend: what passed keeps passing.

The recorded lists come from `python -m tests.conformance.onnx_suite` (which
also measures them against onnxruntime.backend). Each recorded case runs here
with host fallback allowed; the no-fallback list runs with allow_fallback=False.
"""

import pytest

from tests.conformance.onnx_suite import PASSING, PASSING_NOFALLBACK, run_case


def _names(path):
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("name", _names(PASSING))
def test_case_with_fallback(name):
    result = run_case("braze", name)
    assert result == "pass", result


@pytest.mark.parametrize("name", _names(PASSING_NOFALLBACK))
def test_case_without_fallback(name):
    result = run_case("braze-nofallback", name)
    assert result == "pass", result


def test_lists_are_not_empty():
    assert len(_names(PASSING)) > 1000
