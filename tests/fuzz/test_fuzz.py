"""The fuzz corpus (tests/fuzz): mutants of small valid models, each run in a child
process with a timeout, must give a braze error or onnxruntime's output; never another
exception, a crash, a hang or a different answer (float -> int casts out of range,
which ONNX leaves undefined, apart). A fast subset runs by default; the full corpus
with --runslow. `python -m tests.fuzz` prints the table of counts per class."""

import pytest

from tests.fuzz.mutants import mutants
from tests.fuzz.run import BAD, CLASSES, run_all, table
from tests.fuzz.seeds import seed_models

FAST, FULL = 54, 600  # six per seed model; the full corpus


def _check(count: int) -> None:
    results = run_all(mutants(count))
    print(table(results))
    bad = [f"{r.cls}: {r.name}: {r.detail}" for r in results if r.cls in BAD]
    assert not bad, "\n".join(bad)
    assert {r.cls for r in results} <= set(CLASSES)


def test_seed_models_are_valid_and_match_onnxruntime():
    """Unmutated, every seed model is an 'equal output' (the corpus starts from truth)."""
    from tests.fuzz.run import _Worker

    worker = _Worker()
    try:
        for name, model in seed_models().items():
            r = worker.run(f"seed-{name}", model.SerializeToString(), 120)
            assert r.cls == "equal output", (name, r)
    finally:
        worker.close()


def test_mutants_are_reproducible_and_varied():
    a, b = mutants(60), mutants(60)
    assert a == b
    assert len({data for _, data in a}) >= 55  # a rare edit leaves a model as it was
    assert {name.split("-")[2] for name, _ in a} == {"flip", "truncate", "semantic"}


def test_fuzz_fast_subset():
    _check(FAST)


@pytest.mark.slow
def test_fuzz_full_corpus():
    _check(FULL)
