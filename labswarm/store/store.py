"""The content-addressed feature store.

Layout under the store root (``LAYOUT_VERSION`` 1)::

    labswarm-store.json                  {"layout": 1}: written once; a store of another layout is refused
    v1/<k0k1>/<k2k3>/<key>.npy           one float32 array per key (NumPy .npy format, memory-mappable)

where ``key`` is the 40-hex-digit key of :func:`labswarm.store.keys.feature_key` and ``<k0k1>/<k2k3>`` its first
four hex digits: 65,536 shard directories keep each directory small at millions of entries. Entries are
written atomically through the byte storage underneath (:mod:`labswarm.storage`, the one the jobs' results use
too: ``local`` by default, a temporary file + rename), so computing a sample twice, on two hosts at once, is
harmless: the store holds it once. The store owns keys, layout and format; the storage only moves bytes.

The same layout lives in an object store (an ``s3`` storage: the layout's paths are object keys, and S3 makes an
object appear whole): workers write there and learners read through a bounded local cache
(:class:`~labswarm.storage.cache.CachedStorage`); see :meth:`FeatureStore.open`.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from labswarm.errors import StorageError, StoreError
from labswarm.storage.base import MissingObject, Storage, StorageConfig
from labswarm.storage.cache import DEFAULT_CACHE_BYTES, CachedStorage
from labswarm.storage.local import LocalStorage, LocalStorageConfig
from labswarm.store.npy import map_file, read_at
from labswarm.store.packs import PackReader
from labswarm.store.uploads import UPLOAD_THREADS, Uploads

T = TypeVar("T")

#: Version of the on-disk layout described in the module docstring.
LAYOUT_VERSION = 1
#: Marker file at the store root.
MARKER = "labswarm-store.json"
#: Requests at once when :meth:`FeatureStore.fetch` fills a cache (``labswarm store pull`` uses 8 as well).
FETCH_THREADS = 8
_KEY = re.compile(r"^[0-9a-f]{40}$")
_ENTRY = re.compile(rf"^v{LAYOUT_VERSION}/[0-9a-f]{{2}}/[0-9a-f]{{2}}/([0-9a-f]{{40}})\.npy$")


@dataclass(frozen=True, slots=True)
class StoreStats:
    """How much a store holds: ``entries`` arrays taking ``bytes`` bytes."""

    entries: int
    bytes: int


class FeatureStore:
    """Content-addressed storage of feature arrays.

    Args:
        root: the store's directory (local or shared), used when ``storage`` is not given.
        storage: where the bytes go (any :class:`~labswarm.storage.base.Storage`); default a ``local`` storage at
            ``root``, each file fsynced before its rename.

    Raises:
        StoreError: the root holds a store of another layout version, or cannot be created.
    """

    def __init__(self, root: str | Path | None = None, *, storage: Storage | None = None) -> None:
        if storage is None:
            if root is None:
                raise StoreError("a feature store needs a root directory or a storage")
            storage = LocalStorage(LocalStorageConfig(path=Path(root)))
        self.storage = storage
        self.root = Path(root) if root is not None else None
        #: where the store is, for messages (a folder, ``s3://bucket/prefix at URL (cached in FOLDER)``)
        self.where = str(root) if root is not None else storage.describe()
        self._fetcher: tuple[int, int, ThreadPoolExecutor] | None = None  # fetch()'s (process, count, threads)
        self._uploader: tuple[int, ThreadPoolExecutor] | None = None  # batch()'s upload threads, at first use
        self._batch = threading.local()  # .uploads: this thread's open batch of a remote store
        self._check_layout()
        #: reads the packed arrays of a remote store through its cache (:mod:`labswarm.store.packs`)
        self.packs = PackReader(self.origin, storage, self.relpath) if isinstance(storage, CachedStorage) else None

    @classmethod
    def open(cls, root: str | Path, *, remote: Mapping[str, Any] | StorageConfig | Storage | None = None,
             cache_bytes: int | None = DEFAULT_CACHE_BYTES) -> FeatureStore:
        """The experiment's store: the folder ``root``, or with ``remote`` the store in that storage (e.g.
        ``{name: s3, endpoint: ..., bucket: ..., prefix: ...}``; credentials from the environment or a file, see
        :mod:`labswarm.storage.s3`) read through a cache of at most ``cache_bytes`` bytes in ``root``
        (``None`` or 0: no cache, every read a request).

        Raises:
            ConfigError: ``remote`` names an unknown storage or has invalid parameters.
            StoreError: the store cannot be opened (another layout, unreachable).
        """
        if remote is None:
            return cls(root)
        storage = remote if isinstance(remote, Storage) else Storage.from_spec(remote)
        if cache_bytes:
            storage = CachedStorage(storage, Path(root), cache_bytes)
        return cls(storage=storage)

    def _call(self, call: Callable[[], T]) -> T:
        """``call()``, its storage errors as the feature store's."""
        try:
            return call()
        except StorageError as exc:
            raise StoreError(str(exc)) from exc

    def _check_layout(self) -> None:
        if self._call(lambda: self.storage.exists(MARKER)):
            try:
                layout = json.loads(self._call(lambda: self.storage.get_bytes(MARKER))).get("layout")
            except (ValueError, AttributeError) as exc:
                raise StoreError(f"corrupt {MARKER} in feature store {self.where}") from exc
            if layout != LAYOUT_VERSION:
                raise StoreError(
                    f"feature store {self.where} has layout {layout}; this labswarm reads layout {LAYOUT_VERSION}"
                )
        else:
            marker = json.dumps({"layout": LAYOUT_VERSION}).encode()
            self._call(lambda: self.storage.put_bytes(MARKER, marker))

    @property
    def origin(self) -> Storage:
        """The storage that holds the entries: :attr:`storage` itself, or the remote behind its cache."""
        storage = self.storage
        if isinstance(storage, CachedStorage):
            return storage.remote.at(storage.root) if storage.root else storage.remote
        return storage

    @staticmethod
    def relpath(key: str) -> str:
        """The entry's path relative to the root: ``v1/<k0k1>/<k2k3>/<key>.npy``.

        Raises:
            StoreError: ``key`` is not 40 lower-case hex digits.
        """
        if not _KEY.match(key):
            raise StoreError(f"invalid feature-store key {key!r}: expected 40 lower-case hex digits")
        return f"v{LAYOUT_VERSION}/{key[:2]}/{key[2:4]}/{key}.npy"

    def contains(self, key: str) -> bool:
        """Whether ``key`` is stored."""
        rel = self.relpath(key)
        return self._call(lambda: self.storage.exists(rel))

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.contains(key)

    def get(self, key: str, *, mmap: bool = False) -> np.ndarray:
        """The array stored under ``key``.

        Args:
            key: a feature key.
            mmap: memory-map the file read-only instead of reading it (storages of files, and a remote storage's
                cache): the array is read-only and its pages are read when touched (a crop reads its frames).

        Returns:
            The array as written by :meth:`put` (float32 ``(n_bins, n_frames)`` for features).

        Raises:
            StoreError: no such entry, or it cannot be read or parsed.
        """
        rel = self.relpath(key)
        for _ in range(2 if self.packs is not None else 0):
            assert self.packs is not None
            if (found := self.packs.locate(key)) is None:
                break
            try:
                return read_at(*found, mmap=mmap)
            except FileNotFoundError:  # its pack evicted since this process last used it: fetched again
                self.packs.forget(found[0])
            except (OSError, ValueError) as exc:
                if not isinstance(found[0], Path):  # bytes fetched and checked (CRC-32C)
                    raise StoreError(f"corrupt entry {key} in feature store {self.where} (in its pack): {exc}") from exc
                self.packs.discard(found[0], exc)  # its cached file cut off (a crash): this array read alone
                break
        path = self._call(lambda: self.storage.local_path(rel))
        try:
            if path is not None:
                try:
                    return map_file(path) if mmap else np.load(path, allow_pickle=False)
                except FileNotFoundError:
                    pass  # missing, or evicted from a cache since: asked of the storage below
            return np.load(io.BytesIO(self.storage.get_bytes(rel)), allow_pickle=False)
        except MissingObject:
            raise StoreError(f"no entry {key} in feature store {self.where}") from None
        except StorageError as exc:
            raise StoreError(f"cannot read entry {key} of feature store {self.where}: {exc}") from exc
        except (OSError, ValueError, EOFError) as exc:
            raise StoreError(f"corrupt entry {key} in feature store {self.where}: {exc}") from exc

    def cached(self, key: str) -> bool:
        """Whether ``key``'s array is in the local cache of a remote store, alone or in its pack (``False``
        without a cache)."""
        storage = self.storage
        return isinstance(storage, CachedStorage) and (storage.cached_path(self.relpath(key)).is_file() or (
            self.packs is not None and self.packs.cached(key)))

    def fetch(self, keys: Iterable[str], threads: int = FETCH_THREADS) -> int:
        """Bring the entries ``keys`` into the local cache of a remote store, up to ``threads`` requests at once
        (a cold read waits on one request at a time; a learner's chunk of 32 arrays costs one request's latency
        per ``threads`` arrays instead). Nothing to do without a cache, or for entries cached already. Errors are
        left to the reads that follow (a missing entry is reported by :meth:`get`).

        Memory: it holds at most :meth:`read_bytes` ``(threads, ...)`` bytes at once (packs are held whole until
        written into the cache); :meth:`fetch_threads` fits ``threads`` to a memory bound.

        Returns:
            The number of entries requested.
        """
        storage = self.storage
        if not isinstance(storage, CachedStorage):
            return 0
        packs: dict[str, str] = {}  # pack -> the first of its keys: one request brings them all
        missing = []
        for key in keys:
            if storage.cached_path(rel := self.relpath(key)).is_file():
                continue  # cached alone
            if self.packs is not None and (name := self.packs.pack_of(key)) is not None:
                if not self.packs.cached(key):
                    packs.setdefault(name, key)
            else:
                missing.append(rel)
        if len(missing) + len(packs) < 2:  # one read costs what one fetch does
            return 0

        def one(rel: str) -> None:
            with contextlib.suppress(StorageError):
                storage.warm(rel)

        def pack(key: str) -> None:
            assert self.packs is not None
            self.packs.locate(key)

        if self._fetcher is None or self._fetcher[:2] != (os.getpid(), threads):  # a forked child has no threads
            self._fetcher = (os.getpid(), threads, ThreadPoolExecutor(threads, thread_name_prefix="store-fetch"))
        pool = self._fetcher[2]
        list(pool.map(pack, packs.values()))
        list(pool.map(one, missing))
        return len(missing) + len(packs)

    def read_bytes(self, threads: int = 1, array_bytes: int = 0) -> int:
        """The most bytes this store's reads hold in memory at once, beyond the arrays they return, while
        :meth:`fetch` runs with ``threads`` threads (1: :meth:`get` alone), ``array_bytes`` the caller's bound on one
        array's ``.npy`` bytes: a remote store's packs (:meth:`PackReader.held_bytes`) plus, through a cache, each
        thread's array read alone until written there (``threads * array_bytes``), or without one, the array's
        bytes read before they are parsed (``array_bytes``); 0 for a local folder."""
        if isinstance(self.storage, LocalStorage):
            return 0
        if not isinstance(self.storage, CachedStorage):
            return array_bytes
        return (0 if self.packs is None else self.packs.held_bytes(threads)) + max(1, threads) * array_bytes

    def fetch_threads(self, max_bytes: int, array_bytes: int = 0, threads: int = FETCH_THREADS) -> int:
        """The most threads, up to ``threads``, whose :meth:`read_bytes` fit ``max_bytes`` (a memory limit's room
        for the store's reads); at least 1 (whether even one fits is the caller's check)."""
        return max([1, *(n for n in range(1, threads + 1) if self.read_bytes(n, array_bytes) <= max_bytes)])

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """The :meth:`put` calls of this thread inside the block made durable together by its end. A local folder
        (:meth:`LocalStorage.deferred_sync`): one sync instead of one per array; an array appears under its key
        only once its bytes are on disk. A remote store (:mod:`labswarm.store.uploads`): each array is sent by a
        background thread while this one goes on (the next sample computed meanwhile), a failed one tried again
        (:data:`~labswarm.store.uploads.STORE_RETRIES` attempts), at most
        :data:`~labswarm.store.uploads.UPLOAD_BYTES` held by the block at once, and the block's end waits until
        all are stored. Either way, until the block ends the arrays written inside may not be found, and once it has
        ended without an error every one is stored: acknowledge work only after it. Nested: the outer block.

        Raises:
            StoreError: (at the end) the sync, a rename or an upload failed; for a local folder the block's arrays
                not yet in place are removed (those placed before the failure were synced first); of a remote
                store, the arrays whose upload succeeded are stored (each object whole), the others failed on every
                attempt.
        """
        if not isinstance(self.storage, LocalStorage):
            if getattr(self._batch, "uploads", None) is not None:
                yield
                return
            if self._uploader is None or self._uploader[0] != os.getpid():  # a forked child has none of the threads
                self._uploader = (os.getpid(), ThreadPoolExecutor(UPLOAD_THREADS, thread_name_prefix="store-upload"))
            uploads = self._batch.uploads = Uploads(self._uploader[1])
            try:
                yield
            except BaseException:  # no upload outlives its batch; the block's own error is the one raised
                self._batch.uploads = None
                with contextlib.suppress(StoreError):
                    uploads.flush()
                raise
            self._batch.uploads = None
            uploads.flush()
            return
        try:
            with self.storage.deferred_sync():
                yield
        except StorageError as exc:
            raise StoreError(str(exc)) from exc

    def put(self, key: str, array: np.ndarray, *, stored: Callable[[str], None] | None = None) -> None:
        """Store ``array`` under ``key`` atomically (an existing entry is replaced by equal values); inside a
        :meth:`batch` of a remote store, sent by a background thread (durable at the batch's end).

        Args:
            stored: called with ``key`` once the array is stored (at once, or by the upload's thread).

        Raises:
            StoreError: object arrays (not storable without pickle) or a write failure (of an upload in a batch:
                at the batch's end).
        """
        array = np.asarray(array)
        if array.dtype.hasobject:
            raise StoreError(f"cannot store an object array under {key}")
        buffer = io.BytesIO()
        np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
        rel = self.relpath(key)
        data = buffer.getvalue()
        uploads: Uploads | None = getattr(self._batch, "uploads", None)
        if uploads is not None:
            uploads.submit(key, len(data), lambda: self.storage.put_bytes(rel, data),
                           None if stored is None else lambda: stored(key))
            return
        self._call(lambda: self.storage.put_bytes(rel, data))
        if stored is not None:
            stored(key)

    def delete(self, key: str) -> None:
        """Remove ``key`` if stored."""
        rel = self.relpath(key)
        self._call(lambda: self.storage.delete(rel))

    def stats(self) -> StoreStats:
        """Number of entries and their total size in bytes (lists the store)."""
        sizes = self.sizes()
        return StoreStats(len(sizes), sum(sizes.values()))

    def sizes(self) -> dict[str, int]:
        """Size in bytes of every entry, by key (lists the store: one listing request per 1,000 entries on s3).

        Raises:
            StoreError: the storage cannot be listed.
        """
        return {m.group(1): size for rel, size in self._call(lambda: self.storage.sizes(f"v{LAYOUT_VERSION}")).items()
                if (m := _ENTRY.match(rel))}

    def keys(self) -> Iterator[str]:
        """Every stored key (lists the store)."""
        return iter(self.sizes())

    def first_keys(self, limit: int = 999) -> tuple[list[str], bool]:
        """Up to ``limit`` stored keys (in the listing's order) and whether there are more: one listing request of
        a remote store (bypassing its cache: :attr:`origin`), the 1,000 entries of its first page.

        Raises:
            StoreError: the storage cannot be listed.
        """
        names, more = self._call(lambda: self.origin.first(f"v{LAYOUT_VERSION}", limit))
        return [m.group(1) for rel in names if (m := _ENTRY.match(rel))], more

    def shard_keys(self, shard: str) -> list[str]:
        """The stored keys that start with ``shard`` (two hex digits: the folder ``v1/<shard>/``; one listing
        request per 1,000 of its entries on s3).

        Raises:
            StoreError: ``shard`` is not two lower-case hex digits, or the storage cannot be listed.
        """
        if not re.fullmatch(r"[0-9a-f]{2}", shard):
            raise StoreError(f"invalid feature-store shard {shard!r}: expected 2 lower-case hex digits")
        names = self._call(lambda: self.storage.list(f"v{LAYOUT_VERSION}/{shard}"))
        return [m.group(1) for rel in names if (m := _ENTRY.match(rel)) and m.group(1).startswith(shard)]
