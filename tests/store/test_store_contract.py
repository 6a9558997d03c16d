"""The feature store's contract, on every backend (``local`` and ``s3``, parametrized by ``open_store``): the same
keys and layout, atomic writes under concurrent writers and readers, a missing key, a corrupt object detected."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable

import numpy as np
import pytest

from labswarm.errors import StoreError
from labswarm.store import FeatureStore
from labswarm.store.ops import verify
from labswarm.store.store import MARKER

KEY = "ab" * 20
#: The ``open_store`` fixture (tests/store/conftest.py): opens the test's store anew.
OpenStore = Callable[[], FeatureStore]


def test_put_get_contains_and_listing(open_store: OpenStore) -> None:
    store = open_store()
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert not store.contains(KEY) and store.stats().entries == 0
    store.put(KEY, values)
    assert store.contains(KEY) and KEY in store
    assert _object(store, KEY) == (f"written/v1/{store.written.find(KEY).name}.pack" if store.packed
                                   else f"v1/ab/ab/{KEY}.npy")  # the local layout's path, or its written pack
    got = open_store().get(KEY)
    assert got.dtype == np.float32 and got.shape == (3, 4)
    np.testing.assert_array_equal(got, values)
    sizes = store.sizes()
    assert list(sizes) == [KEY] and sizes[KEY] > values.nbytes
    assert store.stats().entries == 1
    store.delete(KEY)
    assert not store.contains(KEY) and store.stats().entries == 0


def test_a_missing_key_is_no_entry(open_store: OpenStore) -> None:
    store = open_store()
    with pytest.raises(StoreError, match=f"no entry {KEY}"):
        store.get(KEY)
    with pytest.raises(StoreError, match="invalid feature-store key"):
        store.get("../../etc/passwd")


@pytest.mark.parametrize("damage", ["truncated", "garbage", "appended"])
def test_a_corrupt_object_is_detected(open_store: OpenStore, damage: str) -> None:
    store = open_store()
    store.put(KEY, np.ones((8, 16), np.float32))
    rel = _object(store, KEY)  # its own object, or its written pack
    whole = store.origin.get_bytes(rel)  # behind the cache, if any
    bad = {"truncated": whole[:-10], "garbage": b"\x93NUMPY garbage", "appended": whole + b"\0" * 8}[damage]
    store.origin.put_bytes(rel, bad)
    if damage != "appended":  # np.load ignores bytes after the array; verify does not
        for mapped in (False, True):
            with pytest.raises(StoreError, match=f"corrupt entry {KEY}"):
                open_store().get(KEY, mmap=mapped)
    found = verify(open_store())
    assert found.checked == 1
    if not store.packed:
        assert list(found.problems) == [KEY]
    else:  # the pack's own problem, and its array's unless only bytes were appended after it
        name = rel.split("/")[-1][:-5]
        assert sorted(found.problems) == [KEY, f"written pack {name}"][damage == "appended":], found.problems


def _object(store: FeatureStore, key: str) -> str:
    """The object that holds ``key``'s bytes: its own, or in a store that writes packs, its written pack."""
    if store.written is not None and (found := store.written.find(key, fresh_s=0.0)) is not None:
        return f"written/v1/{found.name}.pack"
    return FeatureStore.relpath(key)


def test_another_layout_is_refused(open_store: OpenStore) -> None:
    open_store().storage.put_bytes(MARKER, b'{"layout": 99}')
    with pytest.raises(StoreError, match="layout 99"):
        open_store()


def _writer(open_store: OpenStore, worker: int, n_keys: int, rounds: int) -> None:
    store = open_store()
    for r in range(rounds):
        for k in range(n_keys):
            key = f"{k:040x}"
            # every writer writes the same content for a key (a key fixes the content), large enough (256 KiB)
            # that a non-atomic write would be seen as a short or mixed array by the readers
            store.put(key, np.full((64, 1024), k, dtype=np.float32))
            if (r + worker) % 2:
                try:
                    got = store.get(key)
                except StoreError as exc:
                    raise RuntimeError(f"read of {key} while others write it: {exc}") from exc
                if got.shape != (64, 1024) or not np.all(got == k):
                    raise RuntimeError(f"torn read of {key}")


def test_concurrent_writers_of_one_key_in_processes(open_store: OpenStore) -> None:
    open_store()
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(open_store, w, 4, 4)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    store = open_store()
    assert sorted(store.sizes()) == [f"{k:040x}" for k in range(4)]
    assert verify(store).problems == {}
    for k in range(4):
        assert np.all(store.get(f"{k:040x}") == k)
