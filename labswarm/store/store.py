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
(:class:`~labswarm.storage.cache.CachedStorage`); see :meth:`FeatureStore.open`. There, a batch's arrays are
written by default as one pack and its index (``written/v1/``: :mod:`labswarm.store.written`), read and listed as
the per-key objects are.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import resource
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from labswarm.errors import StorageError, StoreError
from labswarm.storage.base import MissingObject, Storage, StorageConfig
from labswarm.storage.cache import DEFAULT_CACHE_BYTES, CachedStorage
from labswarm.storage.local import LocalStorage, LocalStorageConfig
from labswarm.store.entries import LAYOUT_VERSION as LAYOUT_VERSION  # re-exported: the layout's version
from labswarm.store.entries import Entries
from labswarm.store.entries import StoreStats as StoreStats  # re-exported
from labswarm.store.npy import map_file
from labswarm.store.pack_batch import PackBatch
from labswarm.store.packs import PackReader
from labswarm.store.uploads import UPLOAD_THREADS, Uploads
from labswarm.store.written import REFRESH_S, WrittenPacks, default_packed, read_packed
from labswarm.threads import thread_address_space

#: Marker file at the store root.
MARKER = "labswarm-store.json"
#: Requests at once when :meth:`FeatureStore.fetch` fills a cache (``labswarm store pull`` uses 8 as well).
FETCH_THREADS = 8
_KEY = re.compile(r"^[0-9a-f]{40}$")


