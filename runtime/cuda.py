"""Running braze's PTX on NVIDIA GPUs through the CUDA driver API (cuda-python).

`CudaStep(program)` loads a compiled cluster (compiler.codegen.cuda.CudaProgram: PTX and
its launches) into the device's primary context, the one torch uses, and launches its
kernels on torch's current stream. Buffers are torch CUDA tensors passed by `data_ptr()`:
braze and torch share device memory without copies. Outputs and the intermediates'
arena come from torch's caching allocator on that stream, so calls share nothing mutable
and several threads may run one step at once.

`CudaGraph(executable, example_inputs)` captures every launch of an Executable whose steps
all run on the GPU as one CUDA graph, with every buffer allocated once; `run` replays it.

cuda-python (the `gpu` extra: pip install 'braze[gpu]') and torch's CUDA are imported on
first use: importing this module needs neither, nor a GPU.
"""

from __future__ import annotations

import ctypes
import functools
import threading

import numpy as np

from compiler import dtypes
from compiler.codegen import nvptx
from compiler.codegen.memory import ALIGN
from compiler.errors import BrazeError, InputError


def driver():
    """cuda-python's driver bindings, or a BrazeError saying how to install them."""
    try:
        from cuda.bindings import driver as drv
    except ImportError:
        raise BrazeError("running braze's kernels on CUDA needs cuda-python's driver "
                         "bindings: pip install 'braze[gpu]'") from None
    return drv


def check(result, what: str):
    """The values of a driver call's (CUresult, values...) tuple; BrazeError on failure."""
    drv = driver()
    err, *values = result
    if err != drv.CUresult.CUDA_SUCCESS:
        _, msg = drv.cuGetErrorString(err)
        text = msg.decode() if isinstance(msg, bytes) else str(msg)
        raise BrazeError(f"CUDA: {what} failed: {getattr(err, 'name', err)}: {text}")
    return values[0] if len(values) == 1 else tuple(values) or None


