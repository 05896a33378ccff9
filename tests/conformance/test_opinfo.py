"""PyTorch OpInfo cases through torch.compile(backend="braze"): recorded passes keep passing.

The recorded list (opinfo_passing.txt, written by measure_opinfo.py --record) holds
every float32 CPU case that passed with host fallback allowed (strict=True, so a
braze compile error fails rather than runs eagerly). Running all of them takes
~10 minutes on 2 cores, so this test runs a fixed, deterministic sample of
SAMPLE_SIZE cases (an even stride through the sorted list, covering every part of
the op database); `--runslow` runs them all. Cases recorded as passing with
allow_fallback=False are re-checked in that mode too (the coverage figure).
"""

import logging
import warnings
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
# ~0.35 s per case on one core: 240 + 60 cases fit in ~1 minute with -n 2
SAMPLE_SIZE = 240
NOFALLBACK_SAMPLE_SIZE = 60


def _recorded(name: str) -> list[str]:
    path = HERE / name
    return [line.strip() for line in path.read_text().splitlines() if line.strip()] \
        if path.exists() else []


def _sample(cases: list[str], size: int) -> list[str]:
    if len(cases) <= size:
        return cases
    stride = len(cases) / size
    return [cases[int(i * stride)] for i in range(size)]


def pytest_generate_tests(metafunc):
    """Parametrize over the recorded cases (all of them under --runslow)."""
    run_all = metafunc.config.getoption("--runslow")
    for arg, name, size in (("case", "opinfo_passing.txt", SAMPLE_SIZE),
                            ("nofallback_case", "opinfo_passing_nofallback.txt",
                             NOFALLBACK_SAMPLE_SIZE)):
        if arg in metafunc.fixturenames:
            cases = _recorded(name)
            metafunc.parametrize(arg, cases if run_all else _sample(cases, size))


@pytest.fixture(scope="module")
def table():
    pytest.importorskip("expecttest")
    from tests.conformance.measure_opinfo import op_table

    warnings.filterwarnings("ignore")
    logging.getLogger("braze").setLevel(logging.ERROR)
    return op_table()


def _check(table, case: str, mode: str):
    from tests.conformance.measure_opinfo import run_case

    if case.rsplit("#", 1)[0] not in table:
        pytest.fail(f"{case}: the OpInfo is gone from op_db (re-record the list)")
    ok, why = run_case(table, case, mode)
    assert ok is not False, f"{case} regressed ({mode}): {why}"
    assert ok is True, f"{case}: eager no longer runs it ({why}); re-record the list"


def test_recorded_lists_exist():
    assert len(_recorded("opinfo_passing.txt")) > 1000
    assert _recorded("opinfo_passing_nofallback.txt")


def test_opinfo_case(table, case):
    _check(table, case, "braze")


def test_opinfo_case_without_fallback(table, nofallback_case):
    _check(table, nofallback_case, "nofallback")
