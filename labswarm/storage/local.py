"""``local``: a directory on a local or shared (NFS) filesystem."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, ClassVar, Literal

from labswarm.errors import StorageError
from labswarm.storage.base import Storage, StorageConfig, register_storage
from labswarm.storage.stamps import Stamp


class LocalStorageConfig(StorageConfig):
    """Parameters of the ``local`` storage.

    Attributes:
        path: the directory; the same path on every host that runs the job's learners (NFS). A relative path in a
            manifest file is relative to the file's folder. Created at the first write.
        fsync: fsync each file before its rename (durable across a host crash; ~ms per write). Default on, as
            in the feature store.
    """

    name: Literal["local"] = "local"
    path: Path
    fsync: bool = True


def _stamp(stat: os.stat_result) -> Stamp:
    """A file's stamp: its version the inode and the modification time in ns (each write is a new file, renamed)."""
    return Stamp(stat.st_size, stat.st_mtime, f"{stat.st_ino}:{stat.st_mtime_ns}")


@register_storage
class LocalStorage(Storage):
    """A directory: a key is a file path below ``path/prefix``.

    Writes go to a uniquely named temporary file in the destination folder (``.<name>.<host>-<pid>-<uuid>.tmp``),
    are flushed (and fsynced), then ``os.replace``-d into place: rename within one folder is atomic on POSIX
    filesystems and on NFS, so a reader sees the old file or the new one, never a part, and many writers on many
    hosts are safe (the last rename wins; in the feature store a key fixes the content, so every winner holds the
    same values). A writer killed mid-write leaves its temporary file; the next write of that object removes it.
    Keys never start a segment with ``.``, so the temporary files are never listed. Deleting removes the folders it
    empties, up to the storage's root. The feature store (:class:`labswarm.store.store.FeatureStore`) and the jobs'
    data and results stores share this class.
    """

    name: ClassVar[str] = "local"
    config_model: ClassVar[type[StorageConfig]] = LocalStorageConfig
    config: LocalStorageConfig

    def _path(self, full: str) -> Path:
        return self.config.path / full if full else self.config.path

    def _describe(self, full: str) -> str:
        return str(self._path(full))

    def _write(self, full: str, fill: Callable[[IO[bytes]], object]) -> None:
        final = self._path(full)
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.is_dir():
            raise StorageError(f"cannot write {final}: a folder of that name holds other objects")
        prefix = f".{final.name}."
        tmp = final.parent / f"{prefix}{os.uname().nodename}-{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"
        deferred = _DEFERRED.get((id(self), threading.get_ident())) if self.config.fsync else None
        kept = False
        try:
            with open(tmp, "wb") as handle:
                fill(handle)
                handle.flush()
                if self.config.fsync and deferred is None:
                    os.fsync(handle.fileno())
            if deferred is not None:  # synced and put in place at the end of the batch (deferred_sync)
                deferred.append((tmp, final))
                kept = True
                return
            _place(tmp, final)
        finally:
            if not kept:
                with contextlib.suppress(OSError):
                    tmp.unlink()

    @contextlib.contextmanager
    def deferred_sync(self) -> Iterator[None]:
        """Make the writes of this thread inside the block durable together, at its end: each object is written
        to its temporary file as usual but not fsynced; at the block's end one ``syncfs(2)`` of the filesystem
        (Linux; elsewhere an fsync of each file) makes them all durable, then each is renamed into place. So an
        object appears under its name only once its bytes are on disk, as with a write outside a block, and a
        batch of N small objects costs one flush of the filesystem's journal instead of N (the feature store's
        per-array fsync was ~1.2 ms of a trivial task's ~2.3 ms at 8 samples per message, issue 27: 2026-11-26, 2-core
        machine under load; docs/benchmarks/distributed.md).

        Until the block ends, its objects are not readable under their names (a reader finds them missing). A
        process killed inside the block leaves their temporary files (removed by the next write of each object)
        and none of them in place. Without ``fsync`` in the config, or nested, the block changes nothing.
        ``syncfs`` also writes out the other dirty data of that filesystem (other processes' writes): on a disk
        busy with large writes, a batch may wait for those too.

        Raises:
            StorageError: (at the block's end) the sync or a rename failed; the objects not yet in place are
                removed, none is left half-written.
        """
        key = (id(self), threading.get_ident())
        if not self.config.fsync or key in _DEFERRED:
            yield
            return
        pending: list[tuple[Path, Path]] = []
        _DEFERRED[key] = pending
        try:
            yield
        finally:
            del _DEFERRED[key]
            self._commit(pending)

    def _commit(self, pending: list[tuple[Path, Path]]) -> None:
        """Sync the temporary files of ``pending`` (``(temporary, final)`` paths), then put each in place."""
        if not pending:
            return
        placed = 0
        try:
            if not _syncfs(pending[0][0].parent):
                for tmp, _ in pending:
                    fd = os.open(tmp, os.O_RDONLY)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
            for tmp, final in pending:
                _place(tmp, final)
                placed += 1
        except OSError as exc:
            for tmp, _ in pending[placed:]:
                with contextlib.suppress(OSError):
                    tmp.unlink()
            raise StorageError(f"cannot write {len(pending) - placed} objects under {self.config.path}: "
                               f"{exc.strerror or exc}") from exc

    def _put_bytes(self, full: str, data: bytes) -> None:
        self._write(full, lambda handle: handle.write(data))

    def _put_file(self, full: str, path: Path) -> None:
        def copy(handle: IO[bytes]) -> None:
            with open(path, "rb") as source:
                shutil.copyfileobj(source, handle, 1 << 20)

        self._write(full, copy)

    def _open(self, full: str) -> IO[bytes]:
        path = self._path(full)
        if not path.is_file():
            raise self._missing(full)
        try:
            return open(path, "rb")
        except FileNotFoundError:
            raise self._missing(full) from None

    def _get_bytes(self, full: str) -> bytes:
        with self._open(full) as handle:
            return handle.read()

    def _get_range(self, full: str, start: int, length: int) -> bytes:
        with self._open(full) as handle:
            handle.seek(start)
            return handle.read(length)

    def _read_into(self, full: str, handle: IO[bytes]) -> None:
        with self._open(full) as source:
            shutil.copyfileobj(source, handle, 1 << 20)

    def _exists(self, full: str) -> bool:
        return self._path(full).is_file()

    def _local_path(self, full: str) -> Path:
        return self._path(full)

    def _sizes(self, folder: str) -> Iterator[tuple[str, int]]:
        base = self.config.path
        for key in self._list(folder):
            with contextlib.suppress(FileNotFoundError):  # deleted since it was listed
                yield key, (base / key).stat().st_size

    def _modified(self, folder: str) -> Iterator[tuple[str, Stamp]]:
        base = self.config.path
        for key in self._list(folder):
            with contextlib.suppress(FileNotFoundError):  # deleted since it was listed
                yield key, _stamp((base / key).stat())

    def _delete_if(self, full: str, version: str) -> bool:
        """Delete the file if it is ``version``. Its stamp is checked first (a file written since stays in place:
        a reader never misses it), then it is taken aside by a rename (atomic: a write placed later stays) and
        checked again (a write between the two): deleted if it is ``version``, else put back, by a link (which never
        replaces a file written meanwhile) or, where the filesystem has no hard links, a rename while the name is
        free; never deleted unless it is ``version`` or a newer file took its place. The folder is synced after
        when the config says ``fsync``; a crash between leaves ``.<name>.<time_ns>-<random>.del`` (the rename's
        wall-clock time in ns), which :func:`remove_aside` puts back or removes."""
        path = self._path(full)
        try:
            if _stamp(path.stat()).version != version:
                return False
            aside = path.parent / f".{path.name}.{time.time_ns()}-{uuid.uuid4().hex[:12]}.del"
            os.rename(path, aside)
        except FileNotFoundError:
            return False
        try:
            if deleted := _stamp(aside.stat()).version == version:
                aside.unlink()
            else:
                _put_back(aside, path)
        finally:
            if self.config.fsync:
                _fsync_folder(path.parent)
        return deleted

    def _list(self, folder: str) -> Iterator[str]:
        top = self._path(folder)
        if not top.is_dir():
            return
        base = self.config.path
        for dirpath, dirs, files in os.walk(top):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            for name in files:
                if not name.startswith("."):  # temporary files of writes in progress
                    yield (Path(dirpath) / name).relative_to(base).as_posix()

    def _delete_many(self, fulls: list[str]) -> None:
        folders: set[Path] = set()
        for full in fulls:
            path = self._path(full)
            path.unlink(missing_ok=True)
            folders.update(p for p in path.parents if p != self.config.path and self.config.path in p.parents)
        for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty; never the storage's own directory

    def _reachable(self) -> None:
        path = self._path(self.root)
        existing = next((p for p in (path, *path.parents) if p.exists()), None)
        if existing is None or not existing.is_dir():
            raise StorageError(f"{path}: {existing} is not a folder" if existing else f"{path}: no such folder")
        if not os.access(existing, os.W_OK | os.X_OK):
            what = "folder" if existing == path else f"nearest existing parent {existing}"
            raise StorageError(f"{path}: the {what} is not writable")


