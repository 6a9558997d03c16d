"""The written packs' orphans (:mod:`labswarm.store.written`): objects of ``written/v1`` no reader ever sees, a
``.pack`` no index names or a ``.json`` whose pack is missing.

A worker killed between its pack's PUT and its index's, or an index whose PUT failed on every attempt, leaves a
pack no index names: readers find packs only through their index, so it is invisible, and a multi-sample message
redelivered is split into single-sample messages whose packs get other names, so nothing completes it. ``gc``
removes an orphan once it was last written :data:`ORPHAN_S` ago (past any write in progress), ``verify`` reports
those and ``du`` shows every one (:mod:`labswarm.store.ops`).
"""

from __future__ import annotations

import time
from collections.abc import Collection

from labswarm.storage.base import Storage
from labswarm.store.written import WRITTEN

#: Seconds after its last write before a written pack with no index, or an index with no pack, is an orphan ``gc``
#: removes and ``verify`` reports: longer than any write in progress, and than the clocks' skew with the server's.
ORPHAN_S = 3600.0
#: A half of a written pack → its other half's suffix.
_OTHER = {".pack": ".json", ".json": ".pack"}


def find_orphans(origin: Storage, older_s: float | None = None) -> dict[str, int]:
    """The objects of :data:`~labswarm.store.written.WRITTEN` in ``origin`` that readers never see, last written
    over ``older_s`` (default :data:`ORPHAN_S`) ago (S3's ``LastModified``, a file's mtime): a ``.pack`` with no
    ``.json`` and a ``.json`` with no ``.pack``; their key in the store → bytes.

    Raises:
        StorageError: the storage cannot be listed.
    """
    listed, since = origin.modified(WRITTEN), time.time() - (ORPHAN_S if older_s is None else older_s)
    return {key: size for key, (size, when) in listed.items() if key[-5:] in _OTHER
            and key[:-5] + _OTHER[key[-5:]] not in listed and when < since}


def remove_orphans(origin: Storage, orphans: Collection[str]) -> int:
    """Remove ``orphans`` (keys :func:`find_orphans` gave) whose other half is still missing; the number removed.

    Raises:
        StorageError: the storage failed.
    """
    removed = 0
    for key in orphans:
        if not origin.exists(key[:-5] + _OTHER[key[-5:]]):
            origin.delete(key)
            removed += 1
    return removed
