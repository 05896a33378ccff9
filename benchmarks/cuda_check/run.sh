#!/bin/bash
# braze's CUDA target on a real GPU, from the repository root: the tests marked gpu and
# the CUDA bridge tests, then every model of make_models.py through
# compile_onnx(target="cuda") against onnxruntime (e2e.py). Where the machine's llvmlite
# is older than braze's, put a llvmlite wheel for its Python in .whl/ first (pip download
# --only-binary=:all: --python-version 3.12 -d .whl llvmlite==0.50.0): it is installed
# into /tmp/site. Logs go to $OUT (default /tmp).
OUT=${OUT:-/tmp}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv
python3 -c "import torch, llvmlite, onnx, onnxruntime; from cuda import bindings; print('torch', torch.__version__, 'llvmlite', llvmlite.__version__, 'onnx', onnx.__version__, 'ort', onnxruntime.__version__, 'cuda.bindings', bindings.__version__, torch.cuda.get_device_name())"
timeout 150 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short \
  tests/runtime/test_cuda.py tests/bridge/test_cuda_target.py tests/compiler/test_codegen_cuda.py 2>&1 | tee $OUT/tests.log | tail -60
timeout 90 python3 benchmarks/cuda_check/make_models.py 2>&1 | tail -5
timeout 150 python3 benchmarks/cuda_check/e2e.py 2>&1 | tee $OUT/e2e.log