class FeatureStore(Entries):
    """Content-addressed storage of feature arrays.

    Args:
        root: the store's directory (local or shared), used when ``storage`` is not given.
        storage: where the bytes go (any :class:`~labswarm.storage.base.Storage`); default a ``local`` storage at
            ``root``, each file fsynced before its rename.
        packed: a remote store's :meth:`batch` writes its arrays as one pack (:mod:`labswarm.store.written`);
            ``None``: :func:`~labswarm.store.written.default_packed`; ignored for a local folder (one file per key).

    Raises:
        StoreError: the root holds a store of another layout version, or cannot be created.
    """

    def __init__(self, root: str | Path | None = None, *, storage: Storage | None = None,
                 packed: bool | None = None) -> None:
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
        #: a remote store's written packs (read whatever it writes), ``None`` for a local folder
        self.written = None if isinstance(self.origin, LocalStorage) else WrittenPacks(
            self.origin, storage if isinstance(storage, CachedStorage) else None, self.relpath)
        #: whether :meth:`batch` writes packs
        self.packed = self.written is not None and (default_packed() if packed is None else packed)

    @classmethod
    def open(cls, root: str | Path, *, remote: Mapping[str, Any] | StorageConfig | Storage | None = None,
             cache_bytes: int | None = DEFAULT_CACHE_BYTES, packed: bool | None = None) -> FeatureStore:
        """The experiment's store: the folder ``root``, or with ``remote`` the store in that storage (e.g.
        ``{name: s3, endpoint: ..., bucket: ..., prefix: ...}``; credentials from the environment or a file, see
        :mod:`labswarm.storage.s3`) read through a cache of at most ``cache_bytes`` bytes in ``root``
        (``None`` or 0: no cache, every read a request); ``packed``: see the class.

        Raises:
            ConfigError: ``remote`` names an unknown storage or has invalid parameters.
            StoreError: the store cannot be opened (another layout, unreachable).
        """
        if remote is None:
            return cls(root)
        storage = remote if isinstance(remote, Storage) else Storage.from_spec(remote)
        if cache_bytes:
            storage = CachedStorage(storage, Path(root), cache_bytes)
        return cls(storage=storage, packed=packed)

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
    def readers(self) -> list[PackReader]:
        """The readers of packs through the cache: the read-side packs', the written packs'."""
        return [r for r in (self.packs, None if self.written is None else self.written.reader) if r is not None]

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

    def contains(self, key: str, *, fresh_s: float = REFRESH_S) -> bool:
        """Whether ``key`` is stored: alone, or in a written pack as of a listing of them at most ``fresh_s`` old
        (default :data:`~labswarm.store.written.REFRESH_S`, 60 s: a key missing from it lists them again at most
        that often, not at every miss; a caller to whom a key written since must not read as missing asks fresher).
        """
        rel = self.relpath(key)
        written = self.written
        if written is not None and self._call(lambda: written.find(key, fresh_s=REFRESH_S)) is not None:
            return True
        return self._call(lambda: self.storage.exists(rel)) or (
            written is not None and fresh_s < REFRESH_S
            and self._call(lambda: written.find(key, fresh_s=fresh_s)) is not None)

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
        for packed in (self._packed(key, mmap, fresh_s) for fresh_s in (None, 60.0)):
            if packed is not None:
                return packed
        path = self._call(lambda: self.storage.local_path(rel))
        try:
            if path is not None:
                try:
                    return map_file(path) if mmap else np.load(path, allow_pickle=False)
                except FileNotFoundError:
                    pass  # missing, or evicted from a cache since: asked of the storage below
            return np.load(io.BytesIO(self.storage.get_bytes(rel)), allow_pickle=False)
        except MissingObject:  # an error's path, not a poll: the packs listed again if the listing is over 1 s old
            if (packed := self._packed(key, mmap, 1.0)) is not None:  # written by another process since the listing
                return packed
            raise StoreError(f"no entry {key} in feature store {self.where}") from None
        except StorageError as exc:
            raise StoreError(f"cannot read entry {key} of feature store {self.where}: {exc}") from exc
        except (OSError, ValueError, EOFError) as exc:
            raise StoreError(f"corrupt entry {key} in feature store {self.where}: {exc}") from exc

    def _packed(self, key: str, mmap: bool, fresh_s: float | None) -> np.ndarray | None:
        """``key``'s array from a read-side pack (``fresh_s`` ``None``) or a written pack (listed again when it is in
        none and the listing is older than ``fresh_s``); ``None`` when in none.

        Raises:
            StoreError: it is damaged in its pack, or the packs cannot be read.
        """
        try:
            if fresh_s is None:
                return None if self.packs is None else read_packed(self.packs, key, mmap)
            return None if self.written is None else self.written.get(key, mmap=mmap, fresh_s=fresh_s)
        except StorageError as exc:
            raise StoreError(f"cannot read entry {key} of feature store {self.where}: {exc}") from exc
        except ValueError as exc:
            raise StoreError(f"corrupt entry {key} in feature store {self.where} (in its pack): {exc}") from exc

    def cached(self, key: str) -> bool:
        """Whether ``key``'s array is in the local cache of a remote store, alone or in its pack (``False``
        without a cache)."""
        storage = self.storage
        return isinstance(storage, CachedStorage) and (storage.cached_path(self.relpath(key)).is_file() or any(
            r.cached(key) for r in self.readers))

    def fetch(self, keys: Iterable[str], threads: int = FETCH_THREADS) -> int:
        """Bring the entries ``keys`` into the local cache of a remote store, up to ``threads`` requests at once
        (a cold read waits on one request at a time; a learner's chunk of 32 arrays costs one request's latency
        per ``threads`` arrays instead). Nothing to do without a cache, or for entries cached already. Errors are
        left to the reads that follow (a missing entry is reported by :meth:`get`).

        Memory: it holds at most :meth:`read_bytes` ``(threads, ...)`` bytes at once (packs are held whole until
        written into the cache); :meth:`fetch_threads` fits ``threads`` to a memory bound (:meth:`read_reserve`).

        Returns:
            The number of entries requested.
        """
        storage = self.storage
        if not isinstance(storage, CachedStorage):
            return 0
        packs: dict[str, tuple[PackReader, str]] = {}  # pack -> its reader, the first of its keys: one request
        missing = []
        readers = self.readers
        for key in keys:
            if storage.cached_path(rel := self.relpath(key)).is_file():
                continue  # cached alone
            if (found := next(((r, n) for r in readers if (n := r.pack_of(key)) is not None), None)) is not None:
                if not found[0].cached(key):
                    packs.setdefault(f"{found[0].folder}/{found[1]}", (found[0], key))
            else:
                missing.append(rel)
        if len(missing) + len(packs) < 2:  # one read costs what one fetch does
            return 0

        def one(rel: str) -> None:
            with contextlib.suppress(StorageError):
                storage.warm(rel)

        def pack(found: tuple[PackReader, str]) -> None:
            found[0].locate(found[1])

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
        return sum(r.held_bytes(threads) for r in self.readers) + max(1, threads) * array_bytes

    def read_reserve(self, threads: int = 1, array_bytes: int = 0) -> int:
        """What the store's reads with ``threads`` :meth:`fetch` threads take of a memory limit: what they hold
        (:meth:`read_bytes`) plus, under an ``RLIMIT_AS`` (a limit on address space, resident or not) and through a
        remote store's cache (the only reads :meth:`fetch` starts threads for), the address space the threads
        reserve: their stacks and malloc arenas (:func:`labswarm.threads.thread_address_space`; 8 MiB and up to
        64 MiB each). A memory cgroup counts resident memory only: no more there."""
        held = self.read_bytes(threads, array_bytes)
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY or not isinstance(self.storage, CachedStorage):
            return held
        return held + thread_address_space(threads)

    def fetch_threads(self, max_bytes: int, array_bytes: int = 0, threads: int = FETCH_THREADS) -> int:
        """The most threads, up to ``threads``, whose :meth:`read_reserve` fits ``max_bytes`` (a memory limit's
        room for the store's reads: under ``RLIMIT_AS`` never more threads than its address space leaves room for,
        "can't start new thread" mid-epoch); at least 1 (whether even one fits is the caller's check)."""
        return max([1, *(n for n in range(1, threads + 1) if self.read_reserve(n, array_bytes) <= max_bytes)])

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
        if not isinstance(self.storage, LocalStorage):  # a remote store's packs: labswarm.store.written
            if getattr(self._batch, "uploads", None) is not None:
                yield
                return
            if self._uploader is None or self._uploader[0] != os.getpid():  # a forked child has none of the threads
                self._uploader = (os.getpid(), ThreadPoolExecutor(UPLOAD_THREADS, thread_name_prefix="store-upload"))
            uploads = self._batch.uploads = Uploads(self._uploader[1])
            packs = self._batch.packs = PackBatch(self.written, uploads) if self.written and self.packed else None
            try:
                yield
            except BaseException:  # no upload outlives its batch; the block's own error is the one raised
                self._batch.uploads = self._batch.packs = None
                with contextlib.suppress(StoreError):
                    uploads.flush()
                raise
            self._batch.uploads = self._batch.packs = None
            if packs is not None:
                packs.send()
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
        if (packs := getattr(self._batch, "packs", None)) is not None:  # a remote store that writes packs
            packs.add(key, data, None if stored is None else lambda: stored(key))
            return
        if self.packed:  # outside a batch: a pack of this array alone
            with self.batch():
                return self.put(key, array, stored=stored)
        uploads: Uploads | None = getattr(self._batch, "uploads", None)
        if uploads is not None:
            uploads.submit(key, len(data), lambda: self.storage.put_bytes(rel, data),
                           None if stored is None else lambda: stored(key))
            return
        self._call(lambda: self.storage.put_bytes(rel, data))
        if stored is not None:
            stored(key)
