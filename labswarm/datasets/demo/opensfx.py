"""Read the recorded effects out of openttd-opensfx's ``opensfx.cat`` bank.

Layout (little-endian): an offset table of ``(offset: u32, size: u32)`` pairs, as many as the first offset
divided by 8; bit 31 of each offset flags the newer format and is not part of it. At each offset lies one
byte ``n``, then ``n`` bytes of a NUL-terminated name (the title and licence of the effect), then ``size``
bytes of a complete RIFF/WAVE file.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from labswarm.errors import DatasetError

_FLAG = 0x8000_0000


@dataclass(frozen=True)
class OpenSfxEntry:
    """One effect of the bank.

    Attributes:
        index: position in the offset table (OpenTTD's sound id).
        name: title and licence, e.g. ``'"Explosion". By ... License: ...'``.
        wav: the complete RIFF/WAVE file; empty entries (``Unused/Nothing``) have no frames.
    """

    index: int
    name: str
    wav: bytes

    @property
    def title(self) -> str:
        """The quoted title of the effect, e.g. ``Explosion``."""
        parts = self.name.split('"')
        return parts[1] if len(parts) > 2 else self.name


def parse_cat(data: bytes) -> list[OpenSfxEntry]:
    """Split a ``.cat`` bank into its effects.

    Args:
        data: the whole bank.

    Returns:
        The entries in table order.

    Raises:
        DatasetError: the table or an entry is truncated, or an entry is not a RIFF/WAVE file.
    """
    if len(data) < 8:
        raise DatasetError(f"opensfx bank too short ({len(data)} bytes)")
    (first,) = struct.unpack_from("<I", data, 0)
    count = (first & ~_FLAG) // 8
    if count == 0 or 8 * count > len(data):
        raise DatasetError(f"opensfx bank has an invalid offset table (first offset {first:#x})")
    entries = []
    for index in range(count):
        offset, size = struct.unpack_from("<II", data, 8 * index)
        offset &= ~_FLAG
        if offset >= len(data):
            raise DatasetError(f"opensfx entry {index}: offset {offset} past the end ({len(data)} bytes)")
        name_len = data[offset]
        start = offset + 1 + name_len
        wav = data[start : start + size]
        if len(wav) != size or wav[:4] != b"RIFF" or wav[8:12] != b"WAVE":
            raise DatasetError(f"opensfx entry {index}: not a RIFF/WAVE file of {size} bytes at {start}")
        name = data[offset + 1 : start].rstrip(b"\0").decode("utf-8", errors="replace")
        entries.append(OpenSfxEntry(index=index, name=name, wav=wav))
    return entries


def read_cat(path: str | Path) -> list[OpenSfxEntry]:
    """Read and split a ``.cat`` bank (see :func:`parse_cat`).

    Raises:
        DatasetError: the file cannot be read or is not a valid bank.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise DatasetError(f"cannot read opensfx bank {path}: {exc}") from exc
    return parse_cat(data)
