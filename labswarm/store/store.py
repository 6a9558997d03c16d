"""The content-addressed feature store.

Layout under the store root (``LAYOUT_VERSION`` 1)::

    labswarm-store.json                  {"layout": 1}: written once; a store of another layout is refused
    v1/<k0k1>/<k2k3>/<key>.npy           one float32 array per key (NumPy .npy format, memory-mappable)

where ``key`` is the 40-hex-digit key of :func:`labswarm.store.keys.feature_key` and ``<k0k1>/<k2k3>`` its first
four hex digits: 65,536 shard directories keep each directory small at millions of entries. Entries are
written atomically (temporary file + rename, see :class:`~labswarm.store.backend.LocalBackend`), so computing a
sample twice, on two hosts at once, is harmless: the store holds it once.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from labswarm.errors import StoreError
from labswarm.store.backend import LocalBackend, StoreBackend

#: Version of the on-disk layout described in the module docstring.
LAYOUT_VERSION = 1
#: Marker file at the store root.
MARKER = "labswarm-store.json"
_KEY = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True, slots=True)
class StoreStats:
    """How much a store holds: ``entries`` arrays taking ``bytes`` bytes."""

    entries: int
    bytes: int


class FeatureStore:
    """Content-addressed storage of feature arrays.

    Args:
        root: the store's directory (local or shared), used when ``backend`` is not given.
        backend: where the bytes go; default :class:`LocalBackend` at ``root``.

    Raises:
        StoreError: the root holds a store of another layout version, or cannot be created.
    """

    def __init__(self, root: str | Path | None = None, *, backend: StoreBackend | None = None) -> None:
        if backend is None:
            if root is None:
                raise StoreError("a feature store needs a root directory or a backend")
            backend = LocalBackend(root)
        self.backend = backend
        self.root = Path(root) if root is not None else None
        self._check_layout()

    def _check_layout(self) -> None:
        if self.backend.exists(MARKER):
            try:
                layout = json.loads(self.backend.read(MARKER)).get("layout")
            except (ValueError, AttributeError) as exc:
                raise StoreError(f"corrupt {MARKER} in feature store {self.root}") from exc
            if layout != LAYOUT_VERSION:
                raise StoreError(
                    f"feature store {self.root} has layout {layout}; this labswarm reads layout {LAYOUT_VERSION}"
                )
        else:
            self.backend.write_atomic(MARKER, json.dumps({"layout": LAYOUT_VERSION}).encode())

    @staticmethod
    def relpath(key: str) -> str:
        """The entry's path relative to the root: ``v1/<k0k1>/<k2k3>/<key>.npy``.

        Raises:
            StoreError: ``key`` is not 40 lower-case hex digits.
        """
        if not _KEY.match(key):
            raise StoreError(f"invalid feature-store key {key!r}: expected 40 lower-case hex digits")
        return f"v{LAYOUT_VERSION}/{key[:2]}/{key[2:4]}/{key}.npy"

    def contains(self, key: str) -> bool:
        """Whether ``key`` is stored."""
        return self.backend.exists(self.relpath(key))

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.contains(key)

    def get(self, key: str, *, mmap: bool = False) -> np.ndarray:
        """The array stored under ``key``.

        Args:
            key: a feature key.
            mmap: memory-map the file read-only instead of reading it (local backends only).

        Returns:
            The array as written by :meth:`put` (float32 ``(n_bins, n_frames)`` for features).

        Raises:
            StoreError: no such entry, or it cannot be read or parsed.
        """
        rel = self.relpath(key)
        path = self.backend.local_path(rel)
        try:
            if path is not None:
                return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
            return np.load(io.BytesIO(self.backend.read(rel)), allow_pickle=False)
        except FileNotFoundError:
            raise StoreError(f"no entry {key} in feature store {self.root}") from None
        except (OSError, ValueError, EOFError) as exc:
            raise StoreError(f"corrupt entry {key} in feature store {self.root}: {exc}") from exc

    def put(self, key: str, array: np.ndarray) -> None:
        """Store ``array`` under ``key`` atomically (an existing entry is replaced by equal values).

        Raises:
            StoreError: object arrays (not storable without pickle) or a write failure.
        """
        array = np.asarray(array)
        if array.dtype.hasobject:
            raise StoreError(f"cannot store an object array under {key}")
        buffer = io.BytesIO()
        np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
        self.backend.write_atomic(self.relpath(key), buffer.getvalue())

    def delete(self, key: str) -> None:
        """Remove ``key`` if stored."""
        self.backend.delete(self.relpath(key))

    def stats(self) -> StoreStats:
        """Number of entries and their total size in bytes (walks the store)."""
        entries = total = 0
        for rel, size in self.backend.walk():
            if rel.endswith(".npy"):
                entries += 1
                total += size
        return StoreStats(entries, total)
