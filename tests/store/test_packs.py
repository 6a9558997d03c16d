"""Packs of a remote feature store (labswarm/store/packs.py, packer.py) on s3 (moto's server on :9000): every packed
key read through a cold cache equals its per-key object, with one request per pack; a damaged pack is detected
and its arrays read alone; gc, verify and du know packs; the cache's bound holds."""

from __future__ import annotations

import hashlib
import os
import random
import resource
import signal
import threading
import time
from pathlib import Path

import numpy as np
from jobs.conftest import S3Endpoint

from labswarm.storage.cache import CachedStorage
from labswarm.store import FeatureStore
from labswarm.store.ops import collect_garbage, disk_usage, verify
from labswarm.store.packer import pack, pack_usage
from labswarm.store.packs import PACKS, list_packs

PREFIX = "features"


def _keys(n: int) -> list[str]:
    """``n`` keys, one of every four ending in zero bytes (NumPy's ``S20`` drops trailing NULs)."""
    return [f"{i:08x}" + "0" * 32 if i % 4 == 0 else hashlib.sha1(str(i).encode()).hexdigest() for i in range(n)]


def _arrays(n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    shapes = [(16, 40), (8, 3), (1, 97), (128, 9)]
    return {k: rng.standard_normal(shapes[i % 4]).astype(np.float64 if i == 5 else np.float32)
            for i, k in enumerate(_keys(n))}


def _counting(store: FeatureStore) -> dict[str, list[str]]:
    """The GetObject requests of ``store``'s S3 client from now on (object keys, by kind)."""
    assert isinstance(store.storage, CachedStorage)
    seen: dict[str, list[str]] = {"pack": [], "index": [], "array": []}

    def count(params: dict, **_: object) -> None:
        key = params["Key"]
        seen["pack" if key.endswith(".pack") else "index" if key.endswith(".json") else "array"].append(key)

    store.storage.remote._s3.meta.events.register("before-parameter-build.s3.GetObject", count)  # type: ignore[attr-defined]
    return seen


def _written(tmp_path: Path, s3: S3Endpoint, n: int) -> tuple[FeatureStore, dict[str, np.ndarray]]:
    writer = FeatureStore.open(tmp_path / "unused", remote=s3.spec(prefix=PREFIX), cache_bytes=0)
    arrays = _arrays(n)
    for key, array in arrays.items():
        writer.put(key, array)
    return writer, arrays


def test_packed_keys_read_through_a_cold_cache_equal_their_objects(tmp_path: Path, s3_endpoint: S3Endpoint) -> None:
    writer, arrays = _written(tmp_path, s3_endpoint, 24)
    keys = list(arrays)
    size = len(writer.origin.get_bytes(writer.relpath(keys[0])))  # a (16, 40) float32 array's .npy
    done = pack(writer, [*keys, "f" * 40], pack_bytes=5 * size)
    assert (done.arrays, done.already, done.missing, done.unsound) == (24, 0, 1, 0) and done.packs >= 4
    names = list_packs(writer.origin)
    assert len(names) == done.packs
    objects = s3_endpoint.objects()
    assert all(f"{PREFIX}/{PACKS}/{n}.pack" in objects and f"{PREFIX}/{PACKS}/{n}.json" in objects for n in names)
    again = pack(writer, keys, pack_bytes=5 * size)  # content-addressed, idempotent
    assert (again.packs, again.already) == (0, 24) and list_packs(writer.origin) == names
    extra = "e" * 40  # stored after packing: read alone
    writer.put(extra, np.arange(6, dtype=np.float32))

    reader = FeatureStore.open(tmp_path / "cache", remote=s3_endpoint.spec(prefix=PREFIX), cache_bytes=1 << 30)
    gets = _counting(reader)
    order = [*keys, extra]
    random.Random(1).shuffle(order)
    for key in order:
        got, mapped, alone = reader.get(key), reader.get(key, mmap=True), writer.get(key)
        assert got.dtype == alone.dtype and got.shape == alone.shape and np.array_equal(got, alone), key
        assert np.array_equal(mapped, alone) and not mapped.flags.writeable and got.flags.writeable
    assert reader.packs is not None and reader.packs.fetched == len(names)
    assert sorted(gets["pack"]) == sorted(f"{PREFIX}/{PACKS}/{n}.pack" for n in names)  # one request per pack
    assert len(gets["index"]) == len(names) and gets["array"] == [f"{PREFIX}/{writer.relpath(extra)}"]
    reader.packs.wait()  # written into the cache by a thread
    cached = {p.relative_to(tmp_path / "cache" / "objects").as_posix() for p in (tmp_path / "cache").rglob("*.*")
              if "objects" in p.parts}
    assert cached - {"labswarm-store.json"} == {f"{PACKS}/{n}.pack" for n in names} | {writer.relpath(extra)}
    assert all(reader.cached(k) for k in order)
    for path in (tmp_path / "cache").rglob("*.pack"):  # evicted by another process: this one fetches it again
        path.unlink()
    assert np.array_equal(reader.get(keys[0]), arrays[keys[0]]) and reader.packs.fetched == len(names) + 1

    earlier = FeatureStore.open(tmp_path / "cache3", remote=s3_endpoint.spec(prefix=PREFIX), cache_bytes=1 << 30)
    assert isinstance(earlier.storage, CachedStorage) and earlier.storage.warm(earlier.relpath(keys[1]))
    assert np.array_equal(earlier.get(keys[1]), arrays[keys[1]])  # cached alone before the packs: no pack fetched
    assert earlier.packs is not None and earlier.packs.fetched == 0 and earlier.fetch(keys[1:2]) == 0

    chunked = FeatureStore.open(tmp_path / "cache2", remote=s3_endpoint.spec(prefix=PREFIX), cache_bytes=1 << 30)
    gets = _counting(chunked)
    chunk = order[:10]  # a streaming learner's chunk: its packs fetched at once, then read locally
    packs_of_chunk = {chunked.packs.pack_of(k) for k in chunk if k != extra}  # type: ignore[union-attr]
    assert chunked.fetch(chunk) == len(packs_of_chunk) + (extra in chunk)
    before = sum(len(v) for v in gets.values())
    assert all(np.array_equal(chunked.get(k, mmap=True), arrays.get(k, writer.get(extra))) for k in chunk)
    assert sum(len(v) for v in gets.values()) == before


def test_a_damaged_pack_is_detected_and_its_arrays_read_alone(tmp_path: Path, s3_endpoint: S3Endpoint) -> None:
    writer, arrays = _written(tmp_path, s3_endpoint, 8)
    keys = list(arrays)
    pack(writer, keys[:4])
    pack(writer, keys[4:])
    damaged, garbage = sorted(list_packs(writer.origin))
    rel = f"{PACKS}/{damaged}.pack"
    blob = bytearray(writer.origin.get_bytes(rel))
    blob[-5] ^= 0xFF  # one bit flipped in the last array's data
    writer.origin.put_bytes(rel, bytes(blob))
    writer.origin.put_bytes(f"{PACKS}/{garbage}.pack", b"not a pack at all")
    found = verify(writer)
    assert found.checked == 8 and found.packs == 2
    assert set(found.problems) == {f"pack {damaged}", f"pack {garbage}"}, found.problems
    assert "CRC-32C mismatch" in found.problems[f"pack {damaged}"]
    assert "not a pack" in found.problems[f"pack {garbage}"]
    reader = FeatureStore.open(tmp_path / "cache", remote=s3_endpoint.spec(prefix=PREFIX), cache_bytes=1 << 30)
    gets = _counting(reader)
    for key in keys:  # every array still reads right: from its own object
        assert np.array_equal(reader.get(key), arrays[key])
    assert reader.packs is not None and reader.packs.fetched == 0 and len(gets["pack"]) == 2  # one try each
    assert len(gets["array"]) == 8 and not list((tmp_path / "cache").rglob("*.pack"))


def test_gc_du_and_the_cache_bound_know_packs(tmp_path: Path, s3_endpoint: S3Endpoint) -> None:
    writer, arrays = _written(tmp_path, s3_endpoint, 8)
    keys = sorted(arrays)
    pack(writer, keys[:4])
    pack(writer, keys[4:])
    packs = list_packs(writer.origin)
    total = sum(size for size, _index in packs.values())
    usage = pack_usage(writer.origin)
    assert (usage.packs, usage.arrays, usage.bytes) == (2, 8, total)
    row = disk_usage(writer.sizes(), {"exp": {"mel": keys}}, usage)[-1]
    assert (row.experiment, row.feature, row.arrays, row.bytes) == ("(packs)", "2 packs", 8, total)

    kept = {"exp": {"mel": keys[:5] + keys[6:]}}  # keys[5] no longer referenced: its pack goes with it
    dry = collect_garbage(writer, kept, dry_run=True)
    assert (dry.arrays, dry.packs) == (1, 1) and len(list_packs(writer.origin)) == 2
    done = collect_garbage(writer, kept)
    assert (done.arrays, done.packs, done.kept) == (1, 1, 7)
    (left,) = list_packs(writer.origin)
    assert [e.startswith(f"{PREFIX}/{PACKS}/{left}.") for e in s3_endpoint.objects() if "/packs/" in e] == [True] * 2
    reader = FeatureStore.open(tmp_path / "cache", remote=s3_endpoint.spec(prefix=PREFIX), cache_bytes=1 << 30)
    for key in keys[:5] + keys[6:]:  # packed or read alone
        assert np.array_equal(reader.get(key), arrays[key])

    small = FeatureStore.open(tmp_path / "small", remote=s3_endpoint.spec(prefix=PREFIX),
                              cache_bytes=packs[left][0] - 1)  # the packs do not fit: every array read alone
    cache = small.storage
    assert isinstance(cache, CachedStorage)
    for key in keys[:4]:
        assert np.array_equal(small.get(key), arrays[key]) and cache.usage() <= cache.max_bytes
    assert small.packs is not None and small.packs.fetched == 0
    fits = FeatureStore.open(tmp_path / "fits", remote=s3_endpoint.spec(prefix=PREFIX),
                             cache_bytes=packs[left][0] + 200)  # the pack fits; an array read alone evicts
    cache = fits.storage
    assert isinstance(cache, CachedStorage)
    for key in [*keys[:4], keys[6], keys[7], *keys[:2]]:
        assert np.array_equal(fits.get(key), arrays[key]) and cache.usage() <= cache.max_bytes
    assert cache.insert([("a/b", b"x" * 100), ("a/c", b"y" * cache.max_bytes)]) == 1  # the rest would not fit
    assert cache.usage() <= cache.max_bytes


def test_a_removed_or_uncachable_pack_is_fetched_once(tmp_path: Path, s3_endpoint: S3Endpoint) -> None:
    writer, arrays = _written(tmp_path, s3_endpoint, 12)
    keys = list(arrays)
    for start in (0, 4, 8):
        pack(writer, keys[start:start + 4])
    reader = FeatureStore.open(tmp_path / "cache", remote=s3_endpoint.spec(prefix=PREFIX), cache_bytes=1 << 30)
    assert np.array_equal(reader.get(keys[0]), arrays[keys[0]]) and reader.packs is not None
    removed = reader.packs.pack_of(keys[4])
    kept = [k for k in keys if k != keys[5]]
    assert collect_garbage(writer, {"exp": {"mel": kept}}).packs == 1  # under the reader, which still lists it
    assert pack(writer, [keys[4], keys[6], keys[7]]).packs == 1  # packed again: a new name
    (new,) = set(list_packs(writer.origin)) - {reader.packs.pack_of(keys[0]), reader.packs.pack_of(keys[8])}
    gets = _counting(reader)
    for key in (keys[4], keys[6], keys[7], keys[4]):
        assert np.array_equal(reader.get(key), arrays[key])
    assert gets["pack"] == [f"{PREFIX}/{PACKS}/{removed}.pack", f"{PREFIX}/{PACKS}/{new}.pack"], gets
    assert gets["index"] == [f"{PREFIX}/{PACKS}/{new}.json"]
    assert gets["array"] == [f"{PREFIX}/{writer.relpath(keys[4])}"]  # the one that found its pack removed

    # a pack the cache cannot take (a file-size limit: EFBIG, as a full disk's ENOSPC) is fetched once, and its
    # arrays read alone meanwhile rather than fetching it again for each
    full = FeatureStore.open(tmp_path / "full", remote=s3_endpoint.spec(prefix=PREFIX), cache_bytes=1 << 30)
    assert full.packs is not None
    size = max(len(writer.origin.get_bytes(writer.relpath(k))) for k in keys[8:])
    assert list_packs(writer.origin)[full.packs.pack_of(keys[8]) or ""][0] > size + 512
    gets = _counting(full)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 512, hard))
    try:
        assert np.array_equal(full.get(keys[8]), arrays[keys[8]])  # from the fetched pack's bytes
        full.packs.wait()  # its write into the cache failed
        for key in keys[8:]:
            assert np.array_equal(full.get(key), arrays[key])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    assert len(gets["pack"]) == 1 and full.packs.fetched == 1 and len(gets["array"]) == 4, gets
    assert not list((tmp_path / "full").rglob("*.pack"))


