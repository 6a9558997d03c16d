"""Written packs: a remote feature store's arrays of one message written as one object, instead of one object per
array.

Into an object store each array is a request, and the server's cost per request, not per byte, bounds feature
computation: moto on this machine spends ~2.9 ms of CPU per request plus ~3.4 ms per MB (docs/benchmarks/store.md,
seventh session), so a sample's two arrays (mel 220 kB, MFCC 34 kB) as two PUTs cost 6.7-7.5 ms of the server's CPU,
more than the ~5 ms a sample that 0.9x the local store's rate leaves. Inside a :meth:`FeatureStore.batch
<labswarm.store.store.FeatureStore.batch>` of a store that writes packs, the arrays :meth:`put
<labswarm.store.store.FeatureStore.put>` gathers are written at the batch's end as **one pack and its index** (two
requests a message, whatever its samples: auto-packing puts ~4 samples, ~1 MB, in a message), in the format of the
read-side packs (:mod:`labswarm.store.packfmt`), in their own folder::

    written/v1/<name>.pack    MAGIC, the header's length, the header, the arrays' .npy bytes back to back
    written/v1/<name>.json    the header again: the index readers list

Unlike the read-side packs (``packs/v1``: copies of per-key objects), a written pack is the store's only copy of its
arrays. The invariants of the per-key layout hold:

- **content addressing**: the keys are the same; ``name`` is the SHA-256 of the header (less the write's nonce,
  which makes each write's objects, and their ETags, differ), so the same arrays in the same pack get the same
  name (a message of one sample redelivered after its worker died writes the same pack again; one of several is
  redelivered split into messages of one sample, whose packs get other names).
- **no partial array, no index of a missing pack**: the pack is PUT before its index and readers find packs only
  through their index (S3 makes each object appear whole); a worker killed between the two, or an index whose PUT
  failed for good, leaves a pack no index names, invisible to readers: an **orphan**, which ``gc`` removes once it
  is an hour old (an index with no pack too) and ``du`` and ``verify`` report (:mod:`labswarm.store.orphans`).
- **no result lost**: the batch's end waits for the index's PUT (tried again as any upload,
  :mod:`labswarm.store.uploads`; a batch's packs gathered by :mod:`labswarm.store.pack_batch`), and the worker
  reports and acknowledges the message only after it.
- **listing and reads**: :class:`WrittenPacks` learns the packed keys from the indexes (one listing of
  ``written/v1`` and one GET of each index not seen before, kept per process), and the store's ``contains``,
  ``sizes``, shard listings, ``get`` and ``fetch`` answer for packed keys as for per-key objects; through a cache a
  pack is fetched whole on the first read of one of its arrays (:class:`~labswarm.store.packs.PackReader`, whatever
  the cache's bound: the arrays are nowhere else), without one (or while the cache refuses its pack) the array's
  bytes alone are read from the pack (a ranged GET: the index gives where) and checked (CRC-32C).
- **removal** (``delete``, ``gc``): a pack whose arrays all go is removed (its index first); a pack holding arrays
  that go and arrays kept is **rewritten**: a new pack of the kept arrays and its index are written first, then the
  old index and pack removed, so a kept array is readable at every moment (a reader holding the old index lists
  the packs again when the old pack is found gone).

The local store's layout is unchanged (one file per key: its writes cost no request). A remote store writes packs
by default (``LABSWARM_STORE_WRITE_PACKS=0``: per-key objects); both layouts are read whatever a store writes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from labswarm.errors import StorageError
from labswarm.storage.base import MissingObject, Storage
from labswarm.storage.cache import CachedStorage
from labswarm.store.npy import read_at
from labswarm.store.packfmt import MAGIC, Entry, array_by_own_header, array_problem, encode, parse_header, unpack
from labswarm.store.packs import EMPTY, Catalogue, PackReader, list_packs, load_catalogue

log = logging.getLogger(__name__)

#: Folder of the written packs in the store.
WRITTEN = "written/v1"
#: Environment variable that chooses a remote store's write layout: ``1`` (default) packs, ``0`` per-key objects.
ENV = "LABSWARM_STORE_WRITE_PACKS"
#: Seconds after a listing of the written packs before a key found in none of them makes a reader list them again
#: (a key written since by another process); :meth:`WrittenPacks.find` callers may ask for fresher.
REFRESH_S = 60.0


def default_packed() -> bool:
    """Whether a remote store writes packs when its opener does not say: :data:`ENV` (``0``, ``false``, ``no``,
    ``off``: per-key objects), default ``True`` (measured faster, docs/benchmarks/store.md)."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


