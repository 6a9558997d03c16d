from __future__ import annotations

import mmap
import multiprocessing
from pathlib import Path

import numpy as np
import pytest

from labswarm.errors import StoreError
from labswarm.store import FeatureStore
from labswarm.store.store import MARKER

KEY = "ab" * 20


def test_put_get_roundtrip_and_layout(tmp_path: Path) -> None:
    store = FeatureStore(tmp_path / "store")
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert not store.contains(KEY)
    store.put(KEY, values)
    assert store.contains(KEY) and KEY in store
    assert (tmp_path / "store" / "v1" / "ab" / "ab" / f"{KEY}.npy").is_file()
    got = store.get(KEY)
    assert got.dtype == np.float32 and got.shape == (3, 4)
    np.testing.assert_array_equal(got, values)
    mapped = store.get(KEY, mmap=True)
    assert isinstance(mapped.base, mmap.mmap) and not mapped.flags.writeable  # the file's pages, read-only
    np.testing.assert_array_equal(mapped, values)
    stats = store.stats()
    assert stats.entries == 1 and stats.bytes > values.nbytes


def test_missing_and_invalid_keys(tmp_path: Path) -> None:
    store = FeatureStore(tmp_path)
    with pytest.raises(StoreError, match="no entry"):
        store.get(KEY)
    with pytest.raises(StoreError, match="invalid feature-store key"):
        store.put("../../etc/passwd", np.zeros(1))
    with pytest.raises(StoreError, match="object array"):
        store.put(KEY, np.array([object()], dtype=object))


def test_corrupt_entry_is_reported(tmp_path: Path) -> None:
    store = FeatureStore(tmp_path)
    store.put(KEY, np.zeros((2, 2), np.float32))
    (tmp_path / FeatureStore.relpath(KEY)).write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(StoreError, match="corrupt entry"):
        store.get(KEY)


def test_other_layout_is_refused(tmp_path: Path) -> None:
    (tmp_path / MARKER).write_text('{"layout": 99}')
    with pytest.raises(StoreError, match="layout 99"):
        FeatureStore(tmp_path)


def _writer(root: str, worker: int, n_keys: int, rounds: int) -> None:
    store = FeatureStore(root)
    for r in range(rounds):
        for k in range(n_keys):
            key = f"{k:040x}"
            # every writer writes the same content for a key (a key fixes the content), large enough that a
            # non-atomic write would be observable as a short or mixed file
            store.put(key, np.full((64, 1024), k, dtype=np.float32))
            if (r + worker) % 2:
                got = store.get(key)
                if got.shape != (64, 1024) or not np.all(got == k):
                    raise RuntimeError(f"torn read of {key}")


def test_atomic_under_concurrent_writers_in_processes(tmp_path: Path) -> None:
    root = str(tmp_path / "store")
    FeatureStore(root)
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(root, w, 8, 5)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    store = FeatureStore(root)
    assert store.stats().entries == 8
    leftovers = [p for p in Path(root).rglob(".*.tmp")]
    assert leftovers == []
    for k in range(8):
        assert np.all(store.get(f"{k:040x}") == k)


@pytest.mark.parametrize("array", [np.arange(7, dtype=np.float64), np.ones((2, 3, 4), np.int16),
                                   np.zeros((0, 5), np.float32), np.float32(3.5) * np.ones((1,), np.float32)])
def test_memory_mapped_reads_equal_whole_reads(tmp_path: Path, array: np.ndarray) -> None:
    store = FeatureStore(tmp_path)
    for k in range(2):  # the second read of an equal header comes from the parsed-header cache
        key = f"{k:040x}"
        store.put(key, array)
        mapped = store.get(key, mmap=True)
        assert mapped.shape == array.shape and mapped.dtype == array.dtype
        np.testing.assert_array_equal(mapped, array)
