"""Packs: many arrays of a remote feature store in one object, so that a cold cache is filled with one request per
pack instead of one per array.

From an object store each array is a request, and a request costs more than reading the array it brings (moto on
this machine: ~6 ms of CPU per GET of a 220 kB array against 0.85 ms for a local read, docs/benchmarks/store.md):
reading one object per array, a cold cache cannot come near the local store whatever the parallelism. As
WebDataset's tar shards and TFRecord files do for a training set, a pack holds many arrays back to back with an
index of their offsets; a cold read of one of them fetches the whole pack into the local cache, as one cached
object (:class:`PackReader`: bounded and evicted as any other, least recently used first), so the reads that
follow in that pack read their region of a local file (:func:`labswarm.store.npy.read_at`). Writing each array
into a file of its own instead cost ~0.3 ms a file here (a cold pass at 0.1x the local store's reads).

Layout, beside the per-key objects (``v1/...``, see :mod:`labswarm.store.store`)::

    packs/v1/<name>.pack    MAGIC, the header's length (4 bytes, little-endian), the header, the arrays' bytes
    packs/v1/<name>.json    the header again: the catalogue a reader lists without fetching the arrays

The header is ``{"layout": 1, "checksum": "crc32c", "entries": [[key, offset, length, crc], ...]}``: each
array's ``.npy`` bytes, exactly those of its per-key object, at ``offset`` from the end of the header, with their
CRC-32C (Castagnoli, as TFRecord checks its records; computed in hardware by google-crc32c: 0.04 ms per 220 kB
array here against 0.5 ms for zlib's CRC-32, 2026-11-26, load 25; it guards against damage, not tampering).
``name`` is the SHA-256 of the header (its first 40 hex digits): packing the same arrays again writes the same
objects. The pack is written before its ``.json``, and readers find packs only through their ``.json``: a reader
never sees a partial pack, and a pack with an array whose CRC-32C or size does not match is never cached (its
arrays are read from their per-key objects instead).

The per-key objects stay the store's truth (workers write and check them, ``gc`` and ``trim`` work per key, two
experiments share an array): a pack is a copy made for reading, by ``labswarm store pack EXPERIMENT`` once the
experiment's features are computed (:mod:`labswarm.store.packer`), and the packed arrays take their bytes twice
in the bucket. ``gc`` removes a pack once one of its arrays is removed; ``verify`` and ``du`` count packs too
(:mod:`labswarm.store.ops`).

A pack is fetched whole only when every pack of the store fits in the cache's bound: the learners read samples in
a random order, and with a cache smaller than the packed data each miss would bring a whole pack to use one of its
arrays before they are evicted. Then, and for keys in no pack, a miss is one GET of the array.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from labswarm.errors import StorageError
from labswarm.storage.base import MissingObject, Storage
from labswarm.storage.cache import CachedStorage
from labswarm.store.packfmt import MAGIC, Entry, parse_header, unpack

log = logging.getLogger(__name__)

#: Folder of the packs in the store (the layout's version as the per-key entries').
PACKS = "packs/v1"
#: Default most bytes of arrays in one pack (32 MiB: ~150 mel arrays of the demo set's 220 kB). WebDataset
#: advises shards of 100 MB or more for sequential reads; ours are read at random, each fetched whole on a miss.
PACK_BYTES = 32 * 2**20
#: Seconds before a reader lists the packs again when asked for a key in none of them (packs made meanwhile).
REFRESH_S = 60.0
#: Fetched packs held in memory at most while they are written into the cache (32 MiB each by default).
PENDING = 2
#: Requests at once when listing or making packs.
THREADS = 8
#: Bytes a thread's pack read holds beside the pack itself (the client's buffers, the header's parse): 20-90 kB
#: measured with tracemalloc (boto3 against moto, 1-4 threads, 2026-11-26), rounded up.
REQUEST_BYTES = 2**17


@dataclass(frozen=True, slots=True)
class Catalogue:
    """The packs of a store: ``names``, the offset of each one's data (``starts``: after its magic and header), their
    total ``bytes``, and per packed key (``keys``: sorted 20-byte keys) its pack (``packs``, an index into
    ``names``), ``offsets``, ``lengths`` and ``crcs`` (each array's CRC-32C, for a ranged read's check): 44 bytes a
    key, 40 MB for the documents' 900,000 arrays; ``largest``: the bytes of the largest pack object."""

    names: list[str]
    starts: list[int]
    bytes: int
    keys: np.ndarray
    packs: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    crcs: np.ndarray
    largest: int = 0

    def find(self, key: str) -> int | None:
        """The row of ``key`` (an index into :attr:`keys`), ``None`` when it is in no pack."""
        if len(key) != 40 or not len(self.keys):
            return None
        raw = np.bytes_(bytes.fromhex(key))
        i = int(np.searchsorted(self.keys, raw))
        return i if i < len(self.keys) and self.keys[i] == raw.rstrip(b"\0") else None  # S20 drops trailing NULs

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.find(key) is not None


