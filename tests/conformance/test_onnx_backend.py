"""ONNX's backend test suite through bridge.onnx_backend: what passed keeps passing.

The recorded lists come from `python -m tests.conformance.onnx_suite` (which
also measures them against onnxruntime.backend). Each recorded case runs here
with host fallback allowed; the no-fallback list runs with allow_fallback=False.
Every kind the onnx wheel ships is in them, the `light` real models included
(AlexNet ... ZFNet-512: 30 s to minutes each, so they are marked slow). A case
onnxruntime passes and braze does not yet is kept in onnx_expected_failures.txt
with its reason; it must still fail (once it passes, move it to the lists).
"""

import pytest

from tests.conformance.onnx_suite import (
    EXPECTED_FAILURES,
    PASSING,
    PASSING_NOFALLBACK,
    expected_failures,
    real_model_names,
    run_case,
)


def _names(path):
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


def _params(names):
    light = set(real_model_names())
    return [pytest.param(n, marks=pytest.mark.slow) if n in light else n for n in names]


@pytest.mark.parametrize("name", _params(_names(PASSING)))
def test_case_with_fallback(name):
    result = run_case("braze", name)
    assert result == "pass", result


@pytest.mark.parametrize("name", _params(_names(PASSING_NOFALLBACK)))
def test_case_without_fallback(name):
    result = run_case("braze-nofallback", name)
    assert result == "pass", result


@pytest.mark.parametrize("name", _params(sorted(expected_failures())))
def test_expected_failure(name):
    result = run_case("braze", name)
    if result == "pass":
        pytest.fail(f"{name} passes now: move it from {EXPECTED_FAILURES.name} to "
                    f"{PASSING.name}")
    pytest.xfail(f"{expected_failures()[name]}; now: {result}")


def test_lists_are_not_empty():
    assert len(_names(PASSING)) > 1000


def test_every_light_model_is_recorded():
    """Each light model the wheel ships is a recorded pass or an expected failure."""
    recorded = set(_names(PASSING)) | set(expected_failures())
    light = set(real_model_names())
    assert len(light) >= 9
    assert light <= recorded, sorted(light - recorded)
