"""On-disk cache of compiled code: content-addressed, atomic writes, self-checking.

An entry is stored as `<key>.bin`: a header line (magic, body length, sha256 of
the body) followed by the body, which is the key, a newline and the payload. A
reader that finds a short file, a bad header, a wrong checksum or a body holding
another key (an entry copied or renamed over this one: its checksum is valid, its
code is another graph's) treats the entry as absent and removes it, so a
corrupted, half-written or misplaced entry is recompiled and rewritten, never
trusted. Writers write to a
temporary file in the same directory and `os.replace` it into place, so readers
in other processes see either nothing or a whole entry.

The directory is `$BRAZE_CACHE_DIR`, else `$XDG_CACHE_HOME/braze`, else
`~/.cache/braze`. `BRAZE_CACHE_DIR=off` disables the cache.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

MAGIC = b"braze-cache-v2"  # v2: the key is inside the checksummed body


def default_dir() -> Path | None:
    """The cache directory from the environment (None when disabled)."""
    env = os.environ.get("BRAZE_CACHE_DIR")
    if env:
        return None if env.lower() in ("off", "0", "none") else Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "braze"


class DiskCache:
    """get/put of byte payloads by key; a missing directory is created on first put."""

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root is not None else default_dir()

    @property
    def enabled(self) -> bool:
        return self.root is not None

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.bin"

    def get(self, key: str) -> bytes | None:
        """The payload stored under `key`, or None (absent, disabled or corrupted)."""
        if not self.enabled:
            return None
        path = self._path(key)
        try:
            data = path.read_bytes()
        except OSError:
            return None
        payload = _unwrap(data, key)
        if payload is None:
            try:
                path.unlink()
            except OSError:
                pass
        return payload

    def put(self, key: str, payload: bytes) -> None:
        """Store atomically; errors (read-only disk, full disk) are ignored: it is a cache."""
        if not self.enabled:
            return
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(_wrap(key, payload))
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError:
            pass


def _wrap(key: str, payload: bytes) -> bytes:
    body = key.encode() + b"\n" + payload
    digest = hashlib.sha256(body).hexdigest().encode()
    return MAGIC + b" " + str(len(body)).encode() + b" " + digest + b"\n" + body


def _unwrap(data: bytes, key: str) -> bytes | None:
    """The payload of a whole entry written under `key`; None for anything else."""
    header, sep, body = data.partition(b"\n")
    parts = header.split(b" ")
    if not sep or len(parts) != 3 or parts[0] != MAGIC:
        return None
    try:
        length = int(parts[1])
    except ValueError:
        return None
    if len(body) != length or hashlib.sha256(body).hexdigest().encode() != parts[2]:
        return None
    stored, sep, payload = body.partition(b"\n")
    return payload if sep and stored == key.encode() else None
