"""The local cache in front of a remote storage (labswarm/storage/cache.py): reads served locally after the first,
least recently used out, never above its bound, two processes filling it at once."""

from __future__ import annotations

import multiprocessing
import os
import random
from pathlib import Path

import pytest
from jobs.conftest import s3_endpoint, s3_url  # noqa: F401 - fixtures (moto's server on :9000)

from labswarm.errors import StorageError
from labswarm.storage import LocalStorage, LocalStorageConfig, MissingObject, Storage
from labswarm.storage.cache import CachedStorage
from labswarm.storage.cachefiles import Ledger

SIZE = 1000  # bytes of each test object


def remote_with(tmp_path: Path, n: int) -> LocalStorage:
    """A remote of ``n`` objects ``o/<i>`` of :data:`SIZE` bytes, object ``i`` filled with byte ``i % 256``."""
    remote = LocalStorage(LocalStorageConfig(path=tmp_path / "remote", fsync=False))
    for i in range(n):
        remote.put_bytes(f"o/{i}", bytes([i % 256]) * SIZE)
    return remote


def cached_bytes(folder: Path) -> int:
    """The bytes of the files in the cache, counted under its lock (no addition half done)."""
    with Ledger(folder):
        return sum(p.stat().st_size for p in (folder / "objects").rglob("*") if p.is_file())


def test_a_read_is_served_locally_after_the_first(tmp_path: Path) -> None:
    remote = remote_with(tmp_path, 3)
    cache = CachedStorage(remote, tmp_path / "cache", 10 * SIZE)
    assert cache.get_bytes("o/1") == bytes([1]) * SIZE
    path = cache.local_path("o/2")
    assert path is not None and path.read_bytes() == bytes([2]) * SIZE and path.is_relative_to(tmp_path / "cache")
    remote.delete("o")  # the remote loses them: the cached copies still answer
    assert cache.get_bytes("o/1") == bytes([1]) * SIZE and cache.exists("o/2")
    with pytest.raises(MissingObject):
        cache.get_bytes("o/0")
    assert cache.usage() == 2 * SIZE == cached_bytes(tmp_path / "cache")


def test_least_recently_used_out_and_never_above_the_bound(tmp_path: Path) -> None:
    remote = remote_with(tmp_path, 60)
    bound = 10 * SIZE + SIZE // 2
    cache = CachedStorage(remote, tmp_path / "cache", bound)
    cache.touch_s = 0  # recency to the nanosecond: every hit touches its file
    order = list(range(1, 60))
    random.Random(0).shuffle(order)
    cache.warm("o/0")
    remote.delete("o/0")  # from now on only the cache has it: evicting it would lose it
    for n, i in enumerate(order):
        assert cache.get_bytes(f"o/{i}") == bytes([i % 256]) * SIZE
        if n % 3 == 0:
            assert cache.get_bytes("o/0") == bytes(SIZE)  # used often: never the least recent
        assert cached_bytes(tmp_path / "cache") <= bound
        assert cache.usage() == cached_bytes(tmp_path / "cache")
    assert cache.cached_path("o/0").is_file() and cache.cached_path(f"o/{order[-1]}").is_file()
    assert not cache.cached_path(f"o/{order[0]}").is_file()


def test_an_object_larger_than_the_bound_is_read_uncached(tmp_path: Path) -> None:
    cache = CachedStorage(remote_with(tmp_path, 1), tmp_path / "cache", SIZE - 1)
    assert cache.get_bytes("o/0") == bytes(SIZE)
    assert cache.local_path("o/0") is None and cache.usage() == 0
    with pytest.raises(StorageError, match=">= 0"):
        CachedStorage(remote_with(tmp_path, 0), tmp_path / "c2", -1)


def test_the_usage_record_is_recounted_when_lost(tmp_path: Path) -> None:
    cache = CachedStorage(remote_with(tmp_path, 4), tmp_path / "cache", 100 * SIZE)
    for i in range(4):
        cache.warm(f"o/{i}")
    (tmp_path / "cache" / ".usage.json").unlink()  # as if a process was killed before writing it
    assert cache.usage() == 4 * SIZE


def read_in_place(cache: CachedStorage, key: str) -> bytes:
    """What a reader of ``local_path`` does (FeatureStore.get): the cached file, or, when another process evicted
    it between ``local_path`` and the read, the storage's answer."""
    path = cache.local_path(key)
    assert path is not None
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return cache.get_bytes(key)


