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
machine's noise. The storage and version reads (~0.2 ms there) remained: see below.

A write through `.data` that leaves every sampled element as it was (entries in the
middle of a weight changed by hand, say) is not seen; README.md, "Three ways to use
it", says so.

Checks 1 and 2 run in compiled code too (`TensorState`), while the call passes the
same tensor objects as the last one: a Python map of `data_ptr` and one of `_version`
over mobilenet_v2's 262 weights cost ~0.16 ms a call on cold caches (a Python call,
two integer objects and a list per weight). The code only loads: each tensor's data
pointer and version count, from its C++ object at offsets this process finds once by
probing tensors whose answers it knows (`_state_fields`), checked against `data_ptr()`
and `_version` on every weight it will watch. It calls nothing in torch (torch's own C
entry for a data pointer throws a C++ exception on a tensor whose storage refuses
access, and one through compiled code ends the process), and a null storage or counter
is a change. Where the probe finds no one answer (another torch build), the Python
maps run, as they always did.
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
        self._native: TensorState | None = None  # checks 1 and 2 for the same objects

    def changed(self, args) -> bool:
        """Whether the frozen weights in `args` differ from those of the previous call
        (False at the first); remembers them either way."""
        weights = self._take(args)
        native = self._native
        if native is not None and native.same(weights):
            if self._fingerprint.same():
                return False
            state = None  # a write through .data: the state is read again below
        else:
            state = _state(weights)
            if self._state is not None and state == self._state and \
                    self._fingerprint.same():
                return False
        first = self._state is None
        self._state = _state(weights) if state is None else state
        self._fingerprint = Fingerprint(weights)
        self._native = TensorState.of(weights)
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


class TensorState:
    """Data pointers and version counters of tensor objects, as when this was made:
    `same(tensors)` says whether `tensors` are those objects (identity) and each still
    has that data pointer and version, in one call of compiled code that only loads
    (no call into torch, whose accessors may throw: a C++ exception through compiled
    code would end the process)."""

    def __init__(self, tensors: tuple, fields: tuple):
        self.objects = tensors  # kept alive: their C++ objects' addresses are in a table
        self._impls = np.array([t._cdata for t in tensors], np.uint64)
        self._sizes = np.array([t.element_size() for t in tensors], np.uint64)
        self._ptrs = np.array([t.data_ptr() for t in tensors], np.uint64)
        self._versions = np.array([t._version for t in tensors], np.uint32)
        self._fields = fields

    @classmethod
    def of(cls, tensors: tuple) -> TensorState | None:
        """The state of `tensors`, or None where compiled code cannot read it: no probed
        fields in this torch, a non-tensor or a tensor that has no storage or version
        counter of its own (inference tensors), or a read that disagrees with torch's."""
        fields = _state_fields()
        if fields is None or not tensors or not all(
                type(t) in _PLAIN and t.is_cpu and not t.is_inference() for t in tensors):
            return None
        try:
            state = cls(tensors, fields)
        except (RuntimeError, TypeError, ValueError):
            return None
        return state if state._reads_agree() else None

    def _tables(self) -> tuple:
        return (self._impls.ctypes.data, self._sizes.ctypes.data, len(self._impls),
                *self._fields)

    def _reads_agree(self) -> bool:
        n = len(self._impls)
        ptrs, versions = np.empty(n, np.uint64), np.empty(n, np.uint32)
        native().read_state(*self._tables(), ptrs.ctypes.data, versions.ctypes.data)
        return np.array_equal(ptrs, self._ptrs) and np.array_equal(versions, self._versions)

    def same(self, tensors) -> bool:
        if not all(map(operator.is_, tensors, self.objects)):
            return False
        return native().state_difference(*self._tables(), self._ptrs.ctypes.data,
                                         self._versions.ctypes.data) == len(self._impls)


