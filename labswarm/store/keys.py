"""Feature-store keys: a content address for (audio, segment, transformation, extractor, code version).

The key is the BLAKE2b-160 hash (40 hex digits) of the canonical JSON of::

    {"key_version": KEY_VERSION,
     "audio": {"size": bytes, "mtime_ns": int, "digest": fast content hash},
     "segment": {"sample_rate": Hz, "start": s, "duration": s | null, "pad": bool},
     "transformation": {"spec": {name, **params}, "version": int, "seed": int | null},
     "features": {"spec": {name, **params}, "version": int}}

so the key changes when any input changes, and only then. The fast content hash reads three 64 KiB blocks
(head, middle, tail) plus the size, like imohash: cheap on NFS, and it catches a file replaced in place even
when size and mtime were preserved. ``seed`` is null for deterministic transformations, so an un-augmented clip
is shared by every experiment that uses it.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from labswarm.errors import AudioError

#: Bumped when the key derivation itself changes (every key changes with it).
KEY_VERSION = 1
#: Bytes read at the head, middle and tail of a file for its fast content hash.
BLOCK = 65536
#: Files an :class:`IdentityCache` remembers by default (~400 bytes each: ~26 MB at most).
IDENTITY_CACHE_ENTRIES = 65536


@dataclass(frozen=True, slots=True)
class AudioIdentity:
    """Who an audio file is: size in bytes, modification time in ns, and a fast content digest (hex)."""

    size: int
    mtime_ns: int
    digest: str


def fast_digest(path: str | Path, size: int) -> str:
    """BLAKE2b-128 of the size and three :data:`BLOCK`-byte blocks (head, middle, tail), hex.

    Files up to ``3 * BLOCK`` bytes are hashed whole.
    """
    h = hashlib.blake2b(str(size).encode(), digest_size=16)
    with open(path, "rb") as handle:
        if size <= 3 * BLOCK:
            h.update(handle.read())
        else:
            for offset in (0, size // 2 - BLOCK // 2, size - BLOCK):
                handle.seek(offset)
                h.update(handle.read(BLOCK))
    return h.hexdigest()


class IdentityCache:
    """Per-process cache of :class:`AudioIdentity`, refreshed when a file's size or mtime changes.

    Bounded (least recently used out): a session's publisher walks every clip of its experiment once, so an
    unbounded cache held one entry per clip (~400 bytes each: ~80 MB at 200,000 clips, a 1,000,000-sample
    session) in the manager and in every worker. Samples come clip by clip (:func:`labswarm.sample.iter_samples`:
    a clip's transformations in a row), so a bound far below the clip count keeps the hit rate; a shuffled pass
    over more clips than the bound re-hashes some files (three 64-KiB reads each).

    Args:
        max_entries: files remembered (default :data:`IDENTITY_CACHE_ENTRIES`).
    """

    def __init__(self, max_entries: int | None = None) -> None:
        self.max_entries = IDENTITY_CACHE_ENTRIES if max_entries is None else max(1, max_entries)
        self._cache: OrderedDict[str, AudioIdentity] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._cache)

    def __call__(self, path: str | Path) -> AudioIdentity:
        """The identity of ``path``.

        Raises:
            AudioError: the file is missing or unreadable.
        """
        path = str(path)
        try:
            st = os.stat(path)
            with self._lock:
                cached = self._cache.get(path)
                if cached is not None and cached.size == st.st_size and cached.mtime_ns == st.st_mtime_ns:
                    self._cache.move_to_end(path)
                    return cached
            ident = AudioIdentity(st.st_size, st.st_mtime_ns, fast_digest(path, st.st_size))
        except FileNotFoundError:
            raise AudioError(path, "file not found") from None
        except OSError as exc:
            raise AudioError(path, f"cannot read file ({exc.strerror or exc})") from exc
        with self._lock:
            self._cache[path] = ident
            self._cache.move_to_end(path)
            while len(self._cache) > self.max_entries:
                self._cache.popitem(last=False)
        return ident


def audio_identity(path: str | Path) -> AudioIdentity:
    """The identity of one file, uncached (see :class:`IdentityCache`).

    Raises:
        AudioError: the file is missing or unreadable.
    """
    return IdentityCache()(path)


def feature_key(
    audio: AudioIdentity,
    *,
    sample_rate: int,
    start: float,
    duration: float | None,
    pad: bool,
    transformation: dict[str, Any],
    transformation_version: int,
    seed: int | None,
    features: dict[str, Any],
    features_version: int,
) -> str:
    """The store key (40 hex digits) of one extractor's output for one sample; see the module docstring."""
    material = {
        "key_version": KEY_VERSION,
        "audio": asdict(audio),
        "segment": {"sample_rate": int(sample_rate), "start": float(start),
                    "duration": None if duration is None else float(duration), "pad": bool(pad)},
        "transformation": {"spec": transformation, "version": int(transformation_version), "seed": seed},
        "features": {"spec": features, "version": int(features_version)},
    }
    text = json.dumps(material, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=20).hexdigest()
