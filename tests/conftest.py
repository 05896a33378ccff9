"""Suite-wide options: slow and GPU tests are marked and skipped by default."""

import os
import shutil

import pytest


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", help="also run tests marked slow")


def _has_cuda() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    skip_slow = pytest.mark.skip(reason="slow: run with --runslow")
    skip_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU")
    run_slow = config.getoption("--runslow")
    has_gpu = None
    for item in items:
        if "slow" in item.keywords and not run_slow:
            item.add_marker(skip_slow)
        if "gpu" in item.keywords:
            if has_gpu is None:
                has_gpu = _has_cuda()
            if not has_gpu:
                item.add_marker(skip_gpu)


def pytest_configure(config):
    # the suite runs on as many xdist workers as cores: a compile forking a second
    # process there only oversubscribes them (tests of the parallel compile set it)
    os.environ.setdefault("BRAZE_COMPILE_JOBS", "1")
    # every kernel found a twin by its signature is rendered anyway and its code compared
    # (compiler/codegen/cpu.py: a signature that misses something fails loudly here)
    from compiler.codegen import cpu

    cpu.VERIFY_TWINS = True