# Tensor types whose objects the compiled check reads (a subclass could keep its data
# elsewhere: those take the Python maps).
_PLAIN = (torch.Tensor, torch.nn.Parameter)
# Words of a tensor's C++ object, and of its storage's, searched by the probe; bytes of
# the version counter searched for its count (a 32-bit word after the object's header).
_IMPL_WORDS = 16
_OFFSET_WORDS = 32  # the storage offset lies past the sizes and strides kept inline
_STORAGE_WORDS = 8
_COUNT_BYTES = range(8, 24, 4)
# Cache lines of a tensor's C++ object prefetched before the check (a line past its end
# is a harmless hint).
IMPL_LINES = 4


def _words(address: int, count: int) -> list[int]:
    return [ctypes.c_uint64.from_address(address + 8 * i).value for i in range(count)]


def _only(found: list) -> int | None:
    return found[0] if len(found) == 1 else None


@functools.cache
def _state_fields() -> tuple | None:
    """Byte offsets of what the compiled check reads, found once per process by probing
    tensors whose answers are known: (the version counter's pointer in a tensor's C++
    object, the count in the counter, the storage's pointer in the object, the data
    pointer in the storage, the storage offset in the object); None where the probe
    finds no one answer for each.
    - the counter's pointer: the word a tensor shares with its `detach()` (same
      counter) and not with its `.data` (same storage, a counter of its own) nor with
      another tensor;
    - the count: the 32-bit word of the counter that follows `_version` through
      in-place updates;
    - the storage's pointer: the word the three share and another tensor does not,
      through which the storage's data pointer is found;
    - the storage offset: the word that is 3 in `x[3:]`, 5 in `x[5:]` and 0 in `x`.
    Every read is then checked against torch's, through the compiled code, on kinds of
    weights, and again on every tensor a TensorState is made for."""
    with torch.no_grad():
        a, other = torch.zeros(16), torch.zeros(16)
        alias, data = a.detach(), a.data
        wa, walias, wdata, wother = (_words(t._cdata, _IMPL_WORDS)
                                     for t in (a, alias, data, other))
        counter = _only([i for i in range(_IMPL_WORDS) if wa[i] and wa[i] == walias[i]
                         and wa[i] not in (wdata[i], wother[i])])
        if counter is None:
            return None

        def count(t, at):
            return ctypes.c_uint32.from_address(_words(t._cdata, _IMPL_WORDS)[counter]
                                                + at).value

        counts = [at for at in _COUNT_BYTES if count(a, at) == a._version]
        for _ in range(3):
            a.add_(1)
            counts = [at for at in counts if count(a, at) == a._version]
        storages = [i for i in range(_IMPL_WORDS) if wa[i] and wa[i] == walias[i] ==
                    wdata[i] and wa[i] != wother[i] and i != counter]
        # the storage's pointer is the candidate whose object holds the data pointer, at
        # the same place in a storage of torch's allocator (whose context word holds it
        # too) and in one wrapping numpy's memory (whose context is numpy's array)
        outside = torch.from_numpy(np.zeros(16, np.float32))
        found = []
        for i in storages:
            theirs = _words(outside._cdata, _IMPL_WORDS)[i]
            held = [j for j, (w, v) in enumerate(zip(_words(wa[i], _STORAGE_WORDS),
                                                     _words(theirs, _STORAGE_WORDS)))
                    if w == a.untyped_storage().data_ptr() and
                    v == outside.untyped_storage().data_ptr()]
            found += [(i, j) for j in held]
        views = [_words(t._cdata, _OFFSET_WORDS) for t in (a, a[3:], a[5:])]
        offsets = [i for i in range(_OFFSET_WORDS)
                   if (views[0][i], views[1][i], views[2][i]) == (0, 3, 5)]
        count_at, offset = _only(counts), _only(offsets)
        storage, data_at = _only(found) or (None, None)
        if None in (count_at, storage, offset):
            return None
        fields = (8 * counter, count_at, 8 * storage, 8 * data_at, 8 * offset)
        probes = (torch.nn.Parameter(torch.randn(3, 4)), torch.randn(8)[2:],
                  torch.zeros(2, dtype=torch.float64), other, torch.arange(6)[1::2])
        probes[0].data.mul_(2)
        probes[1].add_(1)
        if not TensorState(probes, fields)._reads_agree():
            return None
    return fields


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
# The compiled check's loads, with the offsets _state_fields found. tensor_state(impls,
# sizes, i, fields..., ptr, count): tensor i's data pointer (its storage's data pointer
# plus its storage offset times its element size) into *ptr and its version count into
# *count; false (nothing stored) where the storage or the counter is null. read_state
# (impls, sizes, n, fields..., ptrs, versions) stores every tensor's (0 and 2^32 - 1
# where one is null); state_difference(the same) answers the first i whose pointer or
# count differs from ptrs[i] / versions[i] or is null, else n.
def _nonnull_field(name: str) -> str:
    """IR lines loading the pointer at %impl + %<name>_at into %<name> and branching to
    %null where it is null, else on at the label <name>_ok."""
    return (f"  %{name[0]}s = getelementptr i8, ptr %impl, i64 %{name}_at\n"
            f"  %{name} = load ptr, ptr %{name[0]}s\n"
            f"  %no{name} = icmp eq ptr %{name}, null\n"
            f"  br i1 %no{name}, label %null, label %{name}_ok\n"
            f"{name}_ok:")


