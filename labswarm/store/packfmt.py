"""The pack format (:mod:`labswarm.store.packs`): a pack object's bytes, its header, the CRC-32C of each array.

``MAGIC``, the header's length (4 bytes, little-endian), the header ``{"layout": 1, "checksum": "crc32c",
"entries": [[key, offset, length, crc], ...]}`` (a written pack's adds ``"written": <nonce>``), then the arrays'
``.npy`` bytes back to back, each at ``offset`` from the end of the header (the layout is described in
:mod:`labswarm.store.packs`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from labswarm.errors import StorageError
from labswarm.store.npy import npy_problem

#: First bytes of a pack object.
MAGIC = b"LSWPACK1"


def crc32c(data: bytes | memoryview) -> int:
    """The CRC-32C of ``data`` (google-crc32c, in hardware where the CPU has it).

    Raises:
        StorageError: google-crc32c is not installed (``pip install 'labswarm[s3]'``).
    """
    try:
        import google_crc32c
    except ImportError as exc:
        raise StorageError("packs need google-crc32c: pip install 'labswarm[s3]'") from exc
    return int(google_crc32c.value(bytes(data) if isinstance(data, memoryview) else data))


@dataclass(frozen=True, slots=True)
class Entry:
    """One array of a pack: its store ``key``, ``length`` bytes at ``offset`` after the header, their ``crc``."""

    key: str
    offset: int
    length: int
    crc: int


def encode(items: Sequence[tuple[str, bytes]], nonce: str | None = None) -> tuple[str, bytes, bytes]:
    """The pack of ``items`` (``(key, .npy bytes)``, in that order): ``(name, header, pack object's bytes)``; the
    name the SHA-256 of the header without ``nonce`` (a written pack's: each write's header then differs, and so
    its objects' ETags, its name not: :mod:`labswarm.store.orphans`)."""
    entries, offset = [], 0
    for key, data in items:
        entries.append([key, offset, len(data), crc32c(data)])
        offset += len(data)
    fields = {"layout": 1, "checksum": "crc32c", "entries": entries}
    header = json.dumps(fields, separators=(",", ":")).encode()
    name = hashlib.sha256(header).hexdigest()[:40]
    if nonce is not None:
        header = json.dumps({**fields, "written": nonce}, separators=(",", ":")).encode()
    return name, header, MAGIC + len(header).to_bytes(4, "little") + header + b"".join(d for _, d in items)


def parse_header(header: bytes | memoryview) -> list[Entry]:
    """The entries of a pack's header.

    Raises:
        ValueError: not a header of layout 1 (bad JSON, a field of the wrong type, an invalid key).
    """
    try:
        data = json.loads(bytes(header))
        if not isinstance(data, dict) or data.get("layout") != 1 or data.get("checksum") != "crc32c":
            raise ValueError("not layout 1 with checksum crc32c")
        entries = [Entry(str(k), int(o), int(n), int(c)) for k, o, n, c in data["entries"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a pack header: {exc}") from None
    for e in entries:
        if len(e.key) != 40 or e.key.strip("0123456789abcdef") or e.offset < 0 or e.length <= 0:
            raise ValueError(f"not a pack header: invalid entry {e}")
    return entries


def unpack(blob: bytes) -> tuple[list[Entry], dict[str, memoryview], dict[str, str]]:
    """A pack object's entries, the arrays whose bytes are sound (key → a view of ``blob``), and what is wrong
    with the others (key → reason: CRC mismatch, cut off, or not an ``.npy`` of its recorded size).

    Raises:
        ValueError: not a pack (no magic, a header cut off or unreadable).
    """
    if blob[:len(MAGIC)] != MAGIC or len(blob) < len(MAGIC) + 4:
        raise ValueError("not a pack (no magic string)")
    start = len(MAGIC) + 4 + int.from_bytes(blob[len(MAGIC):len(MAGIC) + 4], "little")
    if start > len(blob):
        raise ValueError("its header is cut off")
    view = memoryview(blob)
    entries = parse_header(view[len(MAGIC) + 4:start])
    good: dict[str, memoryview] = {}
    bad: dict[str, str] = {}
    for e in entries:
        data = view[start + e.offset:start + e.offset + e.length]
        if (problem := array_problem(data, e.length, e.crc)) is not None:
            bad[e.key] = problem
        else:
            good[e.key] = data
    return entries, good, bad


def array_by_own_header(blob: bytes, key: str) -> bytes:
    """``key``'s sound ``.npy`` bytes in the pack object ``blob``, found through ``blob``'s own header, not through
    its index's length (the failure path of a read located by the index: a written pack whose pack and index come
    from writers of two versions, one header with the nonce and one without, differ by the nonce's 45 bytes; both
    are sound and their entries equal).

    Raises:
        ValueError: ``blob`` is not a pack, ``key`` is not in it, or its bytes there are damaged (the reason).
    """
    _entries, good, bad = unpack(blob)
    if key in good:
        return bytes(good[key])
    raise ValueError(bad.get(key, f"{key} is not in it"))


def array_problem(data: bytes | memoryview, length: int, crc: int) -> str | None:
    """What is wrong with an array's bytes read from its pack (``length`` and ``crc`` its entry's): cut off, a
    CRC-32C mismatch, or not an ``.npy`` of its recorded size; ``None`` when they are sound."""
    if len(data) != length:
        return f"cut off: {len(data)} of {length} bytes"
    if crc32c(data) != crc:
        return "CRC-32C mismatch: the pack is damaged"
    return npy_problem(data)
