"""What a listing saw of an object (:class:`Stamp`), so that it is changed only if nobody wrote it since: the
conditional delete of :meth:`Storage.delete_if <labswarm.storage.base.Storage.delete_if>`.

Each backend says which token tells one write of an object from the next: S3's ``ETag`` (the object's MD5 for a
plain PUT: a token that changes with the bytes; ``DeleteObject`` with ``If-Match`` then deletes only that version,
answering ``412 Precondition Failed`` otherwise, RFC 9110 section 13.1.1), a file's inode and modification time in
nanoseconds (a write replaces the file by a rename: a new inode).
"""

from __future__ import annotations

from typing import NamedTuple


class Stamp(NamedTuple):
    """One object as a listing saw it.

    Attributes:
        size: bytes.
        when: last modified, Unix seconds (S3's ``LastModified``, a file's mtime; a backend that does not know: the
            listing's time).
        version: a token that changes whenever the object is written again (S3's ``ETag``, a file's
            ``<inode>:<mtime ns>``; a backend that has none: ``""``, which :meth:`Storage.delete_if
            <labswarm.storage.base.Storage.delete_if>` matches by checking the object is still there).
    """

    size: int
    when: float
    version: str