#: A catalogue of no pack.
EMPTY = Catalogue([], [], 0, np.array([], dtype="S20"), np.array([], dtype=np.int32), np.array([], dtype=np.int64),
                  np.array([], dtype=np.int64), np.array([], dtype=np.uint32))


def list_packs(origin: Storage, folder: str = PACKS) -> dict[str, tuple[int, int]]:
    """The store's packs (in ``folder``: :data:`PACKS`, or a remote store's written packs,
    :data:`labswarm.store.written.WRITTEN`) whose index is written, name → (bytes of the pack object, bytes of its
    index).

    Raises:
        StorageError: the storage cannot be listed.
    """
    sizes = origin.sizes(folder)
    return {name: (size, sizes[index]) for rel, size in sizes.items() if rel.endswith(".pack")
            and (index := f"{folder}/{(name := rel[len(folder) + 1:-5])}.json") in sizes}


def read_index(origin: Storage, name: str, folder: str = PACKS) -> list[Entry]:
    """The entries of pack ``name`` (in ``folder``) from its ``.json``.

    Raises:
        StorageError: it cannot be read (MissingObject: removed).
        ValueError: it is not a pack header.
    """
    return parse_header(origin.get_bytes(f"{folder}/{name}.json"))


def load_catalogue(origin: Storage, known: dict[str, list[Entry]] | None = None,
                   threads: int = THREADS, folder: str = PACKS) -> Catalogue:
    """The store's packs in ``folder`` (one listing, then the ``.json`` of each pack not in ``known``, name → its
    entries, which is updated). A pack whose index cannot be read or parsed is left out, with a warning.

    Raises:
        StorageError: the storage cannot be listed.
    """
    known = {} if known is None else known
    sizes = list_packs(origin, folder)

    def one(name: str) -> tuple[str, list[Entry] | None]:
        try:
            return name, read_index(origin, name, folder)
        except (StorageError, ValueError) as exc:
            log.warning("leaving pack %s aside: %s", name, exc)
            return name, None

    with ThreadPoolExecutor(max(1, threads)) as pool:
        for name, entries in pool.map(one, [n for n in sizes if n not in known]):
            if entries is not None:
                known[name] = entries
    names = sorted(n for n in sizes if n in known)
    rows = [(bytes.fromhex(e.key), i, e.offset, e.length, e.crc) for i, n in enumerate(names) for e in known[n]]
    raw = np.array([r[0] for r in rows], dtype="S20")
    order = np.argsort(raw, kind="stable")
    return Catalogue(names, [len(MAGIC) + 4 + sizes[n][1] for n in names], sum(sizes[n][0] for n in names),
                     raw[order], np.array([r[1] for r in rows], dtype=np.int32)[order],
                     np.array([r[2] for r in rows], dtype=np.int64)[order],
                     np.array([r[3] for r in rows], dtype=np.int64)[order],
                     np.array([r[4] for r in rows], dtype=np.uint32)[order],
                     max((sizes[n][0] for n in names), default=0))


