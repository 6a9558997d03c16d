"""Which keys a remote feature store holds, from one listing instead of a request per key.

A worker asks, for each sample, whether its keys are stored before computing them (and the run's parent asks to
count the cached ones). On a local store that is a ``stat``; on an object store (``s3``) each question is a
``HEAD`` request, ~14 ms against moto on loopback (2026-11-26, 2-core machine under load; docs/benchmarks/store.md),
as much as writing the array. :class:`KeyListing`
lists the store's keys once (one ``LIST`` request per 1,000 entries) and answers from that set.

Staleness is safe either way for the content-addressed store: a key written by another worker after the listing
reads as missing, so it is computed again and its equal bytes replace the stored ones (an atomic put); a key this
process writes is added to the set; a caller for whom a false "missing" is not harmless asks ``strict`` (a key
missing from the listing is then asked of the store). A key removed after the listing (``labswarm store gc``
removes only keys no registered experiment references, never a running session's) would read as present until
the listing is renewed, every :data:`TTL_S` seconds. On a local store :class:`KeyListing` asks the store each
time (a listing walks 65,536 shard folders: far dearer than a few ``stat`` calls).
"""

from __future__ import annotations

import time

from labswarm.storage.local import LocalStorage
from labswarm.store.store import FeatureStore

#: Seconds a listing answers before the store is listed again (a store of E entries then costs E / 1,000
#: requests per process per period: 900 for the source documents' ~900,000 arrays, against a request per key).
TTL_S = 300.0


class KeyListing:
    """Whether keys are in ``store``: asked of the store (local) or answered from a listing (remote).

    Args:
        store: the feature store.
        ttl_s: seconds a listing is used before the store is listed again.

    Attributes:
        listed: whether answers come from a listing (the store's entries are in an object store).
        listings: listings made so far (for tests and benchmarks).
    """

    def __init__(self, store: FeatureStore, ttl_s: float = TTL_S) -> None:
        self.store, self.ttl_s = store, ttl_s
        self.listed = not isinstance(store.origin, LocalStorage)
        self.listings = 0
        self._keys: set[str] = set()
        self._at = -float("inf")

    def contains(self, key: str, *, strict: bool = False) -> bool:
        """Whether ``key`` is stored (as of the current listing, when listed).

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
        self.store.relpath(key)  # an invalid key fails as the store's own check does
        now = time.monotonic()
        if now - self._at > self.ttl_s:
            self._keys, self._at = set(self.store.keys()), now
            self.listings += 1
        if key in self._keys:
            return True
        if strict and self.store.contains(key):
            self._keys.add(key)
            return True
        return False

    def added(self, key: str) -> None:
        """``key`` was just stored by this process."""
        if self.listed:
            self._keys.add(key)
