"""Frozen weights: noticing, at each call, that tensors braze compiled in as constants
have changed since, so the graph is compiled again rather than run with stale weights.

Three checks, all on every call of a graph with frozen weights:
1. storage: each weight's data pointer (`p.data = t`, a new Parameter, `to()`);
2. version counters (in-place ops under no_grad, optimizer steps, load_state_dict);
3. a fingerprint: for in-place writes that bump no version counter (through
   `p.data`: `p.data.mul_(2)`, `p.data.copy_(w)`, `p.data[:] = w`, EMA updates),
   SAMPLES elements of each weight, its first SAMPLES / 2 and its last SAMPLES / 2
   (all of a smaller one), compared with their values when compiled, as the 8-byte
   words that cover them (at least one word at each end; a weight under 8 bytes byte
   by byte). The words' addresses are listed once; one call of a small compiled
   function reads and compares them all (one `torch.cat` of the samples cost ~0.3 ms
   and a Python loop over them more; reading the same samples a byte at a time, 8384
   addresses on mobilenet_v2, ~0.12 ms on cold caches, words ~0.06 ms).

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
# The fingerprint reads 8-byte words (a weight smaller than that byte by byte).
WORD = 8

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
        words, single = [], []
        self._views = []
        self._copied = []
        for t in tensors:
            if not isinstance(t, torch.Tensor) or t.numel() == 0:
                continue
            flat = _flat_view(t) if t.is_cpu else None
            if flat is None:
                self._copied.append(t)
                continue
            self._views.append(flat)
            nbytes = flat.numel() * flat.element_size()
            at = np.uint64(flat.data_ptr())
            if nbytes < WORD:
                single.append(at + np.arange(nbytes, dtype=np.uint64))
            else:
                span = (SAMPLES // 2) * flat.element_size()
                words.append(at + _word_offsets(nbytes, span))
        self._words = _table(words)
        self._bytes = _table(single)
        self._seen_words = np.empty(len(self._words), np.uint64)
        self._seen_bytes = np.empty(len(self._bytes), np.uint8)
        lib = native()
        lib.gather_words(self._words.ctypes.data, self._seen_words.ctypes.data,
                         len(self._words))
        lib.gather_bytes(self._bytes.ctypes.data, self._seen_bytes.ctypes.data,
                         len(self._bytes))
        self._copies = [_samples(t) for t in self._copied]

    def same(self) -> bool:
        lib, n, m = native(), len(self._words), len(self._bytes)
        if lib.first_word_difference(self._words.ctypes.data, self._seen_words.ctypes.data,
                                     n) != n:
            return False
        if m and lib.first_byte_difference(self._bytes.ctypes.data,
                                           self._seen_bytes.ctypes.data, m) != m:
            return False
        return all(map(torch.equal, map(_samples, self._copied), self._copies))

    def sampled_bytes(self) -> int:
        """How many distinct bytes of the tensors read in place are compared."""
        covered = {int(a) + k for a in self._words for k in range(WORD)}
        return len(covered) + len(self._bytes)


def _table(parts: list) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, np.uint64)


def _word_offsets(nbytes: int, span: int) -> np.ndarray:
    """Offsets of the 8-byte words that cover the first and the last `span` bytes of
    `nbytes` (>= WORD) bytes: a word at each end at least, none past the end."""
    span = min(max(span, WORD), nbytes)
    heads = list(range(0, span - WORD, WORD)) + [span - WORD]
    offsets = sorted(set(heads + [nbytes - span + o for o in heads]))
    return np.array(offsets, dtype=np.uint64)


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


def _samples(t: torch.Tensor) -> torch.Tensor:
    """The sampled elements of any tensor, as bytes (a fresh copy)."""
    flat = t.detach().reshape(-1)
    idx = torch.from_numpy(_sample_indices(flat.numel()).astype(np.int64)).to(flat.device)
    return flat[idx].contiguous().view(torch.uint8)


# gather_T(addresses, out, n): out[i] = *addresses[i]; first_T_difference(addresses,
# seen, n): the first i where *addresses[i] != seen[i], else n; T is an unaligned i64
# (words) or an i8 (bytes). Addresses are loaded as pointers from the table (no
# integer-to-pointer casts).
_NATIVE_TEMPLATE = """
define void @gather_{name}(ptr %addrs, ptr %out, i64 %n) {{
entry:
  %empty = icmp eq i64 %n, 0
  br i1 %empty, label %exit, label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %next, %loop ]
  %slot = getelementptr ptr, ptr %addrs, i64 %i
  %p = load ptr, ptr %slot
  %v = load {ty}, ptr %p, align 1
  %dst = getelementptr {ty}, ptr %out, i64 %i
  store {ty} %v, ptr %dst
  %next = add i64 %i, 1
  %more = icmp ult i64 %next, %n
  br i1 %more, label %loop, label %exit
exit:
  ret void
}}

define i64 @first_{name}_difference(ptr %addrs, ptr %seen, i64 %n) {{
entry:
  %empty = icmp eq i64 %n, 0
  br i1 %empty, label %exit, label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %next, %cont ]
  %slot = getelementptr ptr, ptr %addrs, i64 %i
  %p = load ptr, ptr %slot
  %v = load {ty}, ptr %p, align 1
  %sp = getelementptr {ty}, ptr %seen, i64 %i
  %s = load {ty}, ptr %sp
  %eq = icmp eq {ty} %v, %s
  br i1 %eq, label %cont, label %exit
cont:
  %next = add i64 %i, 1
  %more = icmp ult i64 %next, %n
  br i1 %more, label %loop, label %exit
exit:
  %r = phi i64 [ %n, %entry ], [ %i, %loop ], [ %n, %cont ]
  ret i64 %r
}}
"""
_NATIVE_IR = (_NATIVE_TEMPLATE.format(name="word", ty="i64")
              + _NATIVE_TEMPLATE.format(name="byte", ty="i8"))


class _Native:
    """The functions above, compiled for this CPU once per process."""

    def __init__(self):
        from compiler.codegen import llvm_cpu
        from runtime.cpu import JitModule

        self._jit = JitModule(object_code=llvm_cpu.compile_ir(_NATIVE_IR))
        args = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
        for name in ("word", "byte"):
            setattr(self, f"gather_{name}s", ctypes.CFUNCTYPE(None, *args)(
                self._jit.address(f"gather_{name}")))
            setattr(self, f"first_{name}_difference", ctypes.CFUNCTYPE(
                ctypes.c_int64, *args)(self._jit.address(f"first_{name}_difference")))


@functools.cache
def native() -> _Native:
    return _Native()