#: The batches of :meth:`LocalStorage.deferred_sync` under way: ``(id(storage), thread id)`` -> the writes waiting
#: for the batch's sync (kept here, not on the storage, which stays picklable).
_DEFERRED: dict[tuple[int, int], list[tuple[Path, Path]]] = {}


@functools.cache
def _syncfs_call() -> Callable[[int], int] | None:
    """libc's ``syncfs`` (Linux >= 2.6.39), or ``None`` where there is none."""
    try:
        call = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    call.argtypes, call.restype = [ctypes.c_int], ctypes.c_int
    return call


def _syncfs(folder: Path) -> bool:
    """``syncfs(2)`` of the filesystem that holds ``folder``; ``False`` where the call does not exist.

    Raises:
        OSError: the call failed (e.g. EIO: the data could not be written).
    """
    call = _syncfs_call()
    if call is None:
        return False
    fd = os.open(folder, os.O_RDONLY)
    try:
        if call(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), str(folder))
    finally:
        os.close(fd)
    return True


def _place(tmp: Path, final: Path) -> None:
    """Rename the written temporary file ``tmp`` to ``final`` (atomic), then remove earlier leftovers of it."""
    try:
        os.replace(tmp, final)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ESTALE) and final.is_file():
            return  # a concurrent writer of this key removed our temporary file (below): its object won
        raise
    _remove_leftovers(final.parent, f".{final.name}.")


