# `make test` and `make bench` each create or reuse .venv and install what they need.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.braze-installed
JOBS   ?= 2
# `make bench CPU="x86-64-v3 x86-64-v2"` also times braze built for those LLVM CPUs
# (x86-64-v3: any AVX2 + FMA CPU; znver3 code may use AMD's SSE4A, absent on Intel)
CPU    ?=

# torch and torchvision must come as a matching pair; these are the versions this
# machine kind's pip serves together (see README, "Set-up").
ARCH := $(shell uname -m)
ifeq ($(ARCH),aarch64)
TORCH_PIN := torch==2.9.1 torchvision==0.24.1
else
TORCH_PIN := torch==2.14.1 torchvision==0.29.1
endif

.PHONY: test test-cross bench venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH_PIN)
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -n $(JOBS) --dist loadgroup
	BRAZE_THREAD_POOL=pool $(PY) -m pytest -q tests/runtime/test_pool.py

# Cross-compiled C libraries (braze compile --emit c --triple aarch64-linux-gnu) linked
# by Debian's cross gcc and run under qemu-aarch64 (installs both; needs root and apt).
test-cross: $(STAMP)
	command -v aarch64-linux-gnu-gcc >/dev/null && command -v qemu-aarch64 >/dev/null || \
	  (apt-get update && apt-get install -y --no-install-recommends \
	   gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)
	$(PY) -m pytest -q -m cross tests/bridge/test_export_c.py

bench: $(STAMP)
	$(PY) -m benchmarks.resnet50 $(if $(CPU),--cpu $(CPU))

clean:
	rm -rf $(VENV) build *.egg-info
