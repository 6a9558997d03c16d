"""A local store's size limit (labswarm/store/trim.py): least recently used arrays out first, never a protected
one, nothing removed by a dry run; a remote store is refused (its cache has its own bound)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from labswarm.errors import StoreError
from labswarm.store import FeatureStore
from labswarm.store.trim import trim


def test_trim_removes_the_least_recently_used_unprotected_arrays(tmp_path: Path) -> None:
    store = FeatureStore(tmp_path / "store")
    keys = [f"{i:040x}" for i in range(8)]
    for i, key in enumerate(keys):
        store.put(key, np.full((16, 16), i, np.float32))
        used = 1_000_000 + 10 * i  # key i last used at time 1e6 + 10 i, except key 2: read just now (its atime)
        os.utime(store.storage.local_path(store.relpath(key)), (used if i != 2 else time.time(), used))
    size = store.sizes()[keys[0]]
    # protected: the oldest (key 0) and key 4; at most 4 arrays: keys 1, 3, 5, 6 would go (least recent first)
    dry = trim(store, 4 * size, [keys[0], keys[4]], dry_run=True)
    assert (dry.arrays, dry.bytes, dry.remaining, dry.protected, dry.over) == (4, 4 * size, 4 * size, 2 * size,
                                                                             False)
    assert len(store.sizes()) == 8  # a dry run removes nothing
    done = trim(store, 5 * size, [keys[0], keys[4]])  # at most 5: keys 1, 3, 5 go; key 2, read just now, stays
    assert (done.arrays, done.remaining, done.over) == (3, 5 * size, False)
    assert sorted(store.sizes()) == [keys[0], keys[2], keys[4], keys[6], keys[7]]
    over = trim(store, 0, keys)  # everything protected: all kept, still over the bound
    assert (over.arrays, over.over, over.protected) == (0, True, 5 * size) and len(store.sizes()) == 5
    with pytest.raises(StoreError, match=">= 0"):
        trim(store, -1)