@dataclass(frozen=True, slots=True)
class Located:
    """Where one packed array is: pack ``name``, the offset of the pack's data (``start``: after its magic and
    header) and the array's ``offset`` from there, ``length`` and ``crc`` (CRC-32C, its index's record)."""

    name: str
    start: int
    offset: int
    length: int
    crc: int


class WrittenPacks:
    """The written packs of a remote store (module docstring): their catalogue, reads, writes and removal.

    Args:
        origin: the storage that holds them (:attr:`FeatureStore.origin`).
        cache: the store's cache, if any (packs are then fetched whole into it).
        relpath: a key's per-key path (:meth:`FeatureStore.relpath`).

    Safe across threads and ``fork`` (a child gets a new lock: a parent's thread may have held it while listing;
    the cache's reader resets itself).
    """

    def __init__(self, origin: Storage, cache: CachedStorage | None, relpath: Callable[[str], str]) -> None:
        self.origin = origin
        self._known: dict[str, list[Entry]] = {}
        self._catalogue = EMPTY
        self._loaded = -float("inf")
        self._own: dict[str, tuple[Located, float]] = {}  # keys this process wrote: where, and when (monotonic)
        self._guard = threading.Lock()  # one listing at a time
        self._own_lock = threading.Lock()  # _own changed in place under it, never rebound (upload threads add to it)
        os.register_at_fork(after_in_child=partial(_after_fork, weakref.ref(self)))  # not kept alive by it
        #: reads packs through the cache, fetched whole (``None`` without a cache)
        self.reader = None if cache is None else _CachedReader(self, cache, relpath)

    def catalogue(self, key: str | None = None, *, reload: bool = False, fresh_s: float = REFRESH_S) -> Catalogue:
        """The written packs: listed at the first call, with ``reload``, and when ``key`` is in none of them and the
        last listing is older than ``fresh_s`` (threads asking at once share one listing).

        Raises:
            StorageError: the storage cannot be listed.
        """
        if not reload and self._loaded > -float("inf") and (
                key is None or key in self._catalogue or time.monotonic() - self._loaded < fresh_s):
            return self._catalogue
        asked = time.monotonic()
        with self._guard:
            if self._loaded >= asked:  # listed by another thread since this one asked: as fresh as needed
                return self._catalogue
            began = time.monotonic()
            catalogue = load_catalogue(self.origin, self._known, folder=WRITTEN)
            self._known = {n: self._known[n] for n in catalogue.names}  # removed packs forgotten
            self._catalogue, self._loaded = catalogue, began
            # keys written while it was listed may not be in it: kept
            self._forget_own(lambda _key, when: when < began)
            return catalogue

    def find(self, key: str, *, fresh_s: float = REFRESH_S) -> Located | None:
        """Where ``key``'s array is, ``None`` when it is in no written pack (listed again as :meth:`catalogue` says).

        Raises:
            StorageError: the storage cannot be listed.
        """
        if (own := self._own.get(key)) is not None:
            return own[0]
        catalogue = self.catalogue(key, fresh_s=fresh_s)
        row = catalogue.find(key)
        if row is None:
            own = self._own.get(key)
            return None if own is None else own[0]
        pack = int(catalogue.packs[row])
        return Located(catalogue.names[pack], catalogue.starts[pack], int(catalogue.offsets[row]),
                       int(catalogue.lengths[row]), int(catalogue.crcs[row]))

    def sizes(self) -> dict[str, int]:
        """Every packed key's ``.npy`` bytes, key → bytes (the packs listed now).

        Raises:
            StorageError: the storage cannot be listed.
        """
        catalogue = self.catalogue(reload=True)
        sizes = {bytes(k).ljust(20, b"\0").hex(): int(n) for k, n in zip(catalogue.keys, catalogue.lengths,
                                                                           strict=True)}
        sizes.update((k, v[0].length) for k, v in list(self._own.items()))
        return sizes

    def shard(self, shard: str, fresh_s: float = 0.0) -> list[str]:
        """The packed keys that start with ``shard`` (two hex digits), from a listing at most ``fresh_s`` old.

        Raises:
            StorageError: the storage cannot be listed.
        """
        catalogue = self.catalogue(reload=time.monotonic() - self._loaded >= fresh_s)
        first = int(shard, 16)
        lo = int(np.searchsorted(catalogue.keys, bytes([first])))
        hi = len(catalogue.keys) if first == 255 else int(np.searchsorted(catalogue.keys, bytes([first + 1])))
        keys = [bytes(k).ljust(20, b"\0").hex() for k in catalogue.keys[lo:hi]]
        return keys + [k for k in list(self._own) if k.startswith(shard)]

    def names(self) -> list[str]:
        """The written packs listed now (those whose index is written)."""
        return sorted(list_packs(self.origin, WRITTEN))

    def get(self, key: str, *, mmap: bool = False, fresh_s: float = REFRESH_S) -> np.ndarray | None:
        """``key``'s array from its written pack (:func:`read_packed` through the cache, or its own file there if it
        has one while its pack is not cached, else its bytes alone read from the pack with a ranged GET,
        :meth:`Storage.get_range <labswarm.storage.base.Storage.get_range>`, and checked against its index's
        CRC-32C; bytes that fail the check make one GET of the whole pack, the array then found by the pack's own
        header: :func:`~labswarm.store.packfmt.array_by_own_header`), ``None`` when it is in none (the packs listed
        again as :meth:`find` says, and once more when its pack was found removed since: rewritten by ``gc``).

        Raises:
            StorageError: the packs cannot be listed or the pack read.
            ValueError: the array is damaged in its pack (CRC-32C, cut off, not an ``.npy``), or the pack is.
        """
        for attempt in range(2):
            found = self.find(key, fresh_s=fresh_s if attempt == 0 else REFRESH_S)
            if found is None:
                return None
            if self.reader is not None and ((array := read_packed(self.reader, key, mmap)) is not None
                                            or (array := self.reader.read_alone(key, mmap)) is not None):
                return array
            pack = f"{WRITTEN}/{found.name}.pack"
            try:  # the array's bytes alone: one ranged GET, not the whole pack (up to PACK_MAX) for one array
                data = self.origin.get_range(pack, found.start + found.offset, found.length)
                if array_problem(data, found.length, found.crc) is not None:  # the pack whole, by its own header
                    data = array_by_own_header(self.origin.get_bytes(pack), key)
            except MissingObject:  # rewritten or removed by gc since: listed again (this process's writes too)
                self.catalogue(reload=True)
                continue
            except ValueError as exc:
                raise ValueError(f"in pack {found.name}: {exc}") from None
            return read_at(data, 0, len(data), mmap=mmap)
        return None

    def added(self, name: str, header: bytes) -> None:
        """Pack ``name`` with ``header`` was just written by this process (its keys found before the next listing)."""
        start, now = len(MAGIC) + 4 + len(header), time.monotonic()
        entries = parse_header(header)
        with self._own_lock:
            for e in entries:
                self._own[e.key] = Located(name, start, e.offset, e.length, e.crc), now

    def _forget_own(self, stale: Callable[[str, float], bool]) -> None:
        """Drop the keys this process wrote for which ``stale(key, when written)`` holds, in place (an upload thread
        adding one meanwhile keeps it)."""
        with self._own_lock:
            for key in [k for k, (_where, when) in self._own.items() if stale(k, when)]:
                del self._own[key]

    def write(self, items: list[tuple[str, bytes]]) -> None:
        """Write ``items`` (``(key, .npy bytes)``) as one pack, then its index (this thread; not tried again).

        Raises:
            StorageError: a PUT failed (the index is then not written).
        """
        name, header, blob = encode(items, uuid.uuid4().hex)  # each write's objects differ: labswarm.store.orphans
        self.origin.put_bytes(f"{WRITTEN}/{name}.pack", blob)  # the pack before its index: never seen partial
        self.origin.put_bytes(f"{WRITTEN}/{name}.json", header)
        self.added(name, header)

    def remove(self, keys: Collection[str], *, dry_run: bool = False) -> Removed:
        """Remove ``keys`` from the written packs: a pack holding only keys of them removed (index first), one holding
        others too rewritten (its kept arrays in a new pack and index, written before the old ones are removed);
        a pack whose kept arrays are damaged is left as it is (with a warning: rewriting would lose them).

        Args:
            keys: the keys to remove.
            dry_run: change nothing; say what would be done (a pack to rewrite counted without reading it).

        Returns:
            What was removed (:class:`Removed`).

        Raises:
            StorageError: the storage failed (the packs handled before are done; nothing kept is lost).
        """
        doomed = set(keys)
        catalogue = self.catalogue(reload=True)
        removed = rewritten = 0
        gone: set[str] = set()
        for name in catalogue.names:
            entries = self._known.get(name, [])
            if not any(e.key in doomed for e in entries):
                continue
            kept = [e for e in entries if e.key not in doomed]
            if kept and not dry_run:
                _entries, good, bad = unpack(self.origin.get_bytes(f"{WRITTEN}/{name}.pack"))
                if any(e.key not in good for e in kept):
                    log.warning("leaving written pack %s as it is: a kept array is damaged (%s)", name,
                                next(iter(bad.values()), "missing from the pack"))
                    continue
                self.write([(e.key, bytes(good[e.key])) for e in kept])
            rewritten += bool(kept)
            removed += not kept
            gone.update(e.key for e in entries if e.key in doomed)
            if not dry_run:
                self.origin.delete(f"{WRITTEN}/{name}.json")  # readers find packs through it: first
                self.origin.delete(f"{WRITTEN}/{name}.pack")
        if not dry_run:
            self._forget_own(lambda key, _when: key in doomed)
            self.catalogue(reload=True)
        return Removed(removed, rewritten, frozenset(gone))


