"""Hostile and damaged artifacts cost the reader little: zip bombs, members whose sizes
disagree with the manifest, deep manifests and out-of-range options are refused with
one ArtifactError before the expensive reads (issue 16 item 9); a valid artifact
re-zipped with deflate still loads and matches onnxruntime."""

from __future__ import annotations

import json
import struct
import time
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import bridge
from bridge import ArtifactError, BrazeError
from runtime.artifact import MAX_EXPANSION, MAX_JSON_DEPTH, MAX_MANIFEST_BYTES, json_depth

BOMB_BYTES = 256 << 20  # deflates to about 256 KB: far beyond MAX_EXPANSION
# Refusing a bomb reads no member: well under the bomb's size and a second's work.
FAST_S, SMALL_PEAK = 2.0, 16 << 20


def _model() -> onnx.ModelProto:
    """tanh(x @ w): one compiled step; w is a tensor entry."""
    w = np.random.default_rng(1).standard_normal((16, 8)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]),
                           helper.make_node("Tanh", ["h"], ["y"])], "mt",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
                          [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


X = np.random.default_rng(2).standard_normal((4, 16)).astype(np.float32)


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hostile") / "m.braze"
    m = bridge.compile_onnx(_model())
    m(X)
    m.save(path)
    return path


def _ort(x):
    sess = ort.InferenceSession(_model().SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def _rebuild(src: Path, dst: Path, edit=None, extra=None, compression=zipfile.ZIP_STORED):
    """A copy of `src` with its manifest edited by `edit(m)`, every member written with
    `compression`, and `extra` = (name, size) a deflated member of `size` zero bytes."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compression) as zout:
        manifest = json.loads(zin.read("manifest.json"))
        if edit is not None:
            edit(manifest)
        zout.writestr("manifest.json", json.dumps(manifest))
        for name in zin.namelist():
            if name != "manifest.json":
                zout.writestr(name, zin.read(name))
        if extra is not None:
            _zeros(zout, *extra)
    return dst


def _zeros(zout: zipfile.ZipFile, name: str, size: int) -> None:
    info = zipfile.ZipInfo(name)
    info.compress_type = zipfile.ZIP_DEFLATED
    block = bytes(16 << 20)
    with zout.open(info, "w", force_zip64=True) as f:
        for start in range(0, size, len(block)):
            f.write(block[: size - start])


def _list(name: str, size: int):
    def edit(m):
        m["entries"][name] = {"sha256": "0" * 64, "size": size}
    return edit


def _refused_cheaply(path: Path, words: str) -> None:
    tracemalloc.start()
    t = time.perf_counter()
    try:
        with pytest.raises(ArtifactError, match=words) as e:
            bridge.load(path)
        seconds = time.perf_counter() - t
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(path) in str(e.value) and "\n" not in str(e.value)
    assert seconds < FAST_S and peak < SMALL_PEAK, (seconds, peak)


def test_listed_zip_bomb_is_refused_before_it_is_read(good, tmp_path):
    bomb = _rebuild(good, tmp_path / "bomb.braze", _list("tensors/bomb.npy", BOMB_BYTES),
                    ("tensors/bomb.npy", BOMB_BYTES))
    assert bomb.stat().st_size < BOMB_BYTES // MAX_EXPANSION
    _refused_cheaply(bomb, rf"'tensors/bomb.npy' expands .* more than {MAX_EXPANSION}x")


def test_member_larger_than_its_manifest_says_is_refused_before_it_is_read(good, tmp_path):
    bomb = _rebuild(good, tmp_path / "big.braze", _list("tensors/big.npy", 128),
                    ("tensors/big.npy", BOMB_BYTES))
    _refused_cheaply(bomb, f"'tensors/big.npy' holds {BOMB_BYTES} bytes, its manifest says 128")


def test_manifest_bomb_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "manifest_bomb.braze"
    with zipfile.ZipFile(path, "w") as zf:
        _zeros(zf, "manifest.json", MAX_MANIFEST_BYTES + 1)
    _refused_cheaply(path, "manifest.json claims .* bytes, more than a braze manifest holds")


def test_unlisted_members_are_never_read(good, tmp_path):
    extra = _rebuild(good, tmp_path / "extra.braze", extra=("junk.bin", BOMB_BYTES))
    tracemalloc.start()
    try:
        m = bridge.load(extra)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < SMALL_PEAK
    np.testing.assert_allclose(m(X)[0], _ort(X), rtol=1e-5, atol=1e-6)


def test_member_claiming_more_bytes_than_the_file_has(good, tmp_path):
    path = _rebuild(good, tmp_path / "claims.braze")
    raw = bytearray(path.read_bytes())
    name = next(n for n in zipfile.ZipFile(path).namelist() if n.startswith("tensors/"))
    record = raw.index(b"PK\x01\x02")  # central-directory records; the name is at +46
    while raw[record + 46: record + 46 + len(name)] != name.encode():
        record = raw.index(b"PK\x01\x02", record + 4)
    raw[record + 20: record + 24] = struct.pack("<I", 0x7FFF_FFFF)  # compressed size
    path.write_bytes(bytes(raw))
    with pytest.raises(ArtifactError, match=f"'{name}' claims 2147483647 bytes, the file has"):
        bridge.load(path)


def test_rezipped_with_deflate_still_loads_and_matches_onnxruntime(good, tmp_path):
    deflated = _rebuild(good, tmp_path / "deflated.braze", compression=zipfile.ZIP_DEFLATED)
    with zipfile.ZipFile(deflated) as zf:
        assert {i.compress_type for i in zf.infolist()} == {zipfile.ZIP_DEFLATED}
    y = bridge.load(deflated)(X)[0]
    np.testing.assert_allclose(y, _ort(X), rtol=1e-5, atol=1e-6)
    assert np.array_equal(y, bridge.load(good)(X)[0])


def test_deeply_nested_manifest_is_refused_without_recursion(good, tmp_path):
    path = tmp_path / "deep.braze"
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(path, "w") as zout:
        text = zin.read("manifest.json").decode()
        zout.writestr("manifest.json", text[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000
                      + "}")
    with pytest.raises(ArtifactError, match=f"nested 100001 deep, braze's nest at most "
                                            f"{MAX_JSON_DEPTH}"):
        bridge.load(path)


def test_json_depth_skips_brackets_inside_strings():
    assert json_depth(b'{"a": [1, {"b": "[[[{{"}], "c\\"[": []}') == 3
    assert json_depth(b'"just a [string]"') == 0
    assert json_depth(b"[[[]], []]") == 3


@pytest.mark.parametrize("threads", [512, 0, -1, "2", 1.5, None])
def test_saved_threads_out_of_range_are_refused(good, tmp_path, threads):
    def edit(m):
        m["model"]["options"]["threads"] = threads
    path = _rebuild(good, tmp_path / "threads.braze", edit)
    with pytest.raises(ArtifactError, match=r"malformed manifest: options .*threads must be a "
                                            r"positive integer up to 256"):
        bridge.load(path)
    m = bridge.load(path, threads=1)  # an explicit, valid count overrides the saved one
    assert m.threads == 1
    np.testing.assert_allclose(m(X)[0], _ort(X), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("threads", [257, 0, True])
def test_load_threads_argument_is_bounded(good, threads):
    with pytest.raises(BrazeError, match="threads must be a positive integer up to 256"):
        bridge.load(good, threads=threads)
