"""Artifact files: one zip holding a JSON manifest, raw tensors and object code.

    manifest.json       format, format_version, braze_version, target (triple, CPU
                        name, feature string), `entries` (sha256 of every other
                        entry), and whatever the writer describes (bridge/artifact.py)
    tensors/<hash>.npy  numpy arrays, content-addressed (shared weights stored once),
                        written and read with allow_pickle=False
    ...                 text (IR) and bytes (object code) under names the manifest gives

Nothing here unpickles or evaluates anything: the manifest is JSON, tensors are
.npy without pickles, and the only code an artifact carries is the object code
that the caller loads on purpose. `ArtifactReader` refuses, with one ArtifactError
saying why, a missing or non-zip file, a damaged entry, another format version,
another braze version and another CPU. Writes are atomic (temporary file, then
`os.replace`), so a reader never sees half an artifact.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import secrets
import zipfile
from pathlib import Path

import numpy as np

from compiler import __version__
from compiler.errors import ArtifactError
from runtime.executable import Executable, Step

FORMAT = "braze-artifact"
# Bump on any change a reader of the previous layout would misread; readers accept
# exactly their own version (compiled code is tied to one braze anyway).
FORMAT_VERSION = 2  # 2: the target names its spec, vector features and requirements
MANIFEST = "manifest.json"
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
                "entries": {n: hashlib.sha256(d).hexdigest() for n, d in self.entries.items()}}
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
    manifest; the format version; every entry's sha256; braze's version; the CPU.
    """

    def __init__(self, path):
        self.path = Path(path)
        self.manifest, self._data = _read_zip(self.path)
        self._check_format()
        self._check_entries()
        self._check_version()
        self._check_target()
        self._objects = set(self.manifest.get("object_tensors", []))
        self._tensors: dict[str, np.ndarray] = {}

    def fail(self, why: str):
        """Raise ArtifactError naming this file."""
        raise ArtifactError(f"{self.path}: {why}")

    def _check_format(self) -> None:
        m = self.manifest
        if not isinstance(m, dict) or m.get("format") != FORMAT:
            self.fail("not a braze artifact (its manifest names no braze format)")
        v = m.get("format_version")
        if v != FORMAT_VERSION:
            age = "newer" if isinstance(v, int) and v > FORMAT_VERSION else "older"
            self.fail(f"artifact format version {v} is {age} than the version this braze "
                      f"({__version__}) reads ({FORMAT_VERSION}); compile the model again "
                      "with this braze (`braze compile`)")

    def _check_entries(self) -> None:
        entries = self.manifest.get("entries")
        if not isinstance(entries, dict):
            self.fail("malformed manifest: no entry checksums")
        for name, digest in entries.items():
            if name not in self._data:
                self.fail(f"corrupted: entry {name!r} is missing")
            if hashlib.sha256(self._data[name]).hexdigest() != digest:
                self.fail(f"corrupted: entry {name!r} does not match its checksum")

    def _check_version(self) -> None:
        v = self.manifest.get("braze_version")
        if v != __version__:
            self.fail(f"saved by braze {v}, this is braze {__version__}: compiled code is "
                      "tied to the braze that made it; compile the model again "
                      "(`braze compile`)")

    def _check_target(self) -> None:
        saved, here = self.manifest.get("target") or {}, target_info()
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


def load_executable(data: dict, reader: ArtifactReader, load_step) -> Executable:
    """The Executable `executable_data` described; `load_step(step data) -> fn`."""
    n = data["slots"]
    steps = []
    for st in data["steps"]:
        slots = (tuple(st["args"]), tuple(st["results"]), tuple(st["frees"]))
        _check_slots(reader, n, *slots)
        steps.append(Step(load_step(st), *slots, label=st["label"]))
    constants = {s: reader.tensor(name) for s, name in data["constants"]}
    _check_slots(reader, n, data["inputs"], data["outputs"], constants)
    return Executable(n, data["inputs"], data["outputs"], constants, steps)


def _check_slots(reader: ArtifactReader, n: int, *groups) -> None:
    """Slot numbers index the slot list: the manifest must not say otherwise."""
    for group in groups:
        for s in group:
            if not isinstance(s, int) or not 0 <= s < n:
                reader.fail(f"malformed manifest: slot {s!r} outside 0..{n - 1}")


def _read_zip(path: Path) -> tuple[dict, dict[str, bytes]]:
    """The manifest and every entry's bytes, or one ArtifactError saying what is wrong."""
    if not path.exists():
        raise ArtifactError(f"no such file: {path}")
    if path.is_dir():
        raise ArtifactError(f"{path} is a directory, not a braze artifact")
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
            if MANIFEST not in names:
                raise ArtifactError(f"{path}: not a braze artifact (no {MANIFEST})")
            data = {n: zf.read(n) for n in names}
    except zipfile.BadZipFile as e:
        why = "corrupted" if str(e).startswith("Bad CRC") else \
            "not a braze artifact: not a zip file, or a truncated one"
        raise ArtifactError(f"{path}: {why} ({e})") from None
    except (OSError, EOFError) as e:
        raise ArtifactError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    try:
        manifest = json.loads(data.pop(MANIFEST))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ArtifactError(f"{path}: corrupted manifest ({e})") from None
    return manifest, data


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
