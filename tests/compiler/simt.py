"""A CPU emulator of braze's CUDA kernels, for tests where no GPU is (test code only).

It takes a CudaProgram's LLVM IR (the module the PTX comes from), swaps the NVVM
intrinsics for calls into Python (thread and block ids from a thread-local, the block
barrier and warp shuffles built on threading.Barrier), compiles it for the host and runs
every launch with one OS thread per GPU thread, block after block. Shared memory becomes
one module global, which is right because blocks run one at a time; libdevice calls go
to the host's libm. Races between threads are real, so a missing barrier shows up as
wrong numbers (often, not always: the emulator is no race detector).

The point is to check what the kernels compute (indexing, grid-stride loops, block
reductions, tiles) and the program's slots, constants and arena, not speed: keep shapes
small. A block runs `launch.block` threads; grids are cut to at most MAX_BLOCKS blocks,
which the kernels' grid-stride loops must make up for.
"""

from __future__ import annotations

import ctypes
import re
import threading

import llvmlite.binding as llvm
import numpy as np

from compiler import dtypes
from compiler.codegen import llvm_cpu
from compiler.codegen.cuda import CudaProgram
from compiler.codegen.memory import ALIGN
from runtime.cpu import JitModule

MAX_BLOCKS = 2  # fewer blocks than the launch asks for: exercises grid-stride loops
WARP = 32

_SREG = ctypes.CFUNCTYPE(ctypes.c_int32)
_BARRIER = ctypes.CFUNCTYPE(None, ctypes.c_int32)
_SHFL = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
                         ctypes.c_int32)


class _Block:
    """The state one emulated block shares: its barrier and each warp's shuffle slots."""

    def __init__(self, threads: int):
        self.barrier = threading.Barrier(threads)
        warps = -(-threads // WARP)
        self.warp_barriers = [threading.Barrier(min(WARP, threads - w * WARP))
                              for w in range(warps)]
        # two slot rows per warp, used in turn: a lane writes a row only after every lane
        # has passed the wait of the shuffle before, so has read that row's last values
        self.slots = [[[0] * WARP, [0] * WARP] for _ in range(warps)]
        self.turn = [[0] * WARP for _ in range(warps)]


class Emulator:
    """Loads a CudaProgram's kernels for the host CPU; `run(arrays) -> arrays`."""

    def __init__(self, program: CudaProgram):
        self.program = program
        self.local = threading.local()
        self._callbacks = {  # kept alive as long as the compiled code may call them
            "braze_sim_tid": _SREG(lambda: self.local.tid),
            "braze_sim_ntid": _SREG(lambda: self.local.ntid),
            "braze_sim_ctaid": _SREG(lambda: self.local.ctaid),
            "braze_sim_nctaid": _SREG(lambda: self.local.nctaid),
            "braze_sim_barrier": _BARRIER(lambda _: self.local.block.barrier.wait()),
            "braze_sim_shfl": _SHFL(self._shfl),
        }
        for name, cb in self._callbacks.items():
            llvm.add_symbol(name, ctypes.cast(cb, ctypes.c_void_p).value)
        module = llvm_cpu.optimize(_host_ir(program.llvm_ir))
        self._jit = JitModule(module)
        self._fns = {}
        for launch in program.launches:
            proto = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * len(launch.args))
            self._fns[launch.name] = proto(self._jit.address(launch.name))

    def _shfl(self, mask, value, lane_mask, clamp):
        block = self.local.block
        warp, lane = self.local.tid // WARP, self.local.tid % WARP
        turn = block.turn[warp][lane]
        block.turn[warp][lane] = 1 - turn
        row = block.slots[warp][turn]
        row[lane] = value
        block.warp_barriers[warp].wait()
        return row[lane ^ lane_mask]

    def run(self, arrays: list) -> list[np.ndarray]:
        p = self.program
        buffers: dict[int, np.ndarray] = {}
        for v, a in zip(p.inputs, arrays):
            buffers[p.slots[v]] = np.ascontiguousarray(a, dtype=dtypes.to_numpy(v.dtype))
        for v in p.outputs:
            buffers[p.slots[v]] = _poisoned(v)
        for slot, a in p.constants:
            buffers[slot] = a
        arena = np.full(p.arena_bytes + ALIGN, 0x7F, np.uint8)
        base = arena.ctypes.data + (-arena.ctypes.data) % ALIGN
        address = {s: a.ctypes.data for s, a in buffers.items()}
        address.update({s: base + off for s, off in p.offsets.items()})
        for lc in p.launches:
            self.launch(lc.name, [address[s] for s in lc.args], lc.grid, lc.block)
        by_value = {v: buffers[p.slots[v]] for v in p.outputs}
        by_input = dict(zip(p.inputs, arrays))
        return [by_value[v] if v in by_value else np.array(
            by_input[v] if v in by_input else v.producer.attrs["value"])
            for v in p.graph.outputs]

    def launch(self, name: str, pointers: list[int], grid: int, block: int) -> None:
        """Run kernel `name` on these buffer addresses (at most MAX_BLOCKS blocks)."""
        fn = self._fns[name]
        grid = min(grid, MAX_BLOCKS)
        errors = []
        for ctaid in range(grid):
            shared = _Block(block)

            def thread(tid, ctaid=ctaid, shared=shared):
                loc = self.local
                loc.tid, loc.ntid, loc.ctaid, loc.nctaid = tid, block, ctaid, grid
                loc.block = shared
                try:
                    fn(*pointers)
                except Exception as e:  # pragma: no cover - reported below
                    errors.append(e)

            threads = [threading.Thread(target=thread, args=(t,)) for t in range(block)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        if errors:
            raise errors[0]


def _poisoned(v) -> np.ndarray:
    """An output buffer full of garbage bytes: elements a kernel forgets show up."""
    n = max(v.type.size, 1) * dtypes.itemsize(v.dtype)
    raw = np.full(n, 0x7F, np.uint8)
    return raw.view(dtypes.to_numpy(v.dtype))[:v.type.size].reshape(v.shape)


_RENAMES = [  # llvmlite quotes global names: @"k0"
    (r'@"llvm\.nvvm\.read\.ptx\.sreg\.(tid|ntid|ctaid|nctaid)\.x"', r"@braze_sim_\1"),
    (r'@"llvm\.nvvm\.barrier\.cta\.sync\.aligned\.all"', "@braze_sim_barrier"),
    (r'@"llvm\.nvvm\.shfl\.sync\.bfly\.i32"', "@braze_sim_shfl"),
    (r'@"__nv_(\w+)"', r"@\1"),  # libdevice -> the host's libm
    (r"\baddrspace\(3\)\s*", ""),
    (r"= internal global", "= global"),  # not internal: no moving accesses past a barrier
    (r"\bptx_kernel\s+", ""),
    (r'target triple = "nvptx64-nvidia-cuda"', ""),
]


def _host_ir(text: str) -> str:
    for pattern, repl in _RENAMES:
        text = re.sub(pattern, repl, text)
    return text
