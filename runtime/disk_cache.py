"""On-disk cache of compiled code: content-addressed, atomic writes, self-checking.

An entry is stored as `<key>.bin`: a header line (magic, payload length, sha256
of the payload) followed by the payload. A reader that finds a short file, a
bad header or a wrong checksum treats the entry as absent and removes it, so a
corrupted or half-written entry is recompiled, never trusted. Writers write to a
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

MAGIC = b"braze-cache-v1"


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
        payload = _unwrap(data)
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
                    f.write(_wrap(payload))
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError:
            pass


def _wrap(payload: bytes) -> bytes:
    digest = hashlib.sha256(payload).hexdigest().encode()
    return MAGIC + b" " + str(len(payload)).encode() + b" " + digest + b"\n" + payload


def _unwrap(data: bytes) -> bytes | None:
    header, sep, payload = data.partition(b"\n")
    parts = header.split(b" ")
    if not sep or len(parts) != 3 or parts[0] != MAGIC:
        return None
    try:
        length = int(parts[1])
    except ValueError:
        return None
    if len(payload) != length or hashlib.sha256(payload).hexdigest().encode() != parts[2]:
        return None
    return payload
