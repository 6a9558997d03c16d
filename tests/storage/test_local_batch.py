"""The local storage's deferred sync (labswarm/storage/local.py) through the feature store's batch (issue 27): the
arrays of a batch appear under their keys only at its end, all synced, nothing half-written left on a failure."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from labswarm.errors import StoreError
from labswarm.storage.local import LocalStorage, LocalStorageConfig
from labswarm.store.store import FeatureStore

KEYS = ["a" * 40, "b" * 40, "c" * 40]


def _temporaries(root: Path) -> list[Path]:
    return [p for p in root.rglob(".*.tmp")]


def test_a_batch_places_its_arrays_at_its_end_and_only_this_threads(tmp_path: Path) -> None:
    store = FeatureStore(tmp_path / "store")
    other: list[bool] = []
    with store.batch():
        store.put(KEYS[0], np.arange(3, dtype=np.float32))
        with store.batch():  # nested: the outer block's end places it
            store.put(KEYS[1], np.ones((2, 2)))
        assert not store.contains(KEYS[0]) and not store.contains(KEYS[1])
        assert len(_temporaries(tmp_path / "store")) == 2  # written, waiting for the batch's sync
        thread = threading.Thread(target=lambda: (store.put(KEYS[2], np.zeros(1)),
                                                  other.append(store.contains(KEYS[2]))))
        thread.start()
        thread.join()
    assert other == [True]  # another thread's write is its own, placed at once
    assert np.array_equal(store.get(KEYS[0]), np.arange(3, dtype=np.float32))
    assert np.array_equal(store.get(KEYS[1]), np.ones((2, 2)))
    assert _temporaries(tmp_path / "store") == []


def test_without_fsync_a_batch_changes_nothing(tmp_path: Path) -> None:
    store = FeatureStore(storage=LocalStorage(LocalStorageConfig(path=tmp_path / "store", fsync=False)))
    with store.batch():
        store.put(KEYS[0], np.arange(3))
        assert store.contains(KEYS[0])


def test_a_failed_placement_leaves_no_temporary_file_and_is_a_store_error(tmp_path: Path) -> None:
    store = FeatureStore(tmp_path / "store")
    with pytest.raises(StoreError, match="cannot write 1 objects"), store.batch():
        store.put(KEYS[0], np.arange(3))
        store.put(KEYS[1], np.arange(4))
        # the second entry's name taken by a folder that is not empty: its rename fails at the batch's end
        blocker = tmp_path / "store" / store.relpath(KEYS[1])
        blocker.mkdir()
        (blocker / "x").write_text("x")
    assert np.array_equal(store.get(KEYS[0]), np.arange(3))  # placed before the failure, synced first
    assert not store.contains(KEYS[1])
    assert _temporaries(tmp_path / "store") == []