@dataclass(frozen=True, slots=True)
class Removed:
    """What :meth:`WrittenPacks.remove` did (or would do): ``packs`` removed, ``rewritten``, ``keys`` now in none."""

    packs: int
    rewritten: int
    keys: frozenset[str]


class _CachedReader(PackReader):
    """A :class:`~labswarm.store.packs.PackReader` of the written packs through the cache, whatever its bound, on the
    catalogue of its :class:`WrittenPacks` (one listing for both)."""

    def __init__(self, written: WrittenPacks, cache: CachedStorage, relpath: Callable[[str], str]) -> None:
        super().__init__(written.origin, cache, relpath, folder=WRITTEN, bounded=False)
        self._written = written

    def read_alone(self, key: str, mmap: bool) -> np.ndarray | None:
        """``key``'s array from a file of its own in the cache (cached before its pack was written, by a store whose
        processes write both layouts: no request then); ``None`` when there is none, or it does not read whole."""
        path = self.cache.cached_path(self.relpath(key))
        if not self.cache._touch(path):
            return None
        try:
            return read_at(path, 0, path.stat().st_size, mmap=mmap)
        except (OSError, ValueError):  # evicted meanwhile, or cut off: read from the pack
            return None

    def catalogue(self, key: str | None = None, *, reload: bool = False) -> Catalogue:
        try:
            return self._written.catalogue(key, reload=reload)
        except StorageError as exc:
            log.warning("reading written packs without the cache: cannot list them: %s", exc)
            return EMPTY