def _remove_leftovers(folder: Path, prefix: str) -> None:
    """Remove the temporary files of earlier writes of an object that now exists: a writer killed mid-write
    (kill -9, out of memory) leaves its temporary file, and a feature-store entry is written again when its sample
    is redelivered. A live concurrent writer that loses its file finds the object in place (see ``_write``)."""
    try:
        with os.scandir(folder) as entries:
            stale = [e.path for e in entries if e.name.startswith(prefix) and e.name.endswith(".tmp")]
    except OSError:
        return
    for path in stale:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _put_back(aside: Path, path: Path) -> bool:
    """Put the file ``aside`` back at ``path`` unless another file took its place (then ``aside`` goes): a link, or
    where links fail (no hard links: EPERM, ENOTSUP, EXDEV) a rename while ``path`` is free (the one case where a
    write landing in between is replaced: both are writes of the same content-addressed object); whether it was put
    back."""
    back = True
    try:
        os.link(aside, path)
    except FileExistsError:
        back = False
    except OSError:
        if not path.exists():
            os.rename(aside, path)
            return True
        back = False
    aside.unlink()
    return back


def _fsync_folder(folder: Path) -> None:
    """``fsync`` of ``folder`` itself: its entries' renames and removals made durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_aside(folder: Path, older_s: float) -> int:
    """Settle the files a conditional delete (:meth:`LocalStorage.delete_if`) took aside in ``folder`` over
    ``older_s`` seconds ago and a crash left there (``.<name>.<time_ns>-<random>.del``, aged by the time in their
    name; the older ``.<name>.<random>.del`` by their ``ctime``): each is put back as ``<name>`` while that name is
    free (it may be a newer file written between the delete's check and its rename; an orphan put back is removed
    by the next ``gc``), else removed (a newer file took its place). The number removed, those put back not
    counted (none when ``folder`` does not exist or cannot be read: a sweep, best effort)."""
    since, removed = time.time() - older_s, 0
    try:
        with os.scandir(folder) as entries:
            stale = [(Path(e.path), name) for e in entries if (name := _aside_of(e, since)) is not None]
    except OSError:  # no such folder (or unreadable): nothing to sweep, as best effort
        return 0
    for aside, name in stale:
        with contextlib.suppress(OSError):
            removed += not _put_back(aside, folder / name)
    return removed


def _aside_of(entry: os.DirEntry, since: float) -> str | None:
    """The name ``entry`` was taken aside from when it is a conditional delete's leftover taken aside before
    ``since`` (s since the epoch); else ``None``."""
    if not (entry.name.startswith(".") and entry.name.endswith(".del")):
        return None
    name, _, tag = entry.name[1:-4].rpartition(".")
    stamp = tag.partition("-")[0]
    when = int(stamp) / 1e9 if "-" in tag and stamp.isdigit() else entry.stat(follow_symlinks=False).st_ctime
    return name if name and when < since else None
