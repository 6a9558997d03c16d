"""Reading ``.npy`` arrays in place: a file memory-mapped (the local store's and a cache's arrays), an array at an
offset of a file or of bytes (a pack's, :mod:`labswarm.store.packs`); whether bytes are a whole ``.npy`` array."""

from __future__ import annotations

import ast
import io
import math
import mmap
import mmap as _mmap
import os
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

#: Parsed ``.npy`` headers by their bytes: the arrays of one feature share one header (fixed-length segments), and
#: parsing one (``ast.literal_eval``) costs more than mapping the file. Cleared when it holds :data:`_HEADERS_MAX`.
_HEADERS: dict[bytes, tuple[tuple[int, ...], bool, np.dtype]] = {}
_HEADERS_MAX = 4096


def _header(handle: BinaryIO) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """``(shape, fortran order, dtype, data offset)`` of the open ``.npy`` file (left positioned anywhere).

    Raises:
        ValueError: not an ``.npy`` file.
    """
    head = handle.read(12)
    if head[:6] != b"\x93NUMPY" or len(head) < 12:
        raise ValueError("not an .npy file (no magic string)")
    offset = 10 + int.from_bytes(head[8:10], "little") if head[6] == 1 else 12 + int.from_bytes(head[8:12], "little")
    handle.seek(0)
    raw = handle.read(offset)
    found = _HEADERS.get(raw)
    if found is None:
        fmt = np.lib.format
        handle.seek(0)
        version = fmt.read_magic(handle)
        read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        shape, fortran, dtype = read(handle)
        if handle.tell() != offset:
            raise ValueError("inconsistent .npy header length")
        if len(_HEADERS) >= _HEADERS_MAX:
            _HEADERS.clear()
        found = _HEADERS[raw] = (tuple(shape), bool(fortran), dtype)
    return (*found, offset)


def read_at(source: Path | bytes, offset: int, length: int, *, mmap: bool) -> np.ndarray:
    """The ``.npy`` array of ``length`` bytes at ``offset`` in ``source``, a file (a pack in a cache) or bytes (a
    pack being written there): read, or with ``mmap`` read-only in place (a file's region memory-mapped: the pages
    from the one that holds ``offset``).

    Raises:
        OSError: the file cannot be opened (FileNotFoundError: missing).
        ValueError: not an ``.npy`` array there, or shorter than its header says.
    """
    buffer: Any
    if isinstance(source, bytes):
        buffer, start = (source, offset) if mmap else (bytearray(memoryview(source)[offset:offset + length]), 0)
        return _array_in(buffer, start, length)
    with open(source, "rb") as handle:
        if mmap:
            base = offset - offset % _mmap.ALLOCATIONGRANULARITY
            buffer = _mmap.mmap(handle.fileno(), offset - base + length, access=_mmap.ACCESS_READ, offset=base)
            start = offset - base
        else:
            handle.seek(offset)
            buffer, start = bytearray(length), 0
            if handle.readinto(buffer) != length:
                raise ValueError(f"the file ends before the {length} bytes at {offset}")
    return _array_in(buffer, start, length)


def _array_in(buffer: Any, start: int, length: int) -> np.ndarray:
    """The ``.npy`` array of ``length`` bytes at ``start`` in ``buffer``, in place (writable if ``buffer`` is).

    Raises:
        ValueError: not an ``.npy`` array there, or shorter than its header says.
    """
    shape, fortran, dtype, header = _header(io.BytesIO(bytes(buffer[start:start + min(length, 65536)])))
    if dtype.hasobject:
        raise ValueError("the array holds Python objects")
    if length < header + math.prod(shape) * dtype.itemsize:
        raise ValueError(f"{length} bytes: shorter than its header {shape} {dtype} says")
    return np.ndarray(shape, dtype, buffer=buffer, offset=start + header, order="F" if fortran else "C")


def map_file(path: Path) -> np.ndarray:
    """The ``.npy`` file's array, memory-mapped read-only: one ``open``, one ``mmap``, the header parsed once per
    distinct header (``np.load(mmap_mode="r")`` through ``np.memmap`` opens the file three times, resolves its
    path and parses the header every time: ~2x the time of a whole read of a 220 KB array).

    Raises:
        OSError: the file cannot be opened (FileNotFoundError: missing).
        ValueError: not an ``.npy`` file, or shorter than its header says.
    """
    with open(path, "rb") as handle:
        shape, fortran, dtype, offset = _header(handle)
        if dtype.hasobject:
            raise ValueError("the array holds Python objects")
        size = os.fstat(handle.fileno()).st_size
        if size < offset + math.prod(shape) * dtype.itemsize:
            raise ValueError(f"{size} bytes: shorter than its header {shape} {dtype} says")
        if size == offset:  # an empty array: nothing to map
            return np.empty(shape, dtype)
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    return np.ndarray(shape, dtype, buffer=mapped, offset=offset, order="F" if fortran else "C")


#: Bytes of data an ``.npy`` header records, by the header's bytes (one feature's arrays share one header).
_SIZES: dict[bytes, int] = {}


def npy_problem(data: bytes | memoryview) -> str | None:
    """Why ``data`` is not a whole ``.npy`` array (its size is not its header's record), ``None`` when it is."""
    head = bytes(data[:12])
    if head[:6] != b"\x93NUMPY" or len(head) < 12:
        return "not an .npy array"
    offset = 10 + int.from_bytes(head[8:10], "little") if head[6] == 1 else 12 + int.from_bytes(head[8:12], "little")
    raw = bytes(data[:offset])
    size = _SIZES.get(raw)
    if size is None:
        try:
            fields = ast.literal_eval(raw[10 if head[6] == 1 else 12:].decode("latin1"))
            size = int(np.prod(fields["shape"], dtype=np.int64)) * np.dtype(fields["descr"]).itemsize
        except (ValueError, SyntaxError, KeyError, TypeError):
            return "not an .npy array (unreadable header)"
        if len(_SIZES) >= 4096:
            _SIZES.clear()
        _SIZES[raw] = size
    return None if len(data) == offset + size else f"{len(data)} bytes where its header records {offset + size}"
