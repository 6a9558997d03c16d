"""A local cache in front of a remote storage: bounded in bytes, least recently used out, shared by the processes
of one machine.

The learners of a machine read the same feature arrays every epoch; from an object store each read is a request
(~ms). :class:`CachedStorage` keeps a copy of what was read in a local folder, so the next read is a local file
(memory-mappable, :meth:`~labswarm.storage.base.Storage.local_path`). Writes go to the remote only (a worker that
computes features does not fill its own disk).

Layout of the cache folder::

    .lock                   taken (``flock``, exclusive) by whoever adds or evicts
    .usage.json             {"bytes": N}: the bytes of the cached objects, changed under the lock
    objects/<full key>      one file per cached object (the remote's full key)
    incoming/<random>.tmp   an object being added: written and synced without the lock, then renamed under it

The bound holds at every moment for ``objects/``: an object is written into ``incoming/`` without the lock (so that
the threads and processes filling the cache write at once: under the lock, each fill's write waited for the
others', and at 32 threads they spent longer waiting for the lock than for their GETs, 2026-11-26, load ~34,
docs/benchmarks/store.md), then renamed into place under the lock, after evicting least recently used files until
the cache's bytes plus the new object's fit (down to :data:`LOW_WATER` of the bound, so that eviction, which lists
the folder, runs once per many additions). Recency is the file's modification time, set on a hit (``os.utime``, no
lock) unless the same process set it less than :data:`TOUCH_S` ago (then a hit costs no system call). Readers take
no lock: a file appears whole (written beside it, then renamed) and an evicted file that is already open or memory-
mapped stays readable (POSIX unlink semantics). A reader that loses a file to eviction between finding and opening
it fetches it again. Eviction recounts the folder and so repairs the usage after a process was killed mid-way or a
file was removed by hand.
"""

from __future__ import annotations

import builtins
import contextlib
import math
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, ClassVar

from labswarm.errors import StorageError
from labswarm.storage.base import MissingObject, Storage, StorageConfig
from labswarm.storage.cachefiles import Ledger, write_synced
from labswarm.storage.stamps import Stamp

#: Seconds after which a file of the cache's ``incoming/`` folder is a killed process's, removed by an eviction.
STALE_S = 3600.0
#: After an eviction the cache holds at most this share of its bound (plus the object being added).
LOW_WATER = 0.9
#: Default bound of a cache, in bytes (10 GiB).
DEFAULT_CACHE_BYTES = 10 * 2**30
#: Default recency granularity in seconds (:attr:`CachedStorage.touch_s`): an epoch over a cached data set takes
#: far longer, so the order of eviction is the order of use at this scale.
TOUCH_S = 10.0
#: Files whose last touch a process remembers (~150 bytes each) before it forgets them all.
TOUCHED_ENTRIES = 100_000