def read_packed(reader: PackReader, key: str, mmap: bool) -> np.ndarray | None:
    """``key``'s array read through ``reader`` from its pack in the cache (fetched whole at a miss); ``None`` when
    the reader has it in no usable pack (then it is read otherwise). A pack file evicted by another process meanwhile
    is fetched again. The region its index gives failing to parse, the array is found by the pack's own header
    (:func:`~labswarm.store.packfmt.array_by_own_header`: a pack and index written by two versions differ in
    length), and when it is not there sound the cached pack is removed (cut off: a crash before its bytes reached
    the disk).

    Raises:
        ValueError: the array's bytes, fetched and checked (CRC-32C) but not yet in the cache, do not parse.
    """
    for _ in range(2):
        if (found := reader.locate(key)) is None:
            return None
        try:
            return read_at(*found, mmap=mmap)
        except FileNotFoundError:  # its pack evicted since this process last used it: fetched again
            reader.forget(found[0])
        except (OSError, ValueError) as exc:
            with contextlib.suppress(OSError, ValueError):  # the whole pack (a local file, or bytes held)
                blob = found[0] if isinstance(found[0], bytes) else found[0].read_bytes()
                return read_at(array_by_own_header(blob, key), 0, found[2], mmap=False)
            if not isinstance(found[0], Path):
                raise ValueError(f"in its pack: {exc}") from exc
            reader.discard(found[0], exc)  # its cached file cut off: this array read otherwise
            return None
    return None


def _after_fork(written: weakref.ref[WrittenPacks]) -> None:
    """A forked child's new locks of ``written`` (if it still exists): no thread of the parent is here to release it."""
    if (found := written()) is not None:
        found._guard, found._own_lock = threading.Lock(), threading.Lock()

