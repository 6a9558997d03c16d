"""The written packs' orphans (:mod:`labswarm.store.written`): objects of ``written/v1`` no reader ever sees, a
``.pack`` no index names or a ``.json`` whose pack is missing.

A worker killed between its pack's PUT and its index's, or an index whose PUT failed on every attempt, leaves a
pack no index names: readers find packs only through their index, so it is invisible, and a multi-sample message
redelivered is split into single-sample messages whose packs get other names, so nothing completes it. ``gc``
removes an orphan once it was last written :data:`ORPHAN_S` ago (past any write in progress), ``verify`` reports
those and ``du`` shows every one (:mod:`labswarm.store.ops`).

A single-sample message redelivered writes the same pack (same name) again, possibly while ``gc`` removes its
hour-old orphan: the new pack must not go. So an orphan is removed only while it is the very object the listing saw
(:meth:`Storage.delete_if <labswarm.storage.base.Storage.delete_if>`: S3's ``DeleteObject`` with ``If-Match`` its
listed ``ETag``; each write of a written pack differs in its header's nonce, so a rewrite has another ETag), and
only while its other half is missing. A server that ignores ``If-Match`` on ``DeleteObject`` would delete
unconditionally (AWS S3 honours it on general-purpose buckets only since 2025-09-16; RustFS parses it without
applying it): ``gc`` first checks that the store's server honours it (:func:`honours_conditional_delete`, once a
run) and leaves the orphans, with a warning naming the server, when it does not, or refuses such a delete (an
error answer, e.g. 501 Not Implemented: the rest of ``gc`` is done all the same).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping

from labswarm.errors import StorageError
from labswarm.storage.base import Storage
from labswarm.storage.local import remove_aside
from labswarm.storage.stamps import Stamp
from labswarm.store.written import WRITTEN

log = logging.getLogger(__name__)

#: Seconds after its last write before a written pack with no index, or an index with no pack, is an orphan ``gc``
#: removes and ``verify`` reports: longer than any write in progress, and than the clocks' skew with the server's.
ORPHAN_S = 3600.0
#: Folder of the scratch object of :func:`honours_conditional_delete` (outside ``written/v1``: no reader lists it).
PROBE = "gc-probe"
#: A half of a written pack → its other half's suffix.
_OTHER = {".pack": ".json", ".json": ".pack"}


def find_orphans(origin: Storage, older_s: float | None = None) -> dict[str, Stamp]:
    """The objects of :data:`~labswarm.store.written.WRITTEN` in ``origin`` that readers never see, last written
    over ``older_s`` (default :data:`ORPHAN_S`) ago (S3's ``LastModified``, a file's mtime): a ``.pack`` with no
    ``.json`` and a ``.json`` with no ``.pack``; their key in the store → what the listing saw (``size`` in bytes,
    ``version`` for :func:`remove_orphans`).

    Raises:
        StorageError: the storage cannot be listed.
    """
    listed, since = origin.modified(WRITTEN), time.time() - (ORPHAN_S if older_s is None else older_s)
    return {key: stamp for key, stamp in listed.items() if key[-5:] in _OTHER
            and key[:-5] + _OTHER[key[-5:]] not in listed and stamp.when < since}


def remove_orphans(origin: Storage, orphans: Mapping[str, Stamp]) -> list[str]:
    """Remove ``orphans`` (what :func:`find_orphans` gave) whose other half is still missing, each only if it is
    still the version listed (a pack written again since, by a redelivered message, stays); the keys removed.

    Raises:
        StorageError: the storage failed.
    """
    return [key for key, stamp in orphans.items()
            if not origin.exists(key[:-5] + _OTHER[key[-5:]]) and origin.delete_if(key, stamp.version)]


def remove_stale_aside(origin: Storage) -> int:
    """Settle what a crash left of :func:`remove_orphans` on a storage of files: a file taken aside by a
    conditional delete (:meth:`LocalStorage.delete_if <labswarm.storage.local.LocalStorage.delete_if>`) over
    :data:`ORPHAN_S` ago, never removed or put back, is put back while its name is free (an orphan put back goes
    with the next ``gc``), else removed (:func:`~labswarm.storage.local.remove_aside`); the number removed (0 on
    an object store).

    Raises:
        StorageError: invalid key (never: :data:`~labswarm.store.written.WRITTEN` is one).
    """
    folder = origin.local_path(WRITTEN)
    return 0 if folder is None else remove_aside(folder, ORPHAN_S)


def honours_conditional_delete(origin: Storage) -> bool:
    """Whether ``origin`` deletes conditionally, as :func:`remove_orphans` needs: a scratch object (under
    :data:`PROBE`) is written, then :meth:`delete_if <labswarm.storage.base.Storage.delete_if>` with a version it
    is not must leave it (a server that ignores ``If-Match`` deletes it; one that refuses it answers an error,
    also ``False``), then it is removed. The scratch objects of earlier probes last written over :data:`ORPHAN_S`
    ago (a ``gc`` that died mid-probe) are removed first. ``False`` is logged as a warning naming the server (and
    its answer).

    Raises:
        StorageError: the storage failed (listing, writing or removing the scratch objects).
    """
    stale = time.time() - ORPHAN_S
    for old, stamp in origin.modified(PROBE).items():
        if stamp.when < stale:
            origin.delete(old)
    key = f"{PROBE}/{uuid.uuid4().hex}"
    origin.put_bytes(key, b"is If-Match honoured?")
    try:
        try:
            honoured = not origin.delete_if(key, '"not-its-version"')
            why = "ignores conditional deletes (If-Match on DeleteObject)"
        except StorageError as exc:
            honoured, why = False, f"refuses conditional deletes (If-Match on DeleteObject: {exc})"
    finally:
        origin.delete(key)
    if not honoured:
        log.warning("leaving the written packs' orphans: %s %s, so removing one could remove the pack a redelivered "
                    "message writes again in that moment", origin.describe(), why)
    return honoured
