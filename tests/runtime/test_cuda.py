"""runtime/cuda.py: braze's PTX run through the CUDA driver API on torch's device memory,
and CUDA graph capture. The tests marked gpu need an NVIDIA GPU (skipped elsewhere: see
tests/conftest.py); the others check the refusals that need none."""

from __future__ import annotations

import ctypes
import sys
import threading

import numpy as np
import pytest

from compiler.codegen import compile_graph
from compiler.errors import BrazeError
from compiler.interp import evaluate
from runtime.cuda import CudaGraph, CudaStep, device_arch, driver, no_device_reason
from runtime.executable import Executable, Step
from tests.compiler.simt import Emulator
from tests.compiler.test_codegen_cuda import ATOL, GRAPHS, RTOL, _graph, _inputs

gpu = pytest.mark.gpu


def _step(name: str) -> CudaStep:
    return CudaStep(compile_graph(_graph(name), target="cuda", arch=device_arch()))


def _check(got: list, want: list, names) -> None:
    for a, b, name in zip(got, want, names):
        a = np.asarray(a)
        assert a.shape == b.shape and a.dtype == b.dtype, name
        if a.dtype.kind == "f":
            np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=name)
        else:
            np.testing.assert_array_equal(a, b, err_msg=name)


def _cuda(arrays: list) -> list:
    import torch

    # np.require keeps a 0-d array 0-d (np.ascontiguousarray makes it 1-d)
    return [torch.from_numpy(np.require(a, requirements="C")).cuda() for a in arrays]


# -- on a GPU ---------------------------------------------------------------------

@gpu
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_numbers_on_torch_tensors(name):
    step = _step(name)
    inputs = _inputs(step.program.graph)
    got = step.run_tensors(_cuda(inputs))
    assert all(t.is_cuda for t in got)
    names = [v.name for v in step.program.graph.outputs]
    _check([t.cpu().numpy() for t in got], evaluate(step.program.graph, inputs), names)


@gpu
def test_numpy_in_numpy_out():
    step = _step("softmax")
    x = _inputs(step.program.graph)
    got = step(x)  # an Executable step on the ONNX path: numpy both ways
    assert isinstance(got[0], np.ndarray)
    _check(got, evaluate(step.program.graph, x), ["y"])


@gpu
def test_kernels_write_torch_memory_in_place():
    """Device memory is shared with torch by address: the kernels write the tensors the
    caller allocated, and read a strided input after one contiguous copy."""
    import torch

    step = _step("layer_norm")
    inputs = _inputs(step.program.graph)
    tensors = _cuda(inputs)
    tensors[0] = tensors[0].t().contiguous().t()  # same values, column-major: copied once
    ins = step.check_inputs(tensors)
    outs, arena = step.allocate()
    before = outs[0].data_ptr()
    step.launch(step.pointers(ins, outs, arena), torch.cuda.current_stream().cuda_stream)
    assert outs[0].data_ptr() == before
    _check([outs[0].cpu().numpy()], evaluate(step.program.graph, inputs), ["y"])


@gpu
def test_threads_share_a_step():
    step = _step("softmax_sum")
    inputs = [_inputs(step.program.graph, seed) for seed in range(4)]
    results = [None] * 4

    def work(i):
        results[i] = step(inputs[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for x, got in zip(inputs, results):
        _check(got, evaluate(step.program.graph, x), ["y"])


@gpu
def test_cuda_graph_replays_a_whole_executable():
    """Two compiled clusters (softmax; layer norm), one CUDA graph; each replay reads new
    inputs and returns fresh outputs."""
    first, second = _step("softmax"), _step("layer_norm")
    ex = Executable(6, input_slots=[0, 2, 3, 4], output_slots=[1, 5],
                    constants={}, steps=[Step(first, (0,), (1,), ()),
                                         Step(second, (2, 3, 4), (5,), ())])
    a = _inputs(first.program.graph) + _inputs(second.program.graph)
    graph = CudaGraph(ex, _cuda(a))
    for seed in (1, 2):
        b = _inputs(first.program.graph, seed) + _inputs(second.program.graph, seed)
        got = graph.run(_cuda(b))
        assert all(g.data_ptr() != o.data_ptr() for g, o in zip(got, graph.outputs))
        want = [evaluate(first.program.graph, b[:1])[0], evaluate(second.program.graph, b[1:])[0]]
        _check([g.cpu().numpy() for g in got], want, ["softmax", "layer_norm"])


@gpu
def test_compile_onnx_runs_on_the_gpu():
    import onnxruntime as ort

    import bridge
    from benchmarks import fusion

    model = fusion.softmax_onnx()
    x = np.random.default_rng(0).standard_normal(fusion.SOFTMAX_SHAPE).astype(np.float32)
    got = bridge.compile_onnx(model, target="cuda")(x)[0]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got, sess.run(None, {"in0": x})[0], rtol=RTOL, atol=ATOL)


# -- the same code on a fake device: the CUDA driver and streams stubbed, kernels run by
# the CPU emulator on CPU tensors (what runtime/cuda.py computes, not CUDA itself) -----

class _FakeStream:
    cuda_stream = 0

    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, other):
        pass


