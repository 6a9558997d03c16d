"""Storage keys: what a key may be (:func:`check_key`) and how a prefix and a key join (:func:`join_keys`).

Keys: non-empty segments joined by ``/``; no absolute keys (leading ``/``), no ``.`` or ``..`` segment, no segment
starting with ``.`` (those names are the local backend's temporary files), no backslash or control character,
at most :data:`MAX_KEY_BYTES` bytes with the prefix (S3's limit). Every storage (:mod:`labswarm.storage.base`)
checks its keys here before any I/O.
"""

from __future__ import annotations

import re

from labswarm.errors import StorageError

#: The longest full key (prefix included), in UTF-8 bytes: S3's limit.
MAX_KEY_BYTES = 1024
#: A backslash or a control character (below U+0020): never in a key. One regex search per key: a generator over
#: the characters cost ~20 us a key, as much as reading a cached feature array's header.
_BACKSLASH_OR_CONTROL = re.compile(r"[\\\x00-\x1f]")


def check_key(key: str, *, allow_empty: bool = False) -> str:
    """Validate a storage key (see the module docstring) and return it without a trailing ``/``.

    Args:
        key: the key, relative to the storage's prefix.
        allow_empty: accept ``""`` (the whole storage), for :meth:`Storage.list` and :meth:`Storage.delete`.

    Raises:
        StorageError: the key is empty (unless allowed), absolute, or has an invalid segment or character.
    """
    if not isinstance(key, str):
        raise StorageError(f"a storage key must be a string, got {type(key).__name__}")
    if key.startswith("/"):
        raise StorageError(f"invalid key {key!r}: keys are relative (no leading '/')")
    stripped = key[:-1] if key.endswith("/") else key
    if not stripped:
        if allow_empty:
            return ""
        raise StorageError("invalid key '': a key names an object")
    if _BACKSLASH_OR_CONTROL.search(stripped):
        raise StorageError(f"invalid key {key!r}: no backslash or control character")
    for segment in stripped.split("/"):
        if not segment:
            raise StorageError(f"invalid key {key!r}: empty segment ('//')")
        if segment in (".", ".."):
            raise StorageError(f"invalid key {key!r}: no '.' or '..' segment")
        if segment.startswith("."):
            raise StorageError(f"invalid key {key!r}: no segment may start with '.'")
    return stripped


def join_keys(*parts: str) -> str:
    """``parts`` joined by ``/``, the empty ones left out (a prefix ``""`` is the top level)."""
    return "/".join(p for p in parts if p)
