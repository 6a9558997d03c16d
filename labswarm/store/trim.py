"""A size limit for a local feature store: the least recently used arrays out, never a protected one.

A remote store's local cache is bounded by itself (:class:`~labswarm.storage.cache.CachedStorage`,
``store.cache_bytes``). A local store (a folder, or NFS) grows with every experiment computed into it:
:func:`trim` brings it under a bound by removing the least recently used arrays first, never one whose key is
``protected`` (``labswarm store trim`` protects the arrays of every running or paused session's experiment and of
every job not finished: a learner reads them, or a worker is writing them).

Recency is the file's last access or modification, whichever is later. Reads do not write (a learner
memory-maps the arrays; a hit costs no system call): the access time is the kernel's (``relatime``, Linux's
default mount option, updates it at the first read after a write and then at most once a day; a ``noatime``
mount never does, and then the order is the order of writing). An array removed while a process has it open or
mapped stays readable by that process (POSIX unlink); a later read of it fails as a missing entry and the
features block computes it again.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from labswarm.errors import StoreError
from labswarm.store.store import FeatureStore


@dataclass(frozen=True, slots=True)
class Trimmed:
    """The outcome of :func:`trim`: ``arrays`` removed (or that would be, ``dry_run``) taking ``bytes``; the store
    holds ``remaining`` bytes after it, of which ``protected`` bytes are protected arrays; ``over`` when it is
    still above the bound (the protected arrays alone exceed it)."""

    arrays: int
    bytes: int
    remaining: int
    protected: int
    over: bool
    dry_run: bool


def trim(store: FeatureStore, max_bytes: int, protected: Iterable[str] = (), *, dry_run: bool = False) -> Trimmed:
    """Remove least recently used arrays of the local ``store`` until it holds at most ``max_bytes`` bytes of
    arrays, never one whose key is in ``protected`` (module docstring).

    Args:
        store: a local feature store (its storage keeps files).
        max_bytes: the bound, bytes (>= 0).
        protected: keys never removed.
        dry_run: remove nothing; say what would go.

    Raises:
        StoreError: ``max_bytes`` < 0, the store is not local (a remote store's cache is bounded by
            ``store.cache_bytes``), or it cannot be listed or an array removed.
    """
    if max_bytes < 0:
        raise StoreError(f"a store's size limit must be >= 0 bytes, got {max_bytes}")
    keep = set(protected)
    entries: list[tuple[int, int, str]] = []  # (recency ns, bytes, key)
    for key in store.sizes():
        path = store.storage.local_path(store.relpath(key))
        if path is None:
            raise StoreError(f"feature store {store.where} is not a local folder: its local cache is bounded by "
                             "store.cache_bytes")
        try:
            st = os.stat(path)
        except FileNotFoundError:  # removed meanwhile
            continue
        entries.append((max(st.st_atime_ns, st.st_mtime_ns), st.st_size, key))
    total = sum(size for _, size, _ in entries)
    guarded = sum(size for _, size, key in entries if key in keep)
    removed = freed = 0
    for _, size, key in sorted(entries):
        if total - freed <= max_bytes:
            break
        if key in keep:
            continue
        if not dry_run:
            store.delete(key)
        removed, freed = removed + 1, freed + size
    remaining = total - freed
    return Trimmed(removed, freed, remaining, guarded, remaining > max_bytes, dry_run)
