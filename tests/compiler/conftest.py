"""Fixtures shared by the compiler tests."""

from __future__ import annotations

import pytest


class MemoryCache:
    """A compile cache (the get/put that compile_graph takes) held in a dict, `store`."""

    def __init__(self):
        self.store: dict = {}

    def get(self, key):
        return self.store.get(key)

    def put(self, key, payload):
        self.store[key] = payload


@pytest.fixture
def memory_cache() -> MemoryCache:
    return MemoryCache()
