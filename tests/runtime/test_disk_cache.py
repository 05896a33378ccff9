"""The compile cache: round trip, atomic replace, corruption and misplaced entries are
detected and dropped."""

import hashlib
import multiprocessing

import numpy as np

from compiler.codegen import compile_graph
from compiler.text import parse_graph
from runtime.cpu import CpuStep
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


KEY_A, KEY_B = "aa" + "1" * 62, "bb" + "2" * 62


def test_entry_stored_under_another_key_is_a_miss_and_is_dropped(tmp_path):
    c = DiskCache(tmp_path)
    c.put(KEY_A, b"code of graph A")
    c.put(KEY_B, b"code of graph B")
    c._path(KEY_B).write_bytes(c._path(KEY_A).read_bytes())  # checksum valid, key wrong
    assert c.get(KEY_B) is None
    assert not c._path(KEY_B).exists()
    assert c.get(KEY_A) == b"code of graph A"
    c.put(KEY_B, b"code of graph B")
    assert c.get(KEY_B) == b"code of graph B"


def test_entry_from_the_keyless_format_is_a_miss(tmp_path):
    c = DiskCache(tmp_path)
    payload = b"old object code"
    digest = hashlib.sha256(payload).hexdigest().encode()
    c._path(KEY_A).parent.mkdir(parents=True)
    c._path(KEY_A).write_bytes(b"braze-cache-v1 %d %s\n" % (len(payload), digest) + payload)
    assert c.get(KEY_A) is None


def test_unreadable_entry_is_a_miss_and_put_does_not_raise(tmp_path):
    c = DiskCache(tmp_path)
    c._path(KEY_A).mkdir(parents=True)  # a directory where the entry should be
    assert c.get(KEY_A) is None
    c.put(KEY_A, b"x")
    assert c.get(KEY_A) is None


MATMUL = """
graph mm(%x: f32[4,8], %w: f32[8,16]) -> (%y) {
  %y = matmul(%x, %w) : f32[4,16]
}"""
EXP = """
graph e(%x: f32[4,8]) -> (%y) {
  %t = exp(%x) : f32[4,8]
  %y = neg(%t) : f32[4,8]
}"""


def _entries(root):
    return sorted(root.rglob("*.bin"))


def test_compiled_code_copied_over_another_entry_is_recompiled(tmp_path):
    """Object code of a matmul planted under an elementwise graph's key (the crash of
    issue 16 item 7): the exp graph recompiles, runs right and its entry is rewritten."""
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    cache = DiskCache(tmp_path)
    compile_graph(parse_graph(MATMUL), cache=cache)
    (mm_entry,) = _entries(tmp_path)
    compile_graph(parse_graph(EXP), cache=cache)
    (exp_entry,) = [p for p in _entries(tmp_path) if p != mm_entry]
    exp_entry.write_bytes(mm_entry.read_bytes())
    for _ in range(2):  # the first call recompiles and rewrites, the second hits
        (y,) = CpuStep(compile_graph(parse_graph(EXP), cache=DiskCache(tmp_path))).run([x])
        np.testing.assert_allclose(y, -np.exp(x), rtol=1e-6)
        assert exp_entry.read_bytes() != mm_entry.read_bytes()
        assert exp_entry.name.removesuffix(".bin").encode() in exp_entry.read_bytes()
