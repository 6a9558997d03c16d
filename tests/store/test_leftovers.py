"""A writer killed mid-write (kill -9) leaves its temporary file; the next write of that entry removes it.

Concurrent writers of one key, which remove each other's temporary files, are covered by
``test_store.py::test_atomic_under_concurrent_writers_in_processes``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from labswarm.store import FeatureStore

KEY = "cd" * 20


def test_next_write_of_an_entry_removes_the_temporary_file_of_a_killed_writer(tmp_path: Path) -> None:
    store = FeatureStore(tmp_path / "store")
    folder = tmp_path / "store" / "v1" / "cd" / "cd"
    folder.mkdir(parents=True)
    killed = folder / f".{KEY}.npy.otherhost-4242-0badf00d.tmp"  # what a writer killed before its rename leaves
    killed.write_bytes(b"\x93NUMPY partial")
    other = folder / f".{'cdcd' + 'e' * 36}.npy.otherhost-4243-0badf00d.tmp"  # another entry's write: kept
    other.write_bytes(b"\x93NUMPY partial")
    assert not store.contains(KEY) and store.stats().entries == 0

    store.put(KEY, np.ones((2, 3), dtype=np.float32))

    assert sorted(p.name for p in folder.iterdir()) == sorted([other.name, f"{KEY}.npy"])
    np.testing.assert_array_equal(store.get(KEY), np.ones((2, 3), dtype=np.float32))
