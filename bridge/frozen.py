"""Frozen weights: noticing, at each call, that tensors braze compiled in as constants
have changed since, so the graph is compiled again rather than run with stale weights.

Three checks, all on every call of a graph with frozen weights:
1. storage: each weight's data pointer (`p.data = t`, a new Parameter, `to()`);
2. version counters (in-place ops under no_grad, optimizer steps, load_state_dict);
3. a fingerprint: for in-place writes that bump no version counter (through
   `p.data`: `p.data.mul_(2)`, `p.data.copy_(w)`, `p.data[:] = w`, EMA updates),
   SAMPLES elements of each weight, its first SAMPLES / 2 and its last SAMPLES / 2
   (all of a smaller one), compared byte for byte with their values when compiled. The
   bytes' addresses are listed once; one call of a small compiled function reads and
   compares them all (one `torch.cat` of the samples cost ~0.3 ms and a Python loop
   over them more).

Each sampled stretch is one or two cache lines on one or two pages, whatever the
weight's size: the check runs right after the previous call's kernels have evicted
the weights from cache (after a pause, from the TLB too), so what it costs is the
lines and pages it touches, not its instructions. On mobilenet_v2 (262 weights),
timed right after a 100 ms pause and one call, the fingerprint of evenly spaced
samples (up to 16 lines and pages a weight) cost ~0.3 ms of a 5 ms call, this one
~0.13 ms; with benchmarks/zoo.py's 20 ms of lead-in calls both were within that
machine's noise. The storage and version reads (~0.2 ms there) remain.

A write through `.data` that leaves every sampled element as it was (entries in the
middle of a weight changed by hand, say) is not seen; README.md, "Three ways to use
it", says so.
"""

from __future__ import annotations

import ctypes
import functools
import operator

import numpy as np
import torch

# Elements sampled per weight (half at each end; all of a weight this small): a
# whole-tensor update changes them all.
SAMPLES = 8

_VERSION = operator.attrgetter("_version")


class FrozenWeights:
    """The frozen inputs of one graph (`indices` into its arguments), as last seen."""

    def __init__(self, indices):
        self.indices = tuple(sorted(indices))
        # the weights out of a call's arguments, in one C call (a tuple)
        self._take = (operator.itemgetter(*self.indices) if len(self.indices) > 1 else
                      lambda args: tuple(args[i] for i in self.indices))
        self._state = None  # (data pointers, versions) last seen
        self._fingerprint: Fingerprint | None = None

    def changed(self, args) -> bool:
        """Whether the frozen weights in `args` differ from those of the previous call
        (False at the first); remembers them either way."""
        weights = self._take(args)
        state = _state(weights)
        if self._state is not None and state == self._state and self._fingerprint.same():
            return False
        first = self._state is None
        self._state = state
        self._fingerprint = Fingerprint(weights)
        return not first


def _state(weights) -> object:
    """Data pointers and version counters (maps over C functions: no Python frame each).
    A non-tensor among them makes data_ptr raise TypeError: then one pair (or None) per
    weight instead."""
    try:
        return list(map(torch.Tensor.data_ptr, weights)), list(map(_VERSION, weights))
    except TypeError:
        return [(a.data_ptr(), a._version) if isinstance(a, torch.Tensor) else None
                for a in weights]


class Fingerprint:
    """Sampled elements of tensors: `same()` says whether they still hold the bytes they
    held when the fingerprint was taken. A CPU tensor's samples are read in place by
    compiled code, through views that keep its memory alive (a weight given new storage
    leaves the old one readable); any other's (on another device, or not one dense
    block) through a copy each time."""

    def __init__(self, tensors: list):
        addresses = []
        self._views = []
        self._copied = []
        for t in tensors:
            if not isinstance(t, torch.Tensor) or t.numel() == 0:
                continue
            flat = _flat_view(t) if t.device.type == "cpu" else None
            if flat is None:
                self._copied.append(t)
            else:
                self._views.append(flat)
                addresses.append(_sample_addresses(flat))
        self._addresses = np.concatenate(addresses) if addresses else np.zeros(0, np.uint64)
        self._bytes = np.empty(len(self._addresses), np.uint8)
        native().gather(self._addresses.ctypes.data, self._bytes.ctypes.data,
                        len(self._addresses))
        self._copies = [_samples(t) for t in self._copied]

    def same(self) -> bool:
        n = len(self._addresses)
        if native().first_difference(self._addresses.ctypes.data, self._bytes.ctypes.data,
                                     n) != n:
            return False
        return all(map(torch.equal, map(_samples, self._copied), self._copies))


