"""Which keys a remote feature store holds, from listings of the shards asked about instead of a request per key.

A worker asks, for each sample, whether its keys are stored before computing them (and the run's parent asks to
count the cached ones; a streaming learner asks for each sample of its split). On a local store that is a
``stat``; on an object store (``s3``) each question is a ``HEAD`` request, ~14 ms against moto on loopback
(2026-11-26, 2-core machine under load; docs/benchmarks/store.md), as much as writing the array.
:class:`KeyListing` lists the **shard** a key falls in (the store's first-level folder ``v1/<k0k1>/``: 256 shards,
one ``LIST`` request per 1,000 entries of the shard) the first time a key of it is asked about, and answers that
shard's questions from the listing. Only shards asked about are listed and held, each as one sorted array of
19-byte keys (the key's 38 hex digits after the shard's two, ~20 bytes a key: :func:`pack`), and the shards held
are bounded (:data:`MAX_KEYS` keys in all, least recently used shards dropped): a store of the source documents'
~900,000 arrays costs at most ~18 MB per process, where a set of every key's string took ~115 MiB
(2026-11-26, ``tracemalloc``, docs/benchmarks/store.md), and one process asking about a few samples lists a few
shards, not the store. A small store is listed whole instead: the first page of its listing (:data:`PAGE` keys,
one request) is asked first, and when it holds every key, every shard is answered from it (a worker of a
small experiment would otherwise list up to 256 shards, one request each, where one listed the store).

Staleness is safe either way for the content-addressed store: a key written by another worker after its shard's
listing reads as missing, so it is computed again and its equal bytes replace the stored ones (an atomic put); a
key this process writes is added to its shard; a caller for whom a false "missing" is not harmless asks
``strict`` (a key missing from the listing is then asked of the store). A key removed after the listing
(``labswarm store gc`` removes only keys no registered experiment references, never a running session's) reads as
present until its shard is listed again, :data:`TTL_S` seconds after its listing. On a local store
:class:`KeyListing` asks the store each time (a listing walks shard folders: dearer than a few ``stat`` calls).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from labswarm.storage.local import LocalStorage
from labswarm.store.store import FeatureStore

#: Seconds a shard's listing answers before the shard is listed again (a store of E entries then costs at most
#: 256 + E / 1,000 requests per process per period, fewer when the process asks about fewer shards).
TTL_S = 300.0
#: Keys held in all shards' listings by default (~20 bytes each: ~40 MB at most): the documents' ~900,000 arrays
#: fit twice; a bigger store drops the least recently used shards' listings and lists them again when asked.
MAX_KEYS = 2**21
#: Keys of the store's first listing page (1,000 entries, one request): a store holding no more is listed whole by
#: it, once per :data:`TTL_S`, instead of a request per shard asked about (0: no page, shards only).
PAGE = 999
#: Width of a packed key: the 38 hex digits after the shard's two, as bytes.
_PACKED = np.dtype("S19")


def pack(keys: Iterable[str]) -> np.ndarray:
    """The keys of one shard packed and sorted: their last 38 hex digits as 19 raw bytes each.

    Args:
        keys: 40-hex-digit feature keys (of one shard: their first two digits are the shard's and are dropped).

    Returns:
        A sorted ``S19`` array of shape ``(len(keys),)``: 19 bytes a key, found with :func:`np.searchsorted`.
    """
    return np.sort(np.array([bytes.fromhex(key[2:]) for key in keys], dtype=_PACKED))


@dataclass(slots=True)
class _Shard:
    """One shard's listing: its packed keys, the keys this process added since, and when it was listed."""

    keys: np.ndarray
    at: float
    added: set[str] = field(default_factory=set)

    def __contains__(self, key: str) -> bool:
        if key in self.added:
            return True
        packed = bytes.fromhex(key[2:]).rstrip(b"\0")  # S19 items read back without their trailing NUL bytes
        i = int(np.searchsorted(self.keys, packed))
        return i < len(self.keys) and bytes(self.keys[i]) == packed

    def __len__(self) -> int:
        return len(self.keys) + len(self.added)


class KeyListing:
    """Whether keys are in ``store``: asked of the store (local) or answered from its shards' listings (remote).

    Args:
        store: the feature store.
        ttl_s: seconds a shard's listing is used before the shard is listed again.
        max_keys: keys held in all listings before the least recently used shards' are dropped (the shard just
            listed is always held, however big).
        page: keys of the first listing page asked once per ``ttl_s``: a store with no more is listed whole by
            that one request (0: shards only).

    Attributes:
        listed: whether answers come from listings (the store's entries are in an object store).
        listings: shard listings made so far (for tests and benchmarks).
    """

    def __init__(self, store: FeatureStore, ttl_s: float = TTL_S, max_keys: int = MAX_KEYS, page: int = PAGE) -> None:
        self.store, self.ttl_s, self.max_keys, self.page = store, ttl_s, max_keys, page
        self.listed = not isinstance(store.origin, LocalStorage)
        self.listings = 0
        self._shards: OrderedDict[str, _Shard] = OrderedDict()
        self._paged_at = -float("inf")  # when the store was last asked for one page of its keys
        self._whole = False  # that page held every key: every shard is listed by it

    @property
    def held(self) -> int:
        """Keys held in the listings (each packed key, and each key added since its shard's listing)."""
        return sum(len(shard) for shard in self._shards.values())

    @property
    def shards(self) -> list[str]:
        """The shards (two hex digits) whose listings are held, least recently used first."""
        return list(self._shards)

    def contains(self, key: str, *, strict: bool = False) -> bool:
        """Whether ``key`` is stored (as of its shard's listing, when listed).

        Args:
            key: a feature key.
            strict: a key the listing does not hold is asked of the store (one request): for a caller to whom a
                key written since the listing must not read as missing (a session's reconciliation marks a
                sample failed when its arrays are missing and its attempts are spent).

        Raises:
            StoreError: the store cannot be read or listed, or ``key`` is invalid.
        """
        if not self.listed:
            return self.store.contains(key)
        shard = self._shard(key)
        if key in shard:
            return True
        if strict and self.store.contains(key, fresh_s=1.0):  # written packs listed again if over 1 s old
            shard.added.add(key)
            return True
        return False

    def added(self, key: str) -> None:
        """``key`` was just stored by this process (kept with its shard's listing, when that is held)."""
        if self.listed and (shard := self._shards.get(key[:2])) is not None:
            shard.added.add(key)

    def _shard(self, key: str) -> _Shard:
        """The listing of ``key``'s shard, listed now when not held or older than :attr:`ttl_s`."""
        self.store.relpath(key)  # an invalid key fails as the store's own check does
        name, now = key[:2], time.monotonic()
        shard = self._shards.get(name)
        if (shard is None or now - shard.at > self.ttl_s) and self.page and now - self._paged_at > self.ttl_s:
            self._paged_at = now
            keys, more = self.store.first_keys(self.page)
            self.listings += 1
            self._whole = not more and len(keys) <= self.max_keys
            if self._whole:  # a small store: one request listed all of it
                shards: dict[str, list[str]] = {f"{i:02x}": [] for i in range(256)}
                for found in keys:
                    shards[found[:2]].append(found)
                self._shards = OrderedDict((n, _Shard(pack(ks), now)) for n, ks in shards.items())
            shard = self._shards.get(name)
        if shard is None or now - shard.at > self.ttl_s:
            self._shards.pop(name, None)
            shard = self._shards[name] = _Shard(pack(self.store.shard_keys(name)), now)
            self.listings += 1
            held = self.held
            while held > self.max_keys and len(self._shards) > 1:
                held -= len(self._shards.pop(next(iter(self._shards))))
        self._shards.move_to_end(name)
        return shard
