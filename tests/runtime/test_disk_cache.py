"""The compile cache: round trip, atomic replace, corruption is detected and dropped."""

import hashlib
import multiprocessing

from runtime.disk_cache import DiskCache


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_round_trip_and_keys(tmp_path):
    c = DiskCache(tmp_path)
    k = _key("graph text")
    assert c.get(k) is None
    c.put(k, b"\x00object code\xff")
    assert c.get(k) == b"\x00object code\xff"
    assert DiskCache(tmp_path).get(k) == b"\x00object code\xff"


def test_corrupted_entry_is_dropped(tmp_path):
    c = DiskCache(tmp_path)
    k = _key("a")
    c.put(k, b"payload" * 100)
    path = c._path(k)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    assert c.get(k) is None
    assert not path.exists()
    c.put(k, b"payload")
    path.write_bytes(path.read_bytes()[:-2])  # truncated
    assert c.get(k) is None


def test_disabled(monkeypatch, tmp_path):
    monkeypatch.setenv("BRAZE_CACHE_DIR", "off")
    c = DiskCache()
    assert not c.enabled
    c.put("k", b"x")
    assert c.get("k") is None


def _writer(root, i):
    c = DiskCache(root)
    for _ in range(50):
        c.put("ab" + "0" * 62, bytes([i]) * 10000)


def test_concurrent_writers_never_leave_a_torn_entry(tmp_path):
    procs = [multiprocessing.get_context("spawn").Process(target=_writer, args=(str(tmp_path), i))
             for i in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    got = DiskCache(tmp_path).get("ab" + "0" * 62)
    assert got is not None and len(set(got)) == 1 and len(got) == 10000