def _flat_view(t: torch.Tensor) -> torch.Tensor | None:
    """A 1-D view of every element of `t` (its dims ordered by stride: channels-last
    weights too), or None when its memory is not one dense block."""
    t = t.detach()
    if t.layout is not torch.strided:
        return None
    if not t.is_contiguous():
        order = sorted(range(t.dim()), key=t.stride, reverse=True)
        t = t.permute(order)
        if not t.is_contiguous():
            return None
    return t.view(-1)


def _sample_indices(n: int) -> np.ndarray:
    """The first and the last SAMPLES / 2 indices of range(n) (all of them up to
    SAMPLES), ascending."""
    if n <= SAMPLES:
        return np.arange(n, dtype=np.uint64)
    half = SAMPLES // 2
    return np.concatenate([np.arange(half), np.arange(n - half, n)]).astype(np.uint64)


def _sample_addresses(flat: torch.Tensor) -> np.ndarray:
    """The address of every byte of the sampled elements of a dense 1-D CPU tensor."""
    size = flat.element_size()
    at = flat.data_ptr() + _sample_indices(flat.numel()) * np.uint64(size)
    return (at[:, None] + np.arange(size, dtype=np.uint64)).reshape(-1)


def _samples(t: torch.Tensor) -> torch.Tensor:
    """The sampled elements of any tensor, as bytes (a fresh copy)."""
    flat = t.detach().reshape(-1)
    idx = torch.from_numpy(_sample_indices(flat.numel()).astype(np.int64)).to(flat.device)
    return flat[idx].contiguous().view(torch.uint8)


# gather(addresses, out, n): out[i] = *addresses[i]; first_difference(addresses, seen, n):
# the first i where *addresses[i] != seen[i], else n. Addresses are loaded as pointers
# from the table (no integer-to-pointer casts), bytes read one at a time.
_NATIVE_IR = """
define void @gather(ptr %addrs, ptr %out, i64 %n) {
entry:
  %empty = icmp eq i64 %n, 0
  br i1 %empty, label %exit, label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %next, %loop ]
  %slot = getelementptr ptr, ptr %addrs, i64 %i
  %p = load ptr, ptr %slot
  %b = load i8, ptr %p
  %dst = getelementptr i8, ptr %out, i64 %i
  store i8 %b, ptr %dst
  %next = add i64 %i, 1
  %more = icmp ult i64 %next, %n
  br i1 %more, label %loop, label %exit
exit:
  ret void
}

define i64 @first_difference(ptr %addrs, ptr %seen, i64 %n) {
entry:
  %empty = icmp eq i64 %n, 0
  br i1 %empty, label %exit, label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %next, %cont ]
  %slot = getelementptr ptr, ptr %addrs, i64 %i
  %p = load ptr, ptr %slot
  %b = load i8, ptr %p
  %sp = getelementptr i8, ptr %seen, i64 %i
  %s = load i8, ptr %sp
  %eq = icmp eq i8 %b, %s
  br i1 %eq, label %cont, label %exit
cont:
  %next = add i64 %i, 1
  %more = icmp ult i64 %next, %n
  br i1 %more, label %loop, label %exit
exit:
  %r = phi i64 [ %n, %entry ], [ %i, %loop ], [ %n, %cont ]
  ret i64 %r
}
"""


class _Native:
    """The two functions above, compiled for this CPU once per process."""

    def __init__(self):
        from compiler.codegen import llvm_cpu
        from runtime.cpu import JitModule

        self._jit = JitModule(object_code=llvm_cpu.compile_ir(_NATIVE_IR))
        args = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
        self.gather = ctypes.CFUNCTYPE(None, *args)(self._jit.address("gather"))
        self.first_difference = ctypes.CFUNCTYPE(ctypes.c_int64, *args)(
            self._jit.address("first_difference"))


@functools.cache
def native() -> _Native:
    return _Native()