class CachedStorage(Storage):
    """``remote`` behind a bounded local cache in ``folder`` (see the module docstring).

    Args:
        remote: the storage that holds the objects (e.g. ``s3``).
        folder: the cache's local folder (created), for every process of this machine that uses ``remote``.
        max_bytes: the most bytes of objects the cache holds (>= 0; 0 caches nothing). An object larger than the
            bound is read without being cached.
        scope: see :meth:`Storage.at`.

    Raises:
        StorageError: ``max_bytes`` is negative.
    """

    name: ClassVar[str] = "cached"

    def __init__(self, remote: Storage, folder: str | Path, max_bytes: int = DEFAULT_CACHE_BYTES, *,
                 scope: str = "") -> None:
        super().__init__(StorageConfig(name="cached"), scope=scope)
        if max_bytes < 0:
            raise StorageError(f"a cache bound must be >= 0 bytes, got {max_bytes}")
        self.remote, self.folder, self.max_bytes = remote, Path(folder), int(max_bytes)
        self._objects = self.folder / "objects"
        self._objects_str = str(self._objects)
        #: recency granularity in s: a hit sooner than this after this process's last one does not touch the file
        self.touch_s = TOUCH_S
        self._touched: dict[str, float] = {}  # file -> when this process last touched it (time.monotonic)

    # the cache itself
    def usage(self) -> int:
        """Bytes of the cached objects, as last counted (under the lock)."""
        with self._locked() as state:
            return int(state["bytes"])

    def cached_path(self, key: str) -> Path:
        """Where the cached copy of ``key`` lives (it may not exist)."""
        return self._objects / self._full(key)

    def warm(self, key: str) -> bool:
        """Fetch ``key`` into the cache unless it is there.

        Returns:
            whether the object is cached now (``False``: larger than the bound).

        Raises:
            MissingObject: the remote holds no such object.
            StorageError: the remote or the cache folder failed.
        """
        full = self._full(key)
        return self._guard("cache", full, lambda: self._fetch(full, keep_bytes=False)[0] is not None)

    def insert(self, items: Sequence[tuple[str, bytes | memoryview]]) -> int:
        """Add objects fetched and checked by the caller (a pack of arrays, :mod:`labswarm.store.packs`),
        ``(key, bytes)`` in order of priority: each written into ``incoming/`` without the lock, then all renamed
        into place under one taking of it, after one eviction for all of them. Those that would take the total
        beyond the bound are left out (the first that does not fit and every one after it); objects cached already
        are kept as they are.

        Returns:
            how many of ``items`` are cached now.

        Raises:
            StorageError: an invalid key, or the cache folder failed.
        """
        chosen, room = [], self.max_bytes
        for key, data in items:
            if len(data) > room:
                break
            chosen.append((self._objects / self._full(key), data))
            room -= len(data)
        if not chosen:
            return 0
        incoming = self.folder / "incoming"
        tmps: builtins.list[Path] = []

        def place() -> int:
            incoming.mkdir(parents=True, exist_ok=True)
            for _path, data in chosen:
                tmps.append(tmp := incoming / f"{uuid.uuid4().hex}.tmp")
                write_synced(tmp, data)  # outside the lock, as a single fill
            with self._locked() as state:
                new = [(path, len(data), tmp) for (path, data), tmp in zip(chosen, tmps, strict=True)
                       if not path.is_file()]
                need = sum(size for _path, size, _tmp in new)
                if state["bytes"] + need > self.max_bytes:
                    state["bytes"] = self._evict(max(0, int(self.max_bytes * LOW_WATER) - need))
                for path, size, tmp in new:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(tmp, path)
                    state["bytes"] += size
            return len(chosen)

        try:
            return self._guard("cache", self._full(items[0][0]), place)
        finally:
            for tmp in tmps:
                with contextlib.suppress(OSError):
                    tmp.unlink()

    def discard(self, key: str) -> None:
        """Remove the cached copy of ``key`` (found damaged by its reader: cut off by a crash before the file's
        bytes reached the disk), not the remote's object: the next read fetches it again.

        Raises:
            StorageError: an invalid key, or the cache folder failed.
        """
        path = self.cached_path(key)
        self._touched.pop(str(path), None)

        def remove() -> None:
            with self._locked() as state, contextlib.suppress(FileNotFoundError):
                size = path.stat().st_size
                path.unlink()
                state["bytes"] = max(0, state["bytes"] - size)

        self._guard("discard", self._full(key), remove)

    def _locked(self) -> contextlib.AbstractContextManager[dict[str, int]]:
        return Ledger(self.folder)

    def _touch(self, path: Path | str, *, remembered: bool = False) -> bool:
        """Mark a cached file as just used; ``False`` when it is not (or no longer) there. With ``remembered``, a
        file this process touched less than :attr:`touch_s` ago is taken as there without a system call (the
        reader's hit path: a file evicted since by another process is found missing when it is opened, and
        fetched again)."""
        now = time.monotonic()
        name = str(path)
        if remembered and now - self._touched.get(name, -math.inf) < self.touch_s:
            return True
        try:
            os.utime(path)
        except FileNotFoundError:
            self._touched.pop(name, None)
            return False
        if len(self._touched) >= TOUCHED_ENTRIES:
            self._touched.clear()
        self._touched[name] = now
        return True

    def _fetch(self, full: str, *, keep_bytes: bool) -> tuple[Path | None, bytes | None]:
        """The cached file of ``full``, fetched from the remote if needed (``None`` when it cannot be cached), and,
        when ``keep_bytes``, the bytes if they were fetched."""
        path = self._objects / full
        if self._touch(path):
            return path, None
        data = self.remote.get_bytes(full)
        size = len(data)
        if size > self.max_bytes:
            return None, data
        incoming = self.folder / "incoming"
        incoming.mkdir(parents=True, exist_ok=True)
        tmp = incoming / f"{uuid.uuid4().hex}.tmp"
        try:
            write_synced(tmp, data)  # outside the lock: the fetching threads and processes write at once
            with self._locked() as state:
                if path.is_file():  # another process fetched it meanwhile
                    return path, data if keep_bytes else None
                if state["bytes"] + size > self.max_bytes:
                    state["bytes"] = self._evict(max(0, int(self.max_bytes * LOW_WATER) - size))
                path.parent.mkdir(parents=True, exist_ok=True)
                os.replace(tmp, path)
                state["bytes"] += size
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()
        return path, data if keep_bytes else None

    def _evict(self, target: int) -> int:
        """Remove least recently used files until at most ``target`` bytes remain (and every temporary file left
        among them by an older version, and those of ``incoming/`` older than :data:`STALE_S`: a killed process's).
        Called under the lock. Returns the bytes that remain."""
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.folder / "incoming"):
                with contextlib.suppress(OSError):
                    if time.time() - entry.stat().st_mtime > STALE_S:
                        os.unlink(entry.path)
        files: list[tuple[int, int, str]] = []
        for dirpath, _dirs, names in os.walk(self._objects):
            for name in names:
                path = os.path.join(dirpath, name)
                try:
                    st = os.stat(path)
                except FileNotFoundError:
                    continue
                if name.startswith("."):
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                    continue
                files.append((st.st_mtime_ns, st.st_size, path))
        files.sort()
        total = sum(size for _, size, _ in files)
        for _, size, path in files:
            if total <= target:
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            total -= size
        return total

    # primitives
    def at(self, prefix: str) -> CachedStorage:
        """See :meth:`Storage.at`; the view shares the remote and the cache folder."""
        view = super().at(prefix)
        assert isinstance(view, CachedStorage)
        return view

    def _describe(self, full: str) -> str:
        return f"{self.remote.describe(full)} (cached in {self.folder})"

    def _put_bytes(self, full: str, data: bytes) -> None:
        self.remote.put_bytes(full, data)

    def _put_file(self, full: str, path: Path) -> None:
        self.remote.put_file(full, path)

    def _get_bytes(self, full: str) -> bytes:
        for _ in range(3):  # a file evicted between finding and reading it is fetched again
            path, data = self._fetch(full, keep_bytes=True)
            if data is not None:
                return data
            assert path is not None
            try:
                return path.read_bytes()
            except FileNotFoundError:
                self._touched.pop(str(path), None)  # evicted by another process: fetched again
        return self.remote.get_bytes(full)

    def _read_into(self, full: str, handle: IO[bytes]) -> None:
        handle.write(self._get_bytes(full))

    def _exists(self, full: str) -> bool:
        return (self._objects / full).is_file() or self.remote.exists(full)

    def _local_path(self, full: str) -> Path | None:
        """The cached file, fetched on a miss; ``None`` when it cannot be cached; a path that does not exist when
        the remote has no such object."""
        hit = os.path.join(self._objects_str, full)
        if self._touch(hit, remembered=True):  # the hit path, a learner's every read
            return Path(hit)

        def fetch() -> Path | None:
            try:
                return self._fetch(full, keep_bytes=False)[0]
            except MissingObject:
                return self._objects / full

        return self._guard("cache", full, fetch)

    def _list(self, folder: str) -> Iterator[str]:
        return iter(self.remote.list(folder))

    def _sizes(self, folder: str) -> Iterator[tuple[str, int]]:
        return iter(self.remote.sizes(folder).items())

    def _modified(self, folder: str) -> Iterator[tuple[str, Stamp]]:
        return iter(self.remote.modified(folder).items())

    def _delete_if(self, full: str, version: str) -> bool:
        """Delete the remote's object if it is ``version`` (what a listing saw is the remote's), then its cached
        copy, as :meth:`_delete_many` does."""
        if not self.remote.delete_if(full, version):
            return False
        self._uncache([full])
        return True

    def _delete_many(self, fulls: builtins.list[str]) -> None:
        self.remote._delete_many([self.remote._full(full) for full in fulls])
        self._uncache(fulls)

    def _uncache(self, fulls: builtins.list[str]) -> None:
        """Remove the cached copies of ``fulls`` (full keys) and their bytes from the usage record."""
        with self._locked() as state:
            for full in fulls:
                path = self._objects / full
                with contextlib.suppress(FileNotFoundError):
                    size = path.stat().st_size
                    path.unlink()
                    state["bytes"] = max(0, state["bytes"] - size)

    def _reachable(self) -> None:
        self.remote.reachable()
        self.folder.mkdir(parents=True, exist_ok=True)
        if not os.access(self.folder, os.W_OK | os.X_OK):
            raise StorageError(f"the cache folder {self.folder} is not writable")
