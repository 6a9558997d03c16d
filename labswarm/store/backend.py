"""Store backends: they only move bytes at relative paths; the store owns keys, layout and formats."""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path

from labswarm.errors import StoreError


class StoreBackend(ABC):
    """Where a feature store keeps its bytes. Paths are relative, ``/``-separated."""

    @abstractmethod
    def exists(self, rel: str) -> bool:
        """Whether an entry is stored at ``rel``."""

    @abstractmethod
    def read(self, rel: str) -> bytes:
        """The bytes at ``rel``. Raises ``StoreError`` if missing or unreadable."""

    @abstractmethod
    def write_atomic(self, rel: str, data: bytes) -> None:
        """Store ``data`` at ``rel`` so that a reader sees either nothing or all of it, never a part."""

    @abstractmethod
    def delete(self, rel: str) -> None:
        """Remove the entry at ``rel`` if present."""

    @abstractmethod
    def walk(self) -> Iterator[tuple[str, int]]:
        """Every stored ``(rel, size in bytes)``."""

    def local_path(self, rel: str) -> Path | None:
        """A local file path for ``rel`` (for memory mapping) when the backend has one, else ``None``."""
        return None


class LocalBackend(StoreBackend):
    """A directory on a local or shared (NFS) filesystem.

    Writes go to a uniquely named temporary file in the destination directory (``.<name>.<host-pid-uuid>.tmp``),
    are flushed and fsynced, then ``os.replace``-d into place: rename within one directory is atomic on POSIX
    filesystems and on NFS, so many writers on many hosts are safe; the last rename wins, and since a key fixes
    the content, every winner holds the same values. A writer killed mid-write leaves its temporary file; the
    next write of that entry (its sample is computed again, since the entry is missing) removes it.

    Args:
        root: the store's directory; created when missing.
        fsync: fsync each file before the rename (durable across a host crash; ~ms per write).

    Raises:
        StoreError: ``root`` exists and is not a directory, or cannot be created.
    """

    def __init__(self, root: str | Path, *, fsync: bool = True) -> None:
        self.root = Path(root)
        self.fsync = fsync
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create feature store at {self.root}: {exc.strerror or exc}") from exc
        self._tag = f"{os.uname().nodename}-{os.getpid()}"

    def local_path(self, rel: str) -> Path:
        return self.root / rel

    def exists(self, rel: str) -> bool:
        return (self.root / rel).is_file()

    def read(self, rel: str) -> bytes:
        try:
            return (self.root / rel).read_bytes()
        except FileNotFoundError:
            raise StoreError(f"no entry {rel} in {self.root}") from None
        except OSError as exc:
            raise StoreError(f"cannot read {self.root / rel}: {exc.strerror or exc}") from exc

    def write_atomic(self, rel: str, data: bytes) -> None:
        final = self.root / rel
        prefix = f".{final.name}."
        tmp = final.parent / f"{prefix}{self._tag}-{uuid.uuid4().hex[:8]}.tmp"
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as handle:
                handle.write(data)
                handle.flush()
                if self.fsync:
                    os.fsync(handle.fileno())
            os.replace(tmp, final)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            if exc.errno in (errno.ENOENT, errno.ESTALE) and final.is_file():
                return  # a concurrent writer of this key (same content) removed our temporary file: its entry won
            raise StoreError(f"cannot write {final}: {exc.strerror or exc}") from exc
        self._remove_leftovers(final.parent, prefix)

    @staticmethod
    def _remove_leftovers(folder: Path, prefix: str) -> None:
        """Remove the temporary files of earlier writes of an entry that now exists: a writer killed mid-write
        (kill -9, out of memory) leaves its temporary file, and the key is written again when its sample is
        redelivered. A live concurrent writer that loses its file finds the entry in place (see above)."""
        try:
            with os.scandir(folder) as entries:
                stale = [e.path for e in entries if e.name.startswith(prefix) and e.name.endswith(".tmp")]
        except OSError:
            return
        for path in stale:
            with contextlib.suppress(OSError):
                os.unlink(path)

    def delete(self, rel: str) -> None:
        try:
            (self.root / rel).unlink(missing_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot delete {self.root / rel}: {exc.strerror or exc}") from exc

    def walk(self) -> Iterator[tuple[str, int]]:
        for dirpath, _dirs, files in os.walk(self.root):
            for name in files:
                if name.startswith("."):
                    continue  # temporary files of writes in progress
                full = Path(dirpath) / name
                try:
                    size = full.stat().st_size
                except FileNotFoundError:
                    continue
                yield full.relative_to(self.root).as_posix(), size
