"""The compiled specializations of one model or graph, per input signature.

Both front ends specialize at call time, as XLA does: a key (input shapes and
dtypes, plus the values of inputs specialized on) maps to what was compiled for
it. The cache is bounded (MAX_SPECIALIZATIONS, least recently used dropped
first: a model called with ever-changing shapes recompiles rather than grows)
and locked: a compile happens under the lock, so two threads calling with one new
signature compile it once.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Hashable

# Distinct input signatures kept compiled per model (ONNX) or per aten graph (torch).
MAX_SPECIALIZATIONS = 16

MISSING = object()  # `get`'s answer for a key never built (a stored None is a value)


class SpecializationCache:
    """key -> specialization, at most `size` of them; hold `lock` around lookups and
    builds that belong together."""

    def __init__(self, size: int | None = None):
        self.size = MAX_SPECIALIZATIONS if size is None else size
        self.lock = threading.RLock()
        self._entries: collections.OrderedDict = collections.OrderedDict()

    def get(self, key: Hashable):
        """The entry for `key`, now the most recently used, or MISSING."""
        entry = self._entries.get(key, MISSING)
        if entry is not MISSING:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: Hashable, entry) -> None:
        """Store `entry`, dropping the least recently used beyond `size`."""
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def get_or_build(self, key: Hashable, build: Callable[[], object]):
        """The entry for `key`, built (under the lock) and stored if missing."""
        with self.lock:
            entry = self.get(key)
            if entry is MISSING:
                entry = build()
                self.put(key, entry)
            return entry

    def clear(self) -> None:
        self._entries.clear()

    def values(self) -> list:
        """The entries, least recently used first."""
        return list(self._entries.values())

    def latest_key(self):
        """The most recently used key (None when empty)."""
        return next(reversed(self._entries), None)

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self):
        return iter(list(self._entries))