class PackReader:
    """Reads the packed arrays of a remote store through its cache (module docstring): a pack is one object of the
    cache, fetched whole at the first read of one of its arrays (and checked: a damaged pack is not cached, its
    arrays are read one by one), then each array read from its region of the cached file. The fetched pack is
    written into the cache by a thread of its own, its arrays read from memory meanwhile (the write waits on the
    disk: 22 MB took 0.04-0.2 s here, 2026-11-26, load 4-14), at most :data:`PENDING` packs held so. Safe across
    threads: those that miss one pack at once wait for one fetch of it.

    Args:
        origin: the storage that holds the packs (:attr:`FeatureStore.origin`); cache: the store's cache of it;
        relpath: a key's array alone in the cache (:meth:`FeatureStore.relpath`); folder: where the packs are
        (:data:`PACKS`; a remote store's written packs: :mod:`labswarm.store.written`); bounded: packs are read only
        while all of them fit in the cache's bound (``False`` for written packs: their arrays are nowhere else).
    """

    def __init__(self, origin: Storage, cache: CachedStorage, relpath: Callable[[str], str], *,
                 folder: str = PACKS, bounded: bool = True) -> None:
        self.origin, self.cache, self.relpath, self.folder, self.bounded = origin, cache, relpath, folder, bounded
        self._catalogue: Catalogue | None = None
        self._loaded = -float("inf")
        self._known: dict[str, list[Entry]] = {}
        self._damaged: set[str] = set()
        self._skipped: dict[str, float] = {}  # pack -> until when its arrays are read alone (time.monotonic)
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._pending: dict[str, tuple[bytes, Future[None]]] = {}  # packs fetched, being written into the cache
        self._writer: ThreadPoolExecutor | None = None
        os.register_at_fork(after_in_child=partial(_after_fork, weakref.ref(self)))  # not kept alive by it
        #: packs fetched by this reader (for the tests and the benchmark)
        self.fetched = 0

    def catalogue(self, key: str | None = None, *, reload: bool = False) -> Catalogue:
        """The packs, listed at the first call, with ``reload``, and again when ``key`` is in none of them
        :data:`REFRESH_S` after the last listing (a failed listing counts as an empty one until then)."""
        catalogue = self._catalogue
        if not reload and catalogue is not None and (
                key is None or time.monotonic() - self._loaded < REFRESH_S or key in catalogue):
            return catalogue
        with self._guard:
            try:
                self._catalogue = load_catalogue(self.origin, self._known, folder=self.folder)
                self._known = {n: self._known[n] for n in self._catalogue.names}  # removed packs forgotten
            except StorageError as exc:
                log.warning("reading every array alone: cannot list the packs: %s", exc)
                self._catalogue = EMPTY
            self._loaded = time.monotonic()
            return self._catalogue

    def _over(self, catalogue: Catalogue) -> bool:
        """Whether the packs are not read, being more in all than the cache's bound (only when :attr:`bounded`)."""
        return self.bounded and catalogue.bytes > self.cache.max_bytes

    def _usable(self, name: str) -> bool:
        """Whether pack ``name`` may be fetched: not damaged, and no fetch or caching of it failed in the last
        :data:`REFRESH_S` (then its arrays are read alone: each would fetch it again, up to 32 MiB an array)."""
        return name not in self._damaged and self._skipped.get(name, -float("inf")) <= time.monotonic()

    def _forked(self) -> None:
        """In a forked child (``os.register_at_fork``): none of the parent's threads is here to release a lock it
        held at the fork (the writer's, a fetching thread's) or to finish writing a pending pack, so the locks,
        the pending packs (read again from the cache or fetched) and the writer are new."""
        self._guard, self._locks, self._pending, self._writer = threading.Lock(), {}, {}, None

    def _lock(self, name: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(name, threading.Lock())

    def locate(self, key: str) -> tuple[Path | bytes, int, int] | None:
        """Where ``key``'s ``.npy`` bytes are: ``(source, offset, length)``, the source the pack's file in this
        machine's cache or, while it is being written there, its bytes; the pack fetched first if needed.
        ``None`` when the key is in no pack, the packs do not fit in the cache's bound (then each miss would bring
        a whole pack for one array), its pack is damaged, or could not be fetched or cached in the last
        :data:`REFRESH_S` (then the array is read alone; a pack removed since is listed no more), or its
        pack is not cached but the array alone is (a cache filled before the packs were made)."""
        catalogue = self.catalogue(key)
        row = catalogue.find(key)
        if row is None or self._over(catalogue):
            return None
        pack = int(catalogue.packs[row])
        name = catalogue.names[pack]
        if not self._usable(name):
            return None
        where = catalogue.starts[pack] + int(catalogue.offsets[row]), int(catalogue.lengths[row])
        pending = self._pending.get(name)
        if pending is not None:
            return pending[0], *where
        rel = f"{self.folder}/{name}.pack"
        path = self.cache.cached_path(rel)
        if self.cache._touch(path, remembered=True):
            return path, *where
        if self.cache.cached_path(self.relpath(key)).is_file():
            return None
        source = self._fill(name, rel)
        return None if source is None else (source, *where)

    def forget(self, source: Path | bytes) -> None:
        """Take a pack file found missing (evicted by another process) as not cached, so the next read fetches it."""
        self.cache._touched.pop(str(source), None)

    def discard(self, source: Path, problem: Exception) -> None:
        """Remove a cached pack file found damaged (``problem``: cut off, written without a sync before a host
        crash), so that the next read of its arrays fetches it again."""
        log.warning("removing cached pack %s, damaged: %s", source, problem)
        try:
            self.cache.discard(f"{self.folder}/{source.stem}.pack")
        except StorageError as exc:
            log.warning("cannot remove cached pack %s: %s", source, exc)

    def _fill(self, name: str, rel: str) -> Path | bytes | None:
        """Fetch pack ``name`` and have it written into the cache, unless another thread did: its file, or its
        bytes while they are written; ``None`` when it cannot be had."""
        with self._lock(name):
            path = self.cache.cached_path(rel)
            if (pending := self._pending.get(name)) is not None:
                return pending[0]
            if self.cache._touch(path):
                return path
            if not self._usable(name):  # another thread's try failed
                return None
            loaded = self._loaded
            try:
                blob = self.origin.get_bytes(rel)
                _entries, _good, bad = unpack(blob)
                if bad:
                    key, reason = next(iter(bad.items()))
                    raise ValueError(f"{len(bad)} arrays damaged, e.g. {key}: {reason}")
            except (StorageError, ValueError) as exc:
                if isinstance(exc, ValueError):
                    self._damaged.add(name)
                else:
                    self._skipped[name] = time.monotonic() + REFRESH_S
                log.warning("reading the arrays of pack %s alone: %s", name, exc)
                if isinstance(exc, MissingObject) and self._loaded == loaded:
                    self.catalogue(reload=True)  # removed by gc: its kept arrays may be in a pack made since
                return None
            self.fetched += 1
            with self._guard:
                waits = list(self._pending.values())[:max(0, len(self._pending) - PENDING + 1)]  # oldest first
                if self._writer is None:
                    self._writer = ThreadPoolExecutor(1, thread_name_prefix="store-pack-write")
                done = self._writer.submit(self._write, name, rel, blob)
                self._pending[name] = blob, done
            for _blob, wait in waits:  # memory bounded: the oldest writes finished first
                wait.result()
            return blob

    def _write(self, name: str, rel: str, blob: bytes) -> None:
        try:
            if not self.cache.insert([(rel, blob)]):
                raise StorageError("larger than the cache's bound")
        except (StorageError, OSError) as exc:  # e.g. a full disk: its arrays read alone, not the pack again each
            self._skipped[name] = time.monotonic() + REFRESH_S
            log.warning("pack %s not cached, its arrays read alone for %.0f s: %s", name, REFRESH_S, exc)
        finally:
            with self._guard:
                self._pending.pop(name, None)

    def pack_of(self, key: str) -> str | None:
        """The pack ``key`` is read from (:meth:`locate` would not answer ``None`` for want of one), if any."""
        catalogue = self.catalogue(key)
        row = catalogue.find(key)
        if row is None or self._over(catalogue):
            return None
        name = catalogue.names[int(catalogue.packs[row])]
        return name if self._usable(name) else None

    def held_bytes(self, threads: int = 1) -> int:
        """The most bytes of packs this reader holds in memory at once while ``threads`` threads read through it
        (:meth:`FeatureStore.fetch`'s, or 1: a learner's reads): each thread's pack from its GET on, up to
        :data:`PENDING` ``+ threads - 1`` fetched packs waiting for their write into the cache (each thread adds its
        pack, then waits for the older ones beyond :data:`PENDING`), and one array each thread copies to check it
        (CRC-32C), and :data:`REQUEST_BYTES` a thread: ``(2 threads + PENDING - 1)`` times the largest pack plus
        ``threads`` times the largest packed array and :data:`REQUEST_BYTES` (``tests/store/test_fetch.py``
        measures it with tracemalloc); 0 when the packs are not read (none, or more in all than the cache's bound).
        Lists the packs at the first call."""
        catalogue = self.catalogue()
        if not catalogue.names or self._over(catalogue):
            return 0
        threads = max(1, threads)
        return ((2 * threads + PENDING - 1) * catalogue.largest
                + threads * (int(catalogue.lengths.max(initial=0)) + REQUEST_BYTES))

    def cached(self, key: str) -> bool:
        """Whether ``key`` is read from a pack that is in the cache (or being written there)."""
        name = self.pack_of(key)
        return name is not None and (name in self._pending
                                     or self.cache.cached_path(f"{self.folder}/{name}.pack").is_file())

    def wait(self) -> None:
        """Wait until the packs fetched so far are written into the cache."""
        with self._guard:
            pending = [done for _blob, done in self._pending.values()]
        for done in pending:
            done.result()


def _after_fork(reader: weakref.ref[PackReader]) -> None:
    """``reader``'s reset in a forked child (:meth:`PackReader._forked`), if it still exists."""
    if (found := reader()) is not None:
        found._forked()
