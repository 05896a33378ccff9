"""The threads braze's kernels share their loops with (compiler/codegen/parallel.py).

Compiled code calls `braze_parallel`; `install()` (once per process, before any
cluster's code is loaded: runtime/cpu.py's JitModule calls it) compiles the definition
this machine gets and registers its address under that name, so every loaded cluster
calls it:

- GNU OpenMP's `GOMP_parallel` (each thread of the team a static share), the default:
  under torch it is the same libgomp team torch's own ops use;
- braze's own pool (`parallel.pool_module`) on Linux x86_64 and AArch64 when
  BRAZE_THREAD_POOL=pool (opt-in; see below why not the default): its workers
  are daemon Python threads, each inside one ctypes call of `braze_worker(id)` that
  never returns (ctypes releases the GIL: they never run Python again);
  `ensure_workers(n)` starts them as clusters ask for threads. A forked child has none
  of its parent's threads: it resets the pool and starts as many workers of its own;
- the calling thread alone where libgomp is missing.

Why the pool is opt-in: it keeps a model's speed when other processes load the cores
(ResNet-50 batch 1 182 ms against OpenMP's 892 under a load of 7-9), but on a quiet
machine its worker polls only ~200 us before sleeping, and two front ends lose to that:
the torch path, whose per-call overhead (dynamo's guards, the frozen-weight check) is
longer than the poll, so every call wakes a sleeping worker that the small kernels
finish without (zoo, quiet: mobilenet_v3_small 3.0 ms against 1.3 with OpenMP,
TransformerEncoder 4.6 against 2.5); and a split recurrence, whose OpenMP team then
shares the cores with a polling worker (the LSTM 3.3-3.5 ms against 2.4). Polling 2 ms
cured the first and made the second 7.7 ms.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading

import llvmlite.binding as llvm

from compiler import target as targets
from compiler.codegen import llvm_cpu, parallel

ENV = "BRAZE_THREAD_POOL"  # "pool": braze's own pool instead of OpenMP's static split
_WORKER = ctypes.CFUNCTYPE(None, ctypes.c_int32)
_RESET = ctypes.CFUNCTYPE(None)
_lock = threading.Lock()  # held while workers start
_install_lock = threading.Lock()
_state = {"workers": 0}


def install() -> str:
    """Compile and register `braze_parallel` for this process, once (whichever thread
    asks first); returns which one: "pool", "gomp" or "serial"."""
    with _install_lock:
        return _install()


@functools.cache
def _install() -> str:
    from runtime.cpu import JitModule  # runtime/cpu.py imports this module

    triple = targets.host().triple
    if parallel.has_pool(triple) and os.environ.get(ENV, "gomp") == "pool":
        kind, text = "pool", parallel.pool_module(triple)
    elif llvm_cpu.libgomp():
        kind, text = "gomp", parallel.gomp_module(triple)
    else:
        kind, text = "serial", parallel.serial_module(triple)
    # handed to the engine as IR: a few loops need no optimizer, and loading a saved
    # artifact runs none (tests/bridge/test_artifact.py)
    module = llvm.parse_assembly(text)
    module.verify()
    jit = JitModule(module=module, own_symbols=True)
    llvm.add_symbol(parallel.PARALLEL, jit.address(parallel.PARALLEL))
    _state["jit"] = jit  # the code stays loaded for the life of the process
    if kind == "pool":
        _state["worker"] = _WORKER(jit.address(parallel.WORKER))
        _state["reset"] = _RESET(jit.address(parallel.RESET))
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_after_fork)
    return kind


def address() -> int:
    """Where the installed `braze_parallel` is (void (ptr nest, ptr table, i64 outer,
    i32 threads))."""
    install()
    return _state["jit"].address(parallel.PARALLEL)


def ensure_workers(threads: int) -> None:
    """At least `threads - 1` workers running (braze's pool only; the caller is the
    first thread of every job)."""
    if install() != "pool":
        return
    with _lock:
        for i in range(_state["workers"], threads - 1):
            threading.Thread(target=_state["worker"], args=(i,), daemon=True,
                             name=f"braze-worker-{i}").start()
            _state["workers"] = i + 1


def workers() -> int:
    """Workers started in this process."""
    return _state["workers"]


def _after_fork() -> None:
    """In a forked child: the pool idle, and as many workers as the parent had."""
    global _lock, _install_lock
    # the parent's locks may have been held by another thread
    _lock, _install_lock = threading.Lock(), threading.Lock()
    wanted, _state["workers"] = _state["workers"], 0
    _state["reset"]()
    ensure_workers(wanted + 1)