def _fill(remote_path: str, folder: str, bound: int, seed: int, n: int) -> None:
    remote = LocalStorage(LocalStorageConfig(path=Path(remote_path), fsync=False))
    cache = CachedStorage(remote, folder, bound)
    rng = random.Random(seed)
    for _ in range(400):
        i = rng.randrange(n)
        data = cache.get_bytes(f"o/{i}") if rng.random() < 0.5 else read_in_place(cache, f"o/{i}")
        if data != bytes([i % 256]) * SIZE:
            raise RuntimeError(f"o/{i} read back wrong ({len(data)} bytes)")


def test_two_processes_filling_it_at_once(tmp_path: Path) -> None:
    n, bound = 120, 25 * SIZE
    remote_with(tmp_path, n)
    folder = tmp_path / "cache"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_fill, args=(str(tmp_path / "remote"), str(folder), bound, seed, n))
             for seed in (1, 2)]
    for p in procs:
        p.start()
    samples = []
    while any(p.is_alive() for p in procs):  # the bound holds at every moment, not only at the end
        if folder.is_dir():
            samples.append(cached_bytes(folder))
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert samples and max(samples) <= bound
    final = cached_bytes(folder)
    assert final <= bound and CachedStorage(remote_with(tmp_path, 0), folder, bound).usage() == final
    assert not [p for p in folder.rglob(".*.tmp")]
    assert os.path.isfile(folder / ".lock")


def test_a_file_evicted_by_another_process_is_fetched_again(tmp_path: Path) -> None:
    cache = CachedStorage(remote_with(tmp_path, 2), tmp_path / "cache", 10 * SIZE)
    first = cache.local_path("o/1")
    assert first is not None
    first.unlink()  # as another process's eviction would: this process still remembers touching it
    assert read_in_place(cache, "o/1") == bytes([1]) * SIZE and first.is_file()
    first.unlink()
    assert cache.warm("o/1") and first.is_file()


def test_a_cached_file_is_synced_before_it_is_renamed_into_place(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # a host crash after the rename but before the bytes reached the disk would leave a short file under the
    # object's name: each file (a fill, and the objects a caller inserts, as a pack) is synced first
    remote = remote_with(tmp_path, 3)
    cache = CachedStorage(remote, tmp_path / "cache", 10 * SIZE)
    synced: list[str] = []
    placed: list[tuple[str, bool]] = []  # (the file renamed into objects/, whether it was synced before)
    fsync, replace = os.fsync, os.replace

    def spy_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        fsync(fd)

    def spy_replace(src: str | Path, dst: str | Path) -> None:
        if "objects" in Path(dst).parts:
            placed.append((str(dst), str(src) in synced))
        replace(src, dst)

    monkeypatch.setattr(os, "fsync", spy_fsync)
    monkeypatch.setattr(os, "replace", spy_replace)
    assert cache.get_bytes("o/1") == bytes([1]) * SIZE
    assert cache.warm("o/2")
    assert cache.insert([("p/whole", b"x" * SIZE)]) == 1
    assert [(Path(dst).name, was) for dst, was in placed] == [("1", True), ("2", True), ("whole", True)], placed
    assert (tmp_path / "cache" / "objects" / "p" / "whole").read_bytes() == b"x" * SIZE


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_a_conditional_delete_drops_the_cached_copy_and_its_bytes(tmp_path: Path, backend: str,
                                                                  request: pytest.FixtureRequest) -> None:
    """delete_if through the cache (gc's removal of an orphan) removes the cached copy and its bytes from the usage
    record when the remote's object goes, as delete does (review #8), and keeps both when it stays."""
    remote = (remote_with(tmp_path, 2) if backend == "local"
              else Storage.from_spec(request.getfixturevalue("s3_endpoint").spec()))
    for i in range(2):
        remote.put_bytes(f"o/{i}", bytes([i]) * SIZE)
    cache = CachedStorage(remote, tmp_path / "cache", 10 * SIZE)
    assert [cache.get_bytes(f"o/{i}") for i in range(2)] == [bytes([i]) * SIZE for i in range(2)]
    listed = cache.modified("o")
    remote.put_bytes("o/1", b"written again")  # after the listing: spared
    assert not cache.delete_if("o/1", listed["o/1"].version) and cache.usage() == 2 * SIZE
    assert cache.delete_if("o/0", listed["o/0"].version)
    assert not cache.cached_path("o/0").exists() and cache.usage() == SIZE == cached_bytes(tmp_path / "cache")
    with pytest.raises(MissingObject):
        cache.get_bytes("o/0")