def no_device_reason() -> str | None:
    """None if braze can run on a CUDA device here, else why not."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device was found (torch.cuda.is_available() is False)"
    return None


def require_device() -> None:
    reason = no_device_reason()
    if reason is not None:
        raise BrazeError(f"target 'cuda': {reason}")


def device_arch(device: int | None = None) -> str:
    """The architecture to emit PTX for on `device` (torch's current one by default)."""
    import torch

    return nvptx.best_arch(*torch.cuda.get_device_capability(device))


@functools.cache
def _primary_context(device: int):
    import torch

    torch.cuda.init()
    drv = driver()
    check(drv.cuInit(0), "cuInit")
    dev = check(drv.cuDeviceGet(device), "cuDeviceGet")
    return check(drv.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")


def _make_current(device: int) -> None:
    """Bind the device's primary context (torch's) to the calling thread."""
    check(driver().cuCtxSetCurrent(_primary_context(device)), "cuCtxSetCurrent")


class _Module:
    """PTX loaded by the driver (JIT-compiled for the device), with its kernels."""

    def __init__(self, ptx: str, names: list[str], device: int):
        drv = driver()
        _make_current(device)
        self.handle = check(drv.cuModuleLoadData(ptx.encode() + b"\0"),
                            "loading braze's PTX (cuModuleLoadData)")
        self.functions = {n: check(drv.cuModuleGetFunction(self.handle, n.encode()),
                                   f"finding kernel {n}") for n in names}

    def __del__(self):
        try:
            driver().cuModuleUnload(self.handle)
        except Exception:  # interpreter shutdown: the driver may be gone already
            pass


class CudaStep:
    """A compiled cluster on a CUDA device: an Executable step (see `__call__`) and, with
    torch CUDA tensors, `run_tensors` (no copies)."""

    def __init__(self, program, device=None):
        """`device`: a CUDA device index or torch.device (default: torch's current one)."""
        import torch

        from runtime.fallback_torch import to_torch, torch_dtype

        require_device()
        self.program = program
        if not isinstance(device, torch.device):
            device = torch.device("cuda", device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self._module = _Module(program.ptx, [lc.name for lc in program.launches],
                               device.index)
        self._constants = {s: to_torch(a).to(self.device) for s, a in program.constants}
        self._in = [(v.shape, torch_dtype(v.dtype)) for v in program.inputs]
        self._in_numpy = [dtypes.to_numpy(v.dtype) for v in program.inputs]
        self._out = [(v.shape, torch_dtype(v.dtype)) for v in program.outputs]

    def __call__(self, arrays: list) -> list:
        """Torch CUDA tensors in, torch CUDA tensors out; otherwise (numpy arrays: the ONNX
        path) copied to the device and the results back to numpy."""
        import torch

        from runtime.fallback_torch import to_numpy, to_torch

        if arrays and all(isinstance(a, torch.Tensor) and a.is_cuda for a in arrays):
            return self.run_tensors(arrays)
        if len(arrays) != len(self._in):
            raise InputError(f"compiled cluster takes {len(self._in)} inputs, "
                             f"got {len(arrays)}")
        tensors = [to_torch(np.asarray(a, dtype=dt)).to(self.device)
                   for a, dt in zip(arrays, self._in_numpy)]
        return [to_numpy(t.cpu()) for t in self.run_tensors(tensors)]

    run = __call__

    def run_tensors(self, tensors: list) -> list:
        """Run on torch CUDA tensors (the current stream); fresh output tensors."""
        import torch

        ins = self.check_inputs(tensors)
        outs, arena = self.allocate()
        self.launch(self.pointers(ins, outs, arena),
                    torch.cuda.current_stream(self.device).cuda_stream)
        return self.results(ins, outs)

    def check_inputs(self, tensors: list) -> list:
        """The inputs as contiguous tensors on this device; InputError if they do not fit."""
        if len(tensors) != len(self._in):
            raise InputError(f"compiled cluster takes {len(self._in)} inputs, "
                             f"got {len(tensors)}")
        out = []
        for v, t, (shape, dtype) in zip(self.program.inputs, tensors, self._in):
            if tuple(t.shape) != shape or t.dtype != dtype or t.device != self.device:
                raise InputError(f"input %{v.name} must be a {dtype} tensor of shape {shape} "
                                 f"on {self.device}, got {t.dtype} {tuple(t.shape)} on "
                                 f"{t.device}")
            out.append(t.contiguous())
        return out

    def allocate(self) -> tuple[list, object]:
        """Fresh output tensors and an arena for the intermediates (current stream)."""
        import torch

        outs = [torch.empty(shape, dtype=dtype, device=self.device)
                for shape, dtype in self._out]
        arena = torch.empty(self.program.arena_bytes + ALIGN, dtype=torch.uint8,
                            device=self.device)
        return outs, arena

    def pointers(self, ins: list, outs: list, arena) -> dict[int, int]:
        """Slot -> device address of every buffer the kernels take."""
        p = self.program
        table = {p.slots[v]: t.data_ptr() for v, t in zip(p.inputs, ins)}
        table.update({p.slots[v]: t.data_ptr() for v, t in zip(p.outputs, outs)})
        table.update({s: t.data_ptr() for s, t in self._constants.items()})
        base = arena.data_ptr() + (-arena.data_ptr()) % ALIGN
        table.update({s: base + off for s, off in p.offsets.items()})
        return table

    def launch(self, table: dict[int, int], stream: int) -> None:
        """Enqueue every kernel on `stream` (a CUstream handle), in order."""
        drv = driver()
        _make_current(self.device.index)
        handle = drv.CUstream(stream)
        for lc in self.program.launches:
            n = len(lc.args)
            values = (ctypes.c_void_p * n)(*[table[s] for s in lc.args])
            # kernelParams: one pointer per parameter, to where its value is
            params = (ctypes.c_void_p * n)(*[ctypes.addressof(values) + i *
                                             ctypes.sizeof(ctypes.c_void_p) for i in range(n)])
            check(drv.cuLaunchKernel(self._module.functions[lc.name], lc.grid, 1, 1,
                                     lc.block, 1, 1, 0, handle, ctypes.addressof(params), 0),
                  f"launching {lc.name} of cluster {self.program.graph.name}")

    def results(self, ins: list, outs: list, copy: bool = True) -> list:
        """The graph's outputs in order: computed ones, and inputs or constants it passes
        through, and repeats (fresh copies unless `copy` is False)."""
        p = self.program
        by_value = dict(zip(p.outputs, outs))
        by_input = dict(zip(p.inputs, ins))
        results, seen = [], set()
        for v in p.graph.outputs:
            if v in by_value:
                t = by_value[v].clone() if v in seen and copy else by_value[v]
                seen.add(v)
            elif v in by_input:
                t = by_input[v].clone() if copy else by_input[v]
            else:
                t = self._constant(v)
            results.append(t)
        return results

    def _constant(self, v):
        from runtime.fallback_torch import to_torch

        slot = self.program.slots.get(v)
        if slot in self._constants:
            return self._constants[slot].clone()
        return to_torch(np.array(v.const_value)).to(self.device)


def cuda_step(fn) -> CudaStep | None:
    """The CudaStep behind an Executable step's function (it or its bound `run`), or None."""
    owner = getattr(fn, "__self__", fn)
    return owner if isinstance(owner, CudaStep) else None


class CudaGraph:
    """An Executable whose steps all run on the GPU, captured once as one CUDA graph.

    Every buffer (inputs, outputs, intermediates) is allocated once, at capture. `run`
    copies the inputs into the graph's input buffers, replays the graph and returns fresh
    copies of its outputs (never its own buffers). Replays share those buffers, so `run`
    serializes callers (a lock, and one stream of the graph's own).
    """

    def __init__(self, executable, example_inputs: list):
        import torch

        from runtime.fallback_torch import to_torch

        steps = [cuda_step(s.fn) for s in executable.steps]
        host = [s.label for s, c in zip(executable.steps, steps) if c is None]
        if host:
            raise BrazeError(f"cannot capture a CUDA graph: {', '.join(host)} "
                             "do(es) not run on the GPU")
        if not steps:
            raise BrazeError("cannot capture a CUDA graph: the executable has no steps")
        if len(example_inputs) != len(executable.input_slots):
            raise InputError(f"the executable takes {len(executable.input_slots)} inputs, "
                             f"got {len(example_inputs)}")
        self.device = steps[0].device
        env: list = [None] * executable.n_slots
        self.inputs = []
        for s, t in zip(executable.input_slots, example_inputs):
            env[s] = torch.empty(t.shape, dtype=t.dtype, device=self.device)
            env[s].copy_(t)
            self.inputs.append(env[s])
        for s, a in executable.constants.items():
            env[s] = to_torch(np.asarray(a)).to(self.device)
        self._plan, self._arenas = [], []
        for step, cs in zip(executable.steps, steps):
            ins = cs.check_inputs([env[i] for i in step.args])
            outs, arena = cs.allocate()
            self._plan.append((cs, cs.pointers(ins, outs, arena)))
            self._arenas.append(arena)
            for s, t in zip(step.results, cs.results(ins, outs, copy=False)):
                env[s] = t
        self.outputs = [env[s] for s in executable.output_slots]
        self._env = env  # keeps every buffer the graph uses alive
        self._lock = threading.Lock()
        self._stream = torch.cuda.Stream(self.device)
        self._exec = self._capture()

    def _capture(self):
        import torch

        drv = driver()
        self._stream.wait_stream(torch.cuda.current_stream(self.device))  # input copies
        handle = drv.CUstream(self._stream.cuda_stream)
        for cs, table in self._plan:  # once eagerly: the driver loads kernels lazily
            cs.launch(table, self._stream.cuda_stream)
        mode = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        check(drv.cuStreamBeginCapture(handle, mode), "cuStreamBeginCapture")
        try:
            for cs, table in self._plan:
                cs.launch(table, self._stream.cuda_stream)
        except BaseException:
            drv.cuStreamEndCapture(handle)
            raise
        self._graph = check(drv.cuStreamEndCapture(handle), "cuStreamEndCapture")
        return check(drv.cuGraphInstantiate(self._graph, 0), "cuGraphInstantiate")

    def run(self, tensors: list) -> list:
        import torch

        if len(tensors) != len(self.inputs):
            raise InputError(f"the CUDA graph takes {len(self.inputs)} inputs, "
                             f"got {len(tensors)}")
        for static, t in zip(self.inputs, tensors):
            if t.shape != static.shape or t.dtype != static.dtype:
                raise InputError(f"the CUDA graph was captured for {static.dtype} "
                                 f"{tuple(static.shape)}, got {t.dtype} {tuple(t.shape)}")
        drv = driver()
        caller = torch.cuda.current_stream(self.device)
        with self._lock:
            self._stream.wait_stream(caller)
            with torch.cuda.stream(self._stream):
                for static, t in zip(self.inputs, tensors):
                    static.copy_(t)
                check(drv.cuGraphLaunch(self._exec, drv.CUstream(self._stream.cuda_stream)),
                      "cuGraphLaunch")
                outs = [o.clone() for o in self.outputs]
            caller.wait_stream(self._stream)
        for o in outs:
            o.record_stream(caller)  # the caller's stream uses them next
        return outs
