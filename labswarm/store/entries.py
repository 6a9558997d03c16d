"""What a feature store holds: its keys and their sizes, listed, and removing one (mixed into
:class:`~labswarm.store.store.FeatureStore`).

A key's array is either its own object (``v1/<k0k1>/<k2k3>/<key>.npy``: the local layout, and a remote store's
per-key layout) or, in a remote store, in one of the packs its workers wrote (:mod:`labswarm.store.written`); every
listing here answers for both, so ``contains``, a worker's shard listings (:mod:`labswarm.store.listing`), ``ls``,
``du``, ``verify`` and ``gc`` see a packed array as a per-key one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from labswarm.errors import StorageError, StoreError
from labswarm.storage.base import Storage

if TYPE_CHECKING:
    from labswarm.store.written import WrittenPacks

T = TypeVar("T")

#: Version of the on-disk layout described in :mod:`labswarm.store.store`.
LAYOUT_VERSION = 1
_ENTRY = re.compile(rf"^v{LAYOUT_VERSION}/[0-9a-f]{{2}}/[0-9a-f]{{2}}/([0-9a-f]{{40}})\.npy$")
#: Seconds a listing of the written packs answers a shard's keys (:meth:`Entries.shard_keys`: a worker lists up to
#: 256 shards in a row; one listing of the packs for them all, and a large store's catalogue is not rebuilt for
#: each). Staleness costs a sample written meanwhile by another worker computed again, as a shard's listing does.
SHARD_FRESH_S = 60.0


@dataclass(frozen=True, slots=True)
class StoreStats:
    """How much a store holds: ``entries`` arrays taking ``bytes`` bytes."""

    entries: int
    bytes: int


class Entries:
    """A feature store's listings and removal (the attributes are :class:`~labswarm.store.store.FeatureStore`'s)."""

    storage: Storage
    where: str
    written: WrittenPacks | None

    if TYPE_CHECKING:
        @property
        def origin(self) -> Storage: ...

        @staticmethod
        def relpath(key: str) -> str: ...

    def _call(self, call: Callable[[], T]) -> T:
        """``call()``, its storage errors as the feature store's."""
        try:
            return call()
        except StorageError as exc:
            raise StoreError(str(exc)) from exc

    def delete(self, key: str) -> None:
        """Remove ``key`` if stored: its own object, and from a written pack (the pack rewritten without it, or
        removed when it held nothing else: :meth:`WrittenPacks.remove`)."""
        rel = self.relpath(key)
        self._call(lambda: self.storage.delete(rel))
        written = self.written
        if written is not None and self._call(lambda: written.find(key, fresh_s=0.0)) is not None:
            self._call(lambda: written.remove({key}))

    def stats(self) -> StoreStats:
        """Number of entries and their total size in bytes (lists the store)."""
        sizes = self.sizes()
        return StoreStats(len(sizes), sum(sizes.values()))

    def sizes(self, *, packed: bool = True) -> dict[str, int]:
        """Size in bytes of every entry, by key (lists the store: one listing request per 1,000 entries on s3, and
        with ``packed`` the written packs: one listing, and a GET of each index this process has not read).

        Raises:
            StoreError: the storage cannot be listed.
        """
        sizes = {m.group(1): size for rel, size in self._call(lambda: self.storage.sizes(f"v{LAYOUT_VERSION}")).items()
                 if (m := _ENTRY.match(rel))}
        written = self.written
        if packed and written is not None:
            return {**self._call(written.sizes), **sizes}
        return sizes

    def keys(self) -> Iterator[str]:
        """Every stored key (lists the store)."""
        return iter(self.sizes())

    def first_keys(self, limit: int = 999) -> tuple[list[str], bool]:
        """Up to ``limit`` stored keys alone (in the listing's order) and whether there are more: one listing request
        of a remote store (bypassing its cache: :attr:`origin`), the 1,000 entries of its first page; then every key
        of the written packs (listed whole: see :meth:`sizes`).

        Raises:
            StoreError: the storage cannot be listed.
        """
        names, more = self._call(lambda: self.origin.first(f"v{LAYOUT_VERSION}", limit))
        keys = [m.group(1) for rel in names if (m := _ENTRY.match(rel))]
        written = self.written
        return (keys if written is None else keys + list(self._call(written.sizes))), more

    def shard_keys(self, shard: str) -> list[str]:
        """The stored keys that start with ``shard`` (two hex digits: the folder ``v1/<shard>/``, one listing request
        per 1,000 of its entries on s3, and the written packs' keys of the shard, listed at most
        :data:`SHARD_FRESH_S` ago).

        Raises:
            StoreError: ``shard`` is not two lower-case hex digits, or the storage cannot be listed.
        """
        if not re.fullmatch(r"[0-9a-f]{2}", shard):
            raise StoreError(f"invalid feature-store shard {shard!r}: expected 2 lower-case hex digits")
        names = self._call(lambda: self.storage.list(f"v{LAYOUT_VERSION}/{shard}"))
        keys = [m.group(1) for rel in names if (m := _ENTRY.match(rel)) and m.group(1).startswith(shard)]
        written = self.written
        return keys if written is None else keys + self._call(lambda: written.shard(shard, SHARD_FRESH_S))
