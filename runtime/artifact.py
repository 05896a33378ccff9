"""Artifact files: one zip holding a JSON manifest, raw tensors and object code.

    manifest.json       format, format_version, braze_version, target (triple, CPU
                        name, feature string), `entries` (sha256 and size of every
                        other entry), and whatever the writer describes
                        (bridge/artifact.py)
    tensors/<hash>.npy  numpy arrays, content-addressed (shared weights stored once),
                        written and read with allow_pickle=False
    ...                 text (IR) and bytes (object code) under names the manifest gives

Nothing here unpickles or evaluates anything: the manifest is JSON, tensors are
.npy without pickles, and the only code an artifact carries is the object code
that the caller loads on purpose. `ArtifactReader` refuses, with one ArtifactError
saying why, a missing or non-zip file, a damaged entry, another format version,
another braze version and another CPU. Writes are atomic (temporary file, then
`os.replace`), so a reader never sees half an artifact.

A hostile or damaged file costs the reader little: the manifest is read first,
with a size and nesting bound; the versions and CPU are checked before any other
entry is read; each entry's size in the zip directory must equal the size the
manifest gives, the entries must fit in the file (a compressed entry may not
expand more than MAX_EXPANSION times), and each is streamed with that size as
its limit while its checksum is computed. Entries the manifest does not list are
never read.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import secrets
import zipfile
import zlib
from pathlib import Path

import numpy as np

from compiler import __version__
from compiler.errors import ArtifactError
from runtime.executable import Executable, Step

FORMAT = "braze-artifact"
# Bump on any change a reader of the previous layout would misread; readers accept
# exactly their own version (compiled code is tied to one braze anyway).
FORMAT_VERSION = 4  # 2: `entries` gives each entry's size beside its sha256;
# 3: the target names its spec, vector features and requirements; 4: a specialization
# may be a padded bucket (`padding`), which a reader of 3 would call without its mask
MANIFEST = "manifest.json"
# A manifest describes steps and names entries; the largest braze writes (hundreds of
# specializations of a big model) stay far below this.
MAX_MANIFEST_BYTES = 64 << 20
# braze's manifests nest about 8 deep; a deeper one is not braze's, and parsing it
# recursively could exhaust Python's stack.
MAX_JSON_DEPTH = 32
# braze stores entries uncompressed (ratio 1); an entry re-zipped with deflate
# shrinks float weights under 2x and text about 10x. Zeros deflate up to ~1000x,
# which is what a zip bomb uses: refuse expansion beyond this...
MAX_EXPANSION = 64
# ...except for small entries, whose expansion cannot cost much.
SMALL_ENTRY = 1 << 20
_ZIP_MAGIC = b"PK\x03\x04"
_SHOWN_FEATURES = 6  # differing CPU features named in an error, at most


def target_info(target=None) -> dict:
    """A compile target (compiler/target.py; default: this machine) as manifest data: its
    spec, LLVM triple, CPU name, feature string, vector features, the features its code
    requires and its cache sizes."""
    from compiler import target as targets

    return targets.parse(target or targets.HOST).to_json()


def looks_like_artifact(path) -> bool:
    """A `.braze` name, or a file that starts as a zip does (ONNX files never do)."""
    path = Path(path)
    if path.suffix == ".braze":
        return True
    try:
        with open(path, "rb") as f:
            return f.read(4) == _ZIP_MAGIC
    except OSError:
        return False


class ArtifactWriter:
    """Collects entries, then writes them and the manifest as one zip (atomically)."""

    def __init__(self):
        self.entries: dict[str, bytes] = {}
        self.object_tensors: list[str] = []  # string tensors, stored as fixed-width text

    def add(self, name: str, data: bytes | str) -> str:
        if name in self.entries or name == MANIFEST:
            raise ArtifactError(f"artifact entry {name!r} written twice")
        self.entries[name] = data.encode() if isinstance(data, str) else bytes(data)
        return name

    def add_tensor(self, array: np.ndarray) -> str:
        """Store an array once per content; returns its entry name."""
        array = np.asarray(array)
        is_object = array.dtype == object
        if is_object:  # ONNX strings: text or bytes, never pickled objects
            kinds = {type(x) for x in array.reshape(-1)}
            if not kinds <= {str, bytes} or len(kinds) > 1:
                raise ArtifactError(f"cannot save an object array of {sorted(map(str, kinds))}")
            array = array.astype(bytes if kinds == {bytes} else str)
        buf = io.BytesIO()
        np.save(buf, array, allow_pickle=False)  # any layout; 0-d arrays stay 0-d
        data = buf.getvalue()
        name = f"tensors/{hashlib.sha256(data).hexdigest()[:32]}.npy"
        if name not in self.entries:
            self.entries[name] = data
            if is_object:
                self.object_tensors.append(name)
        return name

    def write(self, path, manifest: dict, target=None) -> None:
        """Write the zip at `path`; `manifest` gets the format, versions, the target its
        code is for (default: this machine), checksums."""
        path = Path(path)
        head = {"format": FORMAT, "format_version": FORMAT_VERSION,
                "braze_version": __version__, "target": target_info(target)}
        body = {**head, **manifest, "object_tensors": sorted(self.object_tensors),
                "entries": {n: {"sha256": hashlib.sha256(d).hexdigest(), "size": len(d)}
                            for n, d in self.entries.items()}}
        # a unique temporary name beside the target, created with the umask's permissions
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except OSError as e:
            raise ArtifactError(f"cannot write {path}: {e.strerror or e}") from None
        try:
            with os.fdopen(fd, "wb") as f, zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as zf:
                zf.writestr(MANIFEST, json.dumps(body, indent=1, sort_keys=True))
                for name, data in self.entries.items():
                    zf.writestr(name, data)
            os.replace(tmp, path)
        except BaseException as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if isinstance(e, OSError):
                raise ArtifactError(f"cannot write {path}: {e.strerror or e}") from None
            raise


class ArtifactReader:
    """An opened artifact: the checked manifest and its entries (checksums verified).

    Checks, in order, each with its own message: the file exists and is a zip with a
    manifest of bounded size and depth; the format version; braze's version; the CPU;
    every entry's size (against the manifest, the file and MAX_EXPANSION), then its
    sha256. Nothing but the manifest is read before the versions and CPU are known.
    """

    def __init__(self, path):
        self.path = Path(path)
        _check_path(self.path)
        with _zip_errors(self.path), zipfile.ZipFile(self.path) as zf:
            self._file_bytes = self.path.stat().st_size
            self.manifest = self._read_manifest(zf)
            self._check_format()
            self._check_version()
            self._check_target()
            self._data = self._read_entries(zf)
        self._objects = self.manifest.get("object_tensors", [])
        if not isinstance(self._objects, list) or not set(map(type, self._objects)) <= {str}:
            self.fail("malformed manifest: object_tensors is not a list of entry names")
        self._tensors: dict[str, np.ndarray] = {}

    def fail(self, why: str):
        """Raise ArtifactError naming this file."""
        raise ArtifactError(f"{self.path}: {why}")

    def _read_manifest(self, zf: zipfile.ZipFile) -> dict:
        try:
            info = zf.getinfo(MANIFEST)
        except KeyError:
            self.fail(f"not a braze artifact (no {MANIFEST})")
        if info.file_size > MAX_MANIFEST_BYTES:
            self.fail(f"{MANIFEST} claims {info.file_size} bytes, more than a braze manifest "
                      f"holds (at most {MAX_MANIFEST_BYTES})")
        self._check_member(info)
        raw = self._stream(zf, info)
        depth = json_depth(raw)
        if depth > MAX_JSON_DEPTH:
            self.fail(f"corrupted manifest: nested {depth} deep, braze's nest at most "
                      f"{MAX_JSON_DEPTH}")
        try:
            manifest = json.loads(raw)
        except (UnicodeDecodeError, ValueError) as e:  # ValueError: JSONDecodeError, digits
            self.fail(f"corrupted manifest ({e})")
        if not isinstance(manifest, dict):
            self.fail("not a braze artifact (its manifest is not a JSON object)")
        return manifest

    def _check_format(self) -> None:
        m = self.manifest
        if m.get("format") != FORMAT:
            self.fail("not a braze artifact (its manifest names no braze format)")
        v = m.get("format_version")
        if v != FORMAT_VERSION:
            age = "newer" if isinstance(v, int) and v > FORMAT_VERSION else "older"
            self.fail(f"artifact format version {v} is {age} than the version this braze "
                      f"({__version__}) reads ({FORMAT_VERSION}); compile the model again "
                      "with this braze (`braze compile`)")

    def _read_entries(self, zf: zipfile.ZipFile) -> dict[str, bytes]:
        """Every entry the manifest lists: sizes checked first, then each streamed with
        its size as the limit and compared with its checksum."""
        listed = self._listed_entries()
        infos = self._entry_infos(zf, listed)
        data = {}
        for name, (digest, _) in listed.items():
            data[name] = self._stream(zf, infos[name])
            if hashlib.sha256(data[name]).hexdigest() != digest:
                self.fail(f"corrupted: entry {name!r} does not match its checksum")
        return data

    def _listed_entries(self) -> dict[str, tuple[str, int]]:
        """The manifest's {name: (sha256, size)}, its shape checked."""
        entries = self.manifest.get("entries")
        if not isinstance(entries, dict):
            self.fail("malformed manifest: no entry checksums")
        for name, e in entries.items():
            if (name == MANIFEST or not isinstance(e, dict) or not isinstance(e.get("sha256"), str)
                    or not _is_size(e.get("size"))):
                self.fail(f"malformed manifest: entry {name!r} has no checksum and size")
        return {name: (e["sha256"], e["size"]) for name, e in entries.items()}

    def _entry_infos(self, zf: zipfile.ZipFile, listed: dict) -> dict[str, zipfile.ZipInfo]:
        """Each listed entry's zip directory record, its sizes checked before any read."""
        infos = {}
        for info in zf.infolist():
            if info.filename in listed and infos.setdefault(info.filename, info) is not info:
                self.fail(f"corrupted: entry {info.filename!r} appears twice")
        file_bytes = self._file_bytes
        for name, (_, size) in listed.items():
            if name not in infos:
                self.fail(f"corrupted: entry {name!r} is missing")
            if infos[name].file_size != size:
                self.fail(f"corrupted: entry {name!r} holds {infos[name].file_size} bytes, "
                          f"its manifest says {size}")
            self._check_member(infos[name])
        stored = sum(i.compress_size for i in infos.values())
        if stored > file_bytes:
            self.fail(f"corrupted: its entries claim {stored} bytes, the file has {file_bytes}")
        return infos

    def _check_member(self, info: zipfile.ZipInfo) -> None:
        """The entry fits in the file and expands within MAX_EXPANSION."""
        name, packed, size = info.filename, info.compress_size, info.file_size
        if packed > self._file_bytes:
            self.fail(f"corrupted: entry {name!r} claims {packed} bytes, the file has "
                      f"{self._file_bytes}")
        if size > SMALL_ENTRY and size > MAX_EXPANSION * packed:
            self.fail(f"entry {name!r} expands from {packed} to {size} bytes, more than "
                      f"{MAX_EXPANSION}x (braze stores entries uncompressed): refused as a "
                      "possible zip bomb")

    def _stream(self, zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
        """The entry's bytes: zipfile decompresses in chunks and stops at the declared
        size (its CRC then fails if the entry held more), so this reads at most that."""
        with zf.open(info) as f:
            data = f.read(info.file_size)
        if len(data) != info.file_size:
            self.fail(f"corrupted: entry {info.filename!r} is shorter than it declares")
        return data

    def _check_version(self) -> None:
        v = self.manifest.get("braze_version")
        if v != __version__:
            self.fail(f"saved by braze {v}, this is braze {__version__}: compiled code is "
                      "tied to the braze that made it; compile the model again "
                      "(`braze compile`)")

    def _check_target(self) -> None:
        saved, here = self.manifest.get("target"), target_info()
        if not isinstance(saved, dict):
            self.fail("malformed manifest: no target")
        again = "; compile the model again on this machine"
        if saved.get("spec", "cpu") != "cpu":  # compiled for a named CPU
            return self._check_requirements(saved, here, again)
        if saved.get("triple") != here["triple"]:
            self.fail(f"compiled for {saved.get('triple')}, this machine is {here['triple']}"
                      + again)
        features = _feature_diff(saved.get("features"), here["features"])
        if saved.get("cpu") != here["cpu"]:
            self.fail(f"compiled for CPU {saved.get('cpu')!r}, this machine's is "
                      f"{here['cpu']!r}{features}" + again)
        if saved.get("features") != here["features"]:
            self.fail(f"compiled for CPU {here['cpu']!r} with other features than this "
                      f"machine's{features}" + again)

    def _check_requirements(self, saved: dict, here: dict, again: str) -> None:
        """Code for a named CPU runs on any machine of its architecture that has every
        feature it requires."""
        from compiler.target import arch_of

        arch, here_arch = arch_of(str(saved.get("triple"))), arch_of(here["triple"])
        if arch != here_arch:
            self.fail(f"compiled for {saved.get('spec')} ({saved.get('triple')}), this "
                      f"machine is {here['triple']}" + again)
        missing = sorted(set(saved.get("requires") or []) - set(here["requires"]))
        if missing:
            self.fail(f"compiled for {saved.get('spec')}, whose features this machine "
                      f"({here['cpu']}) lacks: {_few(missing)}" + again)

    # -- entries ------------------------------------------------------------

    def read(self, name: str) -> bytes:
        try:
            return self._data[name]
        except (KeyError, TypeError):
            self.fail(f"malformed manifest: it names entry {name!r}, which is not there")

    def text(self, name: str) -> str:
        try:
            return self.read(name).decode()
        except UnicodeDecodeError:
            self.fail(f"corrupted: entry {name!r} is not text")

    def tensor(self, name: str) -> np.ndarray:
        """The array stored as `name` (read once, shared, read-only)."""
        arr = self._tensors.get(name)
        if arr is None:
            try:
                arr = np.load(io.BytesIO(self.read(name)), allow_pickle=False)
            except ValueError as e:
                self.fail(f"corrupted: entry {name!r} is not a plain .npy array ({e})")
            if name in self._objects:
                arr = arr.astype(object)
            arr.setflags(write=False)
            self._tensors[name] = arr
        return arr


# -- executables ------------------------------------------------------------

def executable_data(exe: Executable, writer: ArtifactWriter, step_data) -> dict:
    """The Executable's wiring as JSON data; `step_data(index, step) -> dict` describes
    what each step runs (the caller knows: compiled code, a host sub-graph)."""
    return {
        "slots": exe.n_slots, "inputs": list(exe.input_slots),
        "outputs": list(exe.output_slots),
        "constants": [[s, writer.add_tensor(a)] for s, a in exe.constants.items()],
        "steps": [{"label": st.label, "args": list(st.args), "results": list(st.results),
                   "frees": list(st.frees), **step_data(i, st)}
                  for i, st in enumerate(exe.steps)],
    }


def load_executable(data: dict, reader: ArtifactReader, fns: list) -> Executable:
    """The Executable `executable_data` described, running `fns[i]` as its step i (the
    caller rebuilt them from the steps' data)."""
    n = data["slots"]
    if len(fns) != len(data["steps"]):
        reader.fail(f"malformed manifest: {len(data['steps'])} steps, {len(fns)} rebuilt")
    steps = []
    for st, fn in zip(data["steps"], fns):
        slots = (tuple(st["args"]), tuple(st["results"]), tuple(st["frees"]))
        _check_slots(reader, n, *slots)
        steps.append(Step(fn, *slots, label=st["label"]))
    constants = {s: reader.tensor(name) for s, name in data["constants"]}
    _check_slots(reader, n, data["inputs"], data["outputs"], constants)
    return Executable(n, data["inputs"], data["outputs"], constants, steps)


def _check_slots(reader: ArtifactReader, n: int, *groups) -> None:
    """Slot numbers index the slot list: the manifest must not say otherwise."""
    for group in groups:
        for s in group:
            if not isinstance(s, int) or not 0 <= s < n:
                reader.fail(f"malformed manifest: slot {s!r} outside 0..{n - 1}")


def _check_path(path: Path) -> None:
    if not path.exists():
        raise ArtifactError(f"no such file: {path}")
    if path.is_dir():
        raise ArtifactError(f"{path} is a directory, not a braze artifact")


@contextlib.contextmanager
def _zip_errors(path: Path):
    """zipfile's and the OS's errors while reading `path`, as one ArtifactError each."""
    try:
        yield
    except zipfile.BadZipFile as e:
        why = "corrupted" if str(e).startswith("Bad CRC") else \
            "not a braze artifact: not a zip file, or a truncated one"
        raise ArtifactError(f"{path}: {why} ({e})") from None
    except (NotImplementedError, zlib.error) as e:  # an unknown compression, bad deflate
        raise ArtifactError(f"{path}: corrupted ({e})") from None
    except (OSError, EOFError) as e:
        raise ArtifactError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None


def json_depth(raw: bytes) -> int:
    """How deep the JSON text's arrays and objects nest (strings skipped), without
    parsing it (a parser would recurse that deep)."""
    depth = deepest = 0
    for bracket in _BRACKETS.findall(_STRINGS.sub(b"", raw)):
        depth += 1 if bracket in b"[{" else -1
        deepest = max(deepest, depth)
    return deepest


_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"')
_BRACKETS = re.compile(rb"[\[\]{}]")


def _is_size(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _feature_diff(saved, here: str) -> str:
    """' (features differ: not on this machine: a, b; only on this machine: c)', or ''."""
    if not isinstance(saved, str):
        return ""

    def enabled(features: str) -> set[str]:
        return {f[1:] for f in features.split(",") if f.startswith("+")}

    missing, extra = enabled(saved) - enabled(here), enabled(here) - enabled(saved)
    parts = [f"{label}: {_few(sorted(fs))}" for label, fs in
             (("not on this machine", missing), ("only on this machine", extra)) if fs]
    return f" (features differ: {'; '.join(parts)})" if parts else ""


def _few(items: list[str]) -> str:
    more = f" and {len(items) - _SHOWN_FEATURES} more" if len(items) > _SHOWN_FEATURES else ""
    return ", ".join(items[:_SHOWN_FEATURES]) + more