def test_a_child_forked_while_a_thread_holds_the_readers_lock_reads(tmp_path: Path, s3_endpoint: S3Endpoint) -> None:
    writer, arrays = _written(tmp_path, s3_endpoint, 8)
    keys = list(arrays)
    pack(writer, keys[:4])
    pack(writer, keys[4:])
    reader = FeatureStore.open(tmp_path / "cache", remote=s3_endpoint.spec(prefix=PREFIX), cache_bytes=1 << 30)
    packs = reader.packs
    assert packs is not None and np.array_equal(reader.get(keys[0]), arrays[keys[0]])
    held, release = threading.Event(), threading.Event()

    def hold() -> None:  # as the writer thread does a moment after each pack it writes
        with packs._guard:
            held.set()
            release.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(60)
    pid = os.fork()
    if pid == 0:  # the child: reads a key of the pack not fetched yet, and one of the fetched one
        code = 1
        try:
            code = 0 if all(np.array_equal(reader.get(k), arrays[k]) for k in (keys[5], keys[1])) else 3
            packs.wait()
        finally:
            os._exit(code)
    release.set()
    holder.join()
    deadline = time.monotonic() + 120  # a blocked child never ends: this bounds the failure, not the pass
    while (done := os.waitpid(pid, os.WNOHANG)) == (0, 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    if done == (0, 0):
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert done != (0, 0), "the forked child blocked on a lock the parent's thread held at the fork"
    assert os.waitstatus_to_exitcode(done[1]) == 0
    assert packs.fetched == 1  # the parent's own fetch; the child's were its own


def test_a_cached_pack_cut_off_by_a_crash_is_fetched_again(tmp_path: Path, s3_endpoint: S3Endpoint) -> None:
    writer, arrays = _written(tmp_path, s3_endpoint, 8)
    keys = list(arrays)
    pack(writer, keys)
    (name,) = packs = list_packs(writer.origin)
    first = FeatureStore.open(tmp_path / "cache", remote=s3_endpoint.spec(prefix=PREFIX), cache_bytes=1 << 30)
    assert np.array_equal(first.get(keys[0]), arrays[keys[0]]) and first.packs is not None
    first.packs.wait()
    (path,) = (tmp_path / "cache").rglob("*.pack")

    def crash() -> None:  # the pack renamed into place, its last bytes never written (a host crash)
        with open(path, "r+b") as handle:
            handle.truncate(packs[name][0] // 2)

    crash()
    later = FeatureStore.open(tmp_path / "cache", remote=s3_endpoint.spec(prefix=PREFIX), cache_bytes=1 << 30)
    for reader, mmap in ((later, True), (first, False)):  # a process started after the crash, one from before
        gets = _counting(reader)
        for key in reversed(keys):  # the last arrays first: those cut off
            assert np.array_equal(reader.get(key, mmap=mmap), arrays[key]), key
        assert len(gets["pack"]) == 1 and len(gets["array"]) <= 1, gets  # fetched again; the first read alone
        assert reader.packs is not None
        reader.packs.wait()
        assert path.stat().st_size == packs[name][0]  # whole again
        crash()


def test_gc_keeps_a_pack_made_while_it_runs(tmp_path: Path, s3_endpoint: S3Endpoint) -> None:
    writer, arrays = _written(tmp_path, s3_endpoint, 8)
    keys = list(arrays)
    pack(writer, keys[:4])  # holds keys[3], which gc removes
    pack(writer, keys[4:])
    before = set(list_packs(writer.origin))
    other = FeatureStore.open(tmp_path / "other", remote=s3_endpoint.spec(prefix=PREFIX), cache_bytes=0)
    late = "d" * 40
    made: list[set[str]] = []

    def meanwhile(**_: object) -> None:  # after gc listed the entries: a worker writes an array, which is packed
        if not made:
            other.put(late, np.ones(5, np.float32))
            assert pack(other, [late]).packs == 1
            made.append(set(list_packs(other.origin)) - before)

    writer.storage._s3.meta.events.register("before-parameter-build.s3.DeleteObjects", meanwhile)  # type: ignore[attr-defined]
    done = collect_garbage(writer, {"exp": {"mel": keys[:3] + keys[4:] + [late]}})
    (new,) = made[0]
    (removed,) = before - set(list_packs(writer.origin))
    assert (done.arrays, done.packs) == (1, 1) and set(list_packs(writer.origin)) == before - {removed} | {new}
    assert other.contains(late) and not writer.contains(keys[3])
    writer.delete(keys[6])  # by hand, or a gc stopped before its packs went: that pack is removed next time
    again = collect_garbage(writer, {"exp": {"mel": [*keys, late]}})
    assert (again.arrays, again.packs) == (0, 1) and set(list_packs(writer.origin)) == {new}