class _FakeDriver:
    """The driver calls runtime/cuda.py makes: modules are the emulators of programs
    (found by their PTX), launches run there, stream capture records launches and a graph
    launch replays them."""

    class CUresult:
        CUDA_SUCCESS = 0

    class CUstreamCaptureMode:
        CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1

    def __init__(self):
        self.emulators, self.capturing, self.launched = {}, None, 0

    def CUstream(self, handle):
        return handle

    def cuModuleLoadData(self, image):
        return 0, self.emulators[image[:-1].decode()]

    def cuModuleGetFunction(self, module, name):
        return 0, (module, name.decode())

    def cuModuleUnload(self, module):
        return (0,)

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        emulator, name = fn
        n = len(next(lc for lc in emulator.program.launches if lc.name == name).args)
        slots = (ctypes.c_void_p * n).from_address(params)
        pointers = [ctypes.c_void_p.from_address(slots[i]).value for i in range(n)]
        call = lambda: emulator.launch(name, pointers, gx, bx)  # noqa: E731
        self.launched += 1
        if self.capturing is None:
            call()
        else:
            self.capturing.append(call)
        return (0,)

    def cuStreamBeginCapture(self, stream, mode):
        self.capturing = []
        return (0,)

    def cuStreamEndCapture(self, stream):
        graph, self.capturing = self.capturing, None
        return 0, graph

    def cuGraphInstantiate(self, graph, flags):
        return 0, graph

    def cuGraphLaunch(self, graph, stream):
        for call in graph:
            call()
        return (0,)


@pytest.fixture
def fake_cuda(monkeypatch):
    import contextlib

    import torch

    import runtime.cuda as rc

    fake = _FakeDriver()
    monkeypatch.setattr(rc, "driver", lambda: fake)
    monkeypatch.setattr(rc, "no_device_reason", lambda: None)
    monkeypatch.setattr(rc, "_make_current", lambda device: None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _FakeStream())
    monkeypatch.setattr(torch.cuda, "Stream", _FakeStream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, s: None)
    return fake


def _fake_step(fake, name: str) -> CudaStep:
    import torch

    program = compile_graph(_graph(name), target="cuda")
    fake.emulators[program.ptx] = Emulator(program)
    return CudaStep(program, device=torch.device("cpu"))


@pytest.mark.parametrize("name", ["softmax", "matmul_bias_relu"])  # (constants, arena)
def test_fake_device_step(fake_cuda, name):
    import torch

    step = _fake_step(fake_cuda, name)
    inputs = _inputs(step.program.graph)
    got = step.run_tensors([torch.from_numpy(a) for a in inputs])
    assert fake_cuda.launched == len(step.program.launches)
    names = [v.name for v in step.program.graph.outputs]
    _check([t.numpy() for t in got], evaluate(step.program.graph, inputs), names)
    _check(step(inputs), evaluate(step.program.graph, inputs), names)  # numpy path


def test_fake_device_cuda_graph(fake_cuda):
    import torch

    first, second = _fake_step(fake_cuda, "softmax"), _fake_step(fake_cuda, "elementwise")
    ex = Executable(8, input_slots=[0, 2, 3, 4], output_slots=[1, 5, 6, 7, 2],  # %a: input
                    constants={}, steps=[Step(first.run, (0,), (1,), ()),
                                         Step(second, (2, 3, 4), (5, 6, 7), ())])
    a = _inputs(first.program.graph) + _inputs(second.program.graph)
    graph = CudaGraph(ex, [torch.from_numpy(x) for x in a])
    captured = fake_cuda.launched
    for seed in (1, 2):
        b = _inputs(first.program.graph, seed) + _inputs(second.program.graph, seed)
        got = graph.run([torch.from_numpy(x) for x in b])
        assert fake_cuda.launched == captured  # replays launch nothing new themselves
        assert all(g.data_ptr() != o.data_ptr() for g, o in zip(got, graph.outputs))
        want = evaluate(first.program.graph, b[:1]) + evaluate(second.program.graph, b[1:])
        _check([g.numpy() for g in got], want + [b[1]], ["softmax", "y", "gt", "n", "a"])


# -- refusals that need no GPU -------------------------------------------------------

def test_capture_refuses_host_steps():
    ex = Executable(2, [0], [1], {}, [Step(lambda xs: xs, (0,), (1,), (), "host cluster 0")])
    with pytest.raises(BrazeError, match="cannot capture a CUDA graph: host cluster 0"):
        CudaGraph(ex, [np.zeros(1)])


def test_missing_cuda_python_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    with pytest.raises(BrazeError, match=r"pip install 'braze\[gpu\]'"):
        driver()


@pytest.mark.skipif(no_device_reason() is None, reason="a CUDA device is present")
def test_no_device_is_a_clear_error():
    program = compile_graph(_graph("softmax"), target="cuda")
    with pytest.raises(BrazeError, match="no CUDA device was found"):
        CudaStep(program)