_STATE_FIELDS = ("i64 %counter_at, i64 %count_at, i64 %storage_at, i64 %data_at, "
                 "i64 %offset_at")
_STATE_IR = """
declare void @llvm.prefetch.p0(ptr, i32, i32, i32)

define private i1 @tensor_state(ptr %impls, ptr %sizes, i64 %i, FIELDS, ptr %ptr,
                                ptr %count) {
entry:
  %is = getelementptr ptr, ptr %impls, i64 %i
  %impl = load ptr, ptr %is
STORAGE_FIELD
  %ds = getelementptr i8, ptr %storage, i64 %data_at
  %data = load i64, ptr %ds
  %os = getelementptr i8, ptr %impl, i64 %offset_at
  %offset = load i64, ptr %os
  %zs = getelementptr i64, ptr %sizes, i64 %i
  %size = load i64, ptr %zs
  %bytes = mul i64 %offset, %size
  %p = add i64 %data, %bytes
  store i64 %p, ptr %ptr
COUNTER_FIELD
  %vs = getelementptr i8, ptr %counter, i64 %count_at
  %v = load atomic i32, ptr %vs monotonic, align 4
  store i32 %v, ptr %count
  ret i1 true
null:
  ret i1 false
}

define void @read_state(ptr %impls, ptr %sizes, i64 %n, FIELDS, ptr %ptrs, ptr %versions) {
entry:
  %empty = icmp eq i64 %n, 0
  br i1 %empty, label %exit, label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %next, %cont ]
  %pp = getelementptr i64, ptr %ptrs, i64 %i
  %vp = getelementptr i32, ptr %versions, i64 %i
  %ok = call i1 @tensor_state(ptr %impls, ptr %sizes, i64 %i, FIELDS, ptr %pp, ptr %vp)
  br i1 %ok, label %cont, label %none
none:
  store i64 0, ptr %pp
  store i32 -1, ptr %vp
  br label %cont
cont:
  %next = add i64 %i, 1
  %more = icmp ult i64 %next, %n
  br i1 %more, label %loop, label %exit
exit:
  ret void
}

; Two passes of prefetches before the checks, so the cache misses of all the tensors
; overlap instead of following one another: each tensor's C++ object (its first
; IMPL_LINES lines), then, through the words just fetched, its version counter and its
; storage.
define private void @prefetch_state(ptr %impls, i64 %n, FIELDS) {
entry:
  br label %first
first:
  %i = phi i64 [ 0, %entry ], [ %inext, %first ]
  %is = getelementptr ptr, ptr %impls, i64 %i
  %impl = load ptr, ptr %is
IMPL_PREFETCHES
  %inext = add i64 %i, 1
  %imore = icmp ult i64 %inext, %n
  br i1 %imore, label %first, label %second
second:
  %j = phi i64 [ 0, %first ], [ %jnext, %second ]
  %js = getelementptr ptr, ptr %impls, i64 %j
  %jimpl = load ptr, ptr %js
  %cs = getelementptr i8, ptr %jimpl, i64 %counter_at
  %counter = load ptr, ptr %cs
  %cp = getelementptr i8, ptr %counter, i64 %count_at
  call void @llvm.prefetch.p0(ptr %cp, i32 0, i32 3, i32 1)
  %ss = getelementptr i8, ptr %jimpl, i64 %storage_at
  %storage = load ptr, ptr %ss
  %dp = getelementptr i8, ptr %storage, i64 %data_at
  call void @llvm.prefetch.p0(ptr %dp, i32 0, i32 3, i32 1)
  %jnext = add i64 %j, 1
  %jmore = icmp ult i64 %jnext, %n
  br i1 %jmore, label %second, label %done
done:
  ret void
}

define i64 @state_difference(ptr %impls, ptr %sizes, i64 %n, FIELDS, ptr %ptrs,
                             ptr %versions) {
entry:
  %pslot = alloca i64
  %vslot = alloca i32
  %empty = icmp eq i64 %n, 0
  br i1 %empty, label %exit, label %warm
warm:
  call void @prefetch_state(ptr %impls, i64 %n, FIELDS)
  br label %loop
loop:
  %i = phi i64 [ 0, %warm ], [ %next, %cont ]
  %ok = call i1 @tensor_state(ptr %impls, ptr %sizes, i64 %i, FIELDS, ptr %pslot,
                              ptr %vslot)
  br i1 %ok, label %compare, label %exit
compare:
  %p = load i64, ptr %pslot
  %v = load i32, ptr %vslot
  %sp = getelementptr i64, ptr %ptrs, i64 %i
  %s = load i64, ptr %sp
  %sv = getelementptr i32, ptr %versions, i64 %i
  %w = load i32, ptr %sv
  %psame = icmp eq i64 %p, %s
  %vsame = icmp eq i32 %v, %w
  %same = and i1 %psame, %vsame
  br i1 %same, label %cont, label %exit
cont:
  %next = add i64 %i, 1
  %more = icmp ult i64 %next, %n
  br i1 %more, label %loop, label %exit
exit:
  %r = phi i64 [ %n, %entry ], [ %i, %loop ], [ %i, %compare ], [ %n, %cont ]
  ret i64 %r
}
""".replace("FIELDS", _STATE_FIELDS).replace(
    "STORAGE_FIELD", _nonnull_field("storage")).replace(
    "COUNTER_FIELD", _nonnull_field("counter"))
_NATIVE_IR = (_NATIVE_TEMPLATE.format(name="word", ty="i64")
              + _NATIVE_TEMPLATE.format(name="byte", ty="i8")
              + _STATE_IR.replace("IMPL_PREFETCHES", "".join(
                  f"  %line{k} = getelementptr i8, ptr %impl, i64 {64 * k}\n"
                  f"  call void @llvm.prefetch.p0(ptr %line{k}, i32 0, i32 3, i32 1)\n"
                  for k in range(IMPL_LINES))))


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
        # these read torch's objects: the GIL stays held (PYFUNCTYPE), so no other
        # Python thread changes them meanwhile
        state = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, *[ctypes.c_int64] * 5,
                 ctypes.c_void_p, ctypes.c_void_p)
        self.read_state = ctypes.PYFUNCTYPE(None, *state)(self._jit.address("read_state"))
        self.state_difference = ctypes.PYFUNCTYPE(ctypes.c_int64, *state)(
            self._jit.address("state_difference"))


@functools.cache
def native() -> _Native:
    return _Native()
