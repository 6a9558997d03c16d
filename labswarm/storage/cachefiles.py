"""The files of a cache folder (:mod:`labswarm.storage.cache`) below its objects: the ledger (``.lock``, taken with
``flock`` by whoever adds or evicts, and ``.usage.json``, the cached bytes) and the synced writes of ``incoming/``."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path


class Ledger(contextlib.AbstractContextManager):
    """The cache's exclusive lock (``flock`` on ``.lock``) with its usage record, read on entry and written back
    on a clean exit."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def __enter__(self) -> dict[str, int]:
        self.folder.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.folder / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            self.state = {"bytes": int(json.loads((self.folder / ".usage.json").read_text())["bytes"])}
        except (OSError, ValueError, KeyError, TypeError):
            self.state = {"bytes": -1}  # unknown: recounted below
        if self.state["bytes"] < 0:
            self.state["bytes"] = count_bytes(self.folder / "objects")
        self._before = dict(self.state)
        return self.state

    def __exit__(self, exc_type: object, *rest: object) -> None:
        try:
            if self.state != self._before:
                tmp = self.folder / f".usage.{os.getpid()}.tmp"
                tmp.write_text(json.dumps(self.state))
                os.replace(tmp, self.folder / ".usage.json")
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)


def count_bytes(folder: Path) -> int:
    """Bytes of the files below ``folder`` (temporary files included: they will be removed or renamed)."""
    total = 0
    for dirpath, _dirs, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(dirpath, name)).st_size
    return total


def write_synced(path: Path, data: bytes | memoryview) -> None:
    """Write ``data`` into the new file ``path`` and sync it to the disk (``fsync``) before it is renamed into
    place: without, a host crash could leave the rename on disk but not all the bytes, a short file under the
    object's name (read back as a corrupt array, never fetched again while cached). The fills' writes run outside
    the cache's lock, so a sync delays only its own fill.

    Raises:
        OSError: the file cannot be created (it exists: ``O_EXCL``), written or synced.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
