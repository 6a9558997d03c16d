"""Written packs of a remote feature store (labswarm/store/written.py) on s3 (moto's server on :9000): a message's
arrays written as one pack are read back equal by another process and through a cold cache, and listed as per-key
arrays; an uncached read of one array gets its bytes alone (a ranged GET), a cache the whole pack; gc rewrites a pack
holding unreferenced arrays, its referenced ones readable throughout (by readers that listed the packs before, with a
cache or without, and by the pack's writer)."""

from __future__ import annotations

import multiprocessing
import threading
from pathlib import Path

import numpy as np
import pytest
from jobs.conftest import S3Endpoint

from labswarm.errors import StoreError
from labswarm.storage.cache import CachedStorage
from labswarm.store import FeatureStore
from labswarm.store.listing import KeyListing
from labswarm.store.ops import collect_garbage, verify
from labswarm.store.packer import pack
from labswarm.store.packfmt import MAGIC, encode, unpack
from labswarm.store.packs import list_packs
from labswarm.store.written import WRITTEN

PREFIX = "features"


def _message(seed: int, samples: int = 4) -> dict[str, np.ndarray]:
    """A message's arrays: per sample a mel-like and an MFCC-like array, under random keys."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for _ in range(samples):
        arrays[rng.bytes(20).hex()] = rng.standard_normal((64, 43)).astype(np.float32)
        arrays[rng.bytes(20).hex()] = rng.standard_normal((13, 43)).astype(np.float32)
    return arrays


def _write(store: FeatureStore, arrays: dict[str, np.ndarray]) -> list[str]:
    """``arrays`` put in one batch, as a worker's message; the keys reported stored by the batch's end."""
    stored: list[str] = []
    with store.batch():
        for key, array in arrays.items():
            store.put(key, array, stored=stored.append)
        assert stored == []  # nothing is stored before the batch's end: its pack goes out then
    return stored


def _read_in_child(spec: dict, keys: list[str], out: multiprocessing.Queue) -> None:
    store = FeatureStore.open("/nonexistent-unused", remote=spec, cache_bytes=0)
    out.put({key: store.get(key) for key in keys})


def test_a_message_is_one_pack_read_back_equal_elsewhere_and_listed_as_arrays(tmp_path: Path,
                                                                               s3_endpoint: S3Endpoint) -> None:
    spec = s3_endpoint.spec(prefix=PREFIX)
    writer = FeatureStore.open(tmp_path / "unused", remote=spec, cache_bytes=0, packed=True)
    arrays = _message(0)
    assert sorted(_write(writer, arrays)) == sorted(arrays)
    objects = [o for o in s3_endpoint.objects() if o != f"{PREFIX}/labswarm-store.json"]
    assert len(objects) == 2 and {o.rsplit(".", 1)[1] for o in objects} == {"pack", "json"}, objects  # 2 requests
    # another process, a fresh store
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=_read_in_child, args=(spec, list(arrays), out))
    child.start()
    got = out.get(timeout=120)
    child.join(60)
    assert child.exitcode == 0
    for key, array in arrays.items():
        np.testing.assert_array_equal(got[key], array)
    # a cold cache smaller than the packs (a written pack is read whatever the bound: its arrays are nowhere else)
    reader = FeatureStore.open(tmp_path / "cold", remote=spec, cache_bytes=1)
    for key, array in arrays.items():
        np.testing.assert_array_equal(reader.get(key, mmap=True), array)
    more = _message(5)
    _write(writer, more)
    cached = FeatureStore.open(tmp_path / "cache", remote=spec, cache_bytes=1 << 30)
    chunk = [*arrays, *more]  # a learner's chunk: one request per pack
    assert cached.fetch(chunk) == 2 and all(cached.cached(k) for k in chunk)
    assert isinstance(cached.storage, CachedStorage) and cached.written is not None
    assert cached.written.reader is not None and cached.written.reader.fetched == 2
    for key, array in {**arrays, **more}.items():
        np.testing.assert_array_equal(cached.get(key, mmap=True), array)
    # listed as arrays: contains, sizes, a worker's shard listings, verify
    fresh = FeatureStore.open(tmp_path / "unused", remote=spec, cache_bytes=0, packed=False)
    assert all(fresh.contains(k) for k in chunk) and not fresh.contains("0" * 40)
    sizes = fresh.sizes()
    assert sorted(sizes) == sorted(chunk) and all(sizes[k] > a.nbytes for k, a in {**arrays, **more}.items())
    listing = KeyListing(fresh, page=0)  # shards only, as a worker of a large store lists
    assert all(listing.contains(k) for k in chunk) and not listing.contains("1" * 40)
    assert all(KeyListing(fresh).contains(k) for k in chunk)  # a small store: one page and the packs
    found = verify(fresh)
    assert found.problems == {} and found.checked == len(chunk) and found.packs == 2


def test_an_uncached_read_gets_the_arrays_bytes_alone_and_a_cache_its_whole_pack(tmp_path: Path,
                                                                                 s3_endpoint: S3Endpoint) -> None:
    spec = s3_endpoint.spec(prefix=PREFIX)
    arrays = _message(7)  # 8 arrays, one pack
    _write(FeatureStore.open(tmp_path / "w", remote=spec, cache_bytes=0, packed=True), arrays)
    [pack_key] = [o for o in s3_endpoint.objects() if o.endswith(".pack")]
    pack_bytes = s3_endpoint.client.head_object(Bucket=s3_endpoint.bucket, Key=pack_key)["ContentLength"]
    key, small = next(iter(arrays)), list(arrays)[1]
    for cache_bytes in (0, 1 << 30):
        reader = FeatureStore.open(tmp_path / f"r{cache_bytes}", remote=spec, cache_bytes=cache_bytes)
        assert reader.contains(key) and reader.written is not None  # the packs listed, their indexes read
        found = reader.written.find(key)
        assert found is not None
        got: list[int] = []  # the bytes of each GET's body, as the server sent them
        reader.origin._s3.meta.events.register(  # this client's hooks only
            "after-call.s3.GetObject", lambda parsed, got=got, **_: got.append(parsed["ContentLength"]))
        np.testing.assert_array_equal(reader.get(key), arrays[key])
        if cache_bytes:  # the cache's fill: the whole pack, once, its other arrays read from it
            np.testing.assert_array_equal(reader.get(small, mmap=True), arrays[small])
            assert got == [pack_bytes]
        else:  # one GET of the array's .npy bytes alone (~11 kB of a ~55-kB pack)
            assert got == [found.length] and found.length == arrays[key].nbytes + 128 < pack_bytes / 4
            np.testing.assert_array_equal(reader.get(small, mmap=True), arrays[small])
            assert got[1:] == [arrays[small].nbytes + 128]
    blob = bytearray(s3_endpoint.client.get_object(Bucket=s3_endpoint.bucket, Key=pack_key)["Body"].read())
    blob[found.start + found.offset + found.length - 1] ^= 0xFF  # the array's last byte damaged
    s3_endpoint.client.put_object(Bucket=s3_endpoint.bucket, Key=pack_key, Body=bytes(blob))
    with pytest.raises(StoreError, match="CRC-32C mismatch"):
        FeatureStore.open(tmp_path / "r2", remote=spec, cache_bytes=0).get(key)


def test_a_packed_key_cached_alone_is_read_from_its_file_without_a_request(tmp_path: Path,
                                                                           s3_endpoint: S3Endpoint) -> None:
    """A store whose processes write both layouts (LABSWARM_STORE_WRITE_PACKS set differently): a key cached alone
    before a written pack of it appeared is read from its cached file, not from the pack (review #5)."""
    spec = s3_endpoint.spec(prefix=PREFIX)
    arrays = _message(9, samples=1)
    key = next(iter(arrays))
    FeatureStore.open(tmp_path / "w1", remote=spec, cache_bytes=0, packed=False).put(key, arrays[key])
    reader = FeatureStore.open(tmp_path / "r", remote=spec, cache_bytes=1 << 30)
    np.testing.assert_array_equal(reader.get(key), arrays[key])  # cached alone
    _write(FeatureStore.open(tmp_path / "w2", remote=spec, cache_bytes=0, packed=True), arrays)
    assert reader.written is not None and reader.written.find(key, fresh_s=0) is not None  # listed: in a pack now
    got: list[str] = []
    reader.origin._s3.meta.events.register("before-call.s3", lambda model, **_: got.append(model.name))
    for mmap in (False, True):
        np.testing.assert_array_equal(reader.get(key, mmap=mmap), arrays[key])
    # neither the pack, nor its range, nor the object: the cached file (a listing, once 60 s passed, may come)
    assert [name for name in got if name != "ListObjectsV2"] == []


def test_gc_rewrites_a_pack_of_kept_and_removed_arrays_and_removes_one_of_removed_only(
        tmp_path: Path, s3_endpoint: S3Endpoint) -> None:
    spec = s3_endpoint.spec(prefix=PREFIX)
    store = FeatureStore.open(tmp_path / "unused", remote=spec, cache_bytes=0, packed=True)
    mixed, dead, alone = _message(2), _message(3, samples=1), _message(4, samples=1)
    _write(store, mixed)
    _write(store, dead)
    store2 = FeatureStore.open(tmp_path / "unused", remote=spec, cache_bytes=0, packed=False)
    for key, array in alone.items():  # the per-key layout beside the packs
        store2.put(key, array)
    kept = dict(list(mixed.items())[:3])
    references = {"exp": {"mel": list(kept), "mfcc": list(alone)}}
    reader = FeatureStore.open(tmp_path / "cache", remote=spec, cache_bytes=1 << 30)
    np.testing.assert_array_equal(reader.get(next(iter(kept))), next(iter(kept.values())))  # packs listed now
    uncached = FeatureStore.open(tmp_path / "unused", remote=spec, cache_bytes=0)
    np.testing.assert_array_equal(uncached.get(next(iter(dead))), next(iter(dead.values())))  # listed, no cache
    before = s3_endpoint.objects()
    dry = collect_garbage(store, references, dry_run=True)
    assert dry.arrays == len(mixed) - 3 + len(dead) and dry.kept == 3 + len(alone)
    assert s3_endpoint.objects() == before
    done = collect_garbage(FeatureStore.open(tmp_path / "gc", remote=spec, cache_bytes=0), references)
    assert (done.arrays, done.kept, done.rewritten) == (dry.arrays, dry.kept, dry.rewritten) and dry.rewritten == 1
    fresh = FeatureStore.open(tmp_path / "unused", remote=spec, cache_bytes=0)
    assert sorted(fresh.sizes()) == sorted([*kept, *alone])
    assert len(list_packs(fresh.origin, WRITTEN)) == 1  # the rewritten one; the pack of removed arrays only gone
    for key, array in {**kept, **alone}.items():  # by a fresh store, and by those that listed the packs before gc:
        np.testing.assert_array_equal(fresh.get(key), array)  # through a cache, without one, and their writer
        np.testing.assert_array_equal(reader.get(key, mmap=True), array)
        np.testing.assert_array_equal(uncached.get(key), array)
        np.testing.assert_array_equal(store.get(key), array)
    assert not any(fresh.contains(k) for k in [*mixed.keys() - kept.keys(), *dead])
    assert verify(fresh).problems == {}


def test_store_pack_reads_each_written_pack_once_and_no_per_key_object_of_its_keys(
        tmp_path: Path, s3_endpoint: S3Endpoint) -> None:
    spec = s3_endpoint.spec(prefix=PREFIX)
    writer = FeatureStore.open(tmp_path / "unused", remote=spec, cache_bytes=0, packed=True)
    messages = [_message(10 + i, samples=2) for i in range(4)]
    for arrays in messages:
        _write(writer, arrays)
    alone = _message(20, samples=1)
    per_key = FeatureStore.open(tmp_path / "unused", remote=spec, cache_bytes=0, packed=False)
    for key, array in alone.items():
        per_key.put(key, array)
    keys = [k for arrays in messages for k in arrays] + list(alone) + ["2" * 40]  # the last one never computed
    store = FeatureStore.open(tmp_path / "unused", remote=spec, cache_bytes=0)
    got: list[str] = []
    origin = store.origin
    read = origin.get_bytes
    origin.get_bytes = lambda key: (got.append(key), read(key))[1]  # type: ignore[method-assign]
    done = pack(store, keys, threads=2)
    assert (done.arrays, done.missing, done.unsound) == (len(keys) - 1, 1, 0)
    per_key_gets = [k for k in got if k.startswith("v1/")]
    assert sorted(per_key_gets) == sorted(store.relpath(k) for k in [*alone, "2" * 40]), per_key_gets
    pack_gets = [k for k in got if k.startswith(f"{WRITTEN}/") and k.endswith(".pack")]
    assert len(pack_gets) == len(set(pack_gets)) == len(messages), pack_gets  # each written pack read once
    cached = FeatureStore.open(tmp_path / "cache", remote=spec, cache_bytes=1 << 30)
    for key, array in {k: a for arrays in [*messages, alone] for k, a in arrays.items()}.items():
        np.testing.assert_array_equal(cached.get(key), array)


def test_a_listing_keeps_a_key_an_upload_thread_writes_meanwhile(tmp_path: Path, s3_endpoint: S3Endpoint) -> None:
    spec = s3_endpoint.spec(prefix=PREFIX)
    store = FeatureStore.open(tmp_path / "unused", remote=spec, cache_bytes=0, packed=True)
    _write(store, _message(30, samples=1))
    written = store.written
    assert written is not None
    late = _message(31, samples=1)
    header = encode(list((k, b"x" * 8) for k in late))[1]  # its pack: as if PUT by an upload thread, not listed yet

    uploader = threading.Thread(target=written.added, args=("late", header))

    class Racing(dict):
        def items(self):  # the listing's look at this process's writes, then an upload thread's added()
            seen = list(super().items())
            uploader.start()
            uploader.join(1.0)  # done now, or waiting for the listing's lock (then it is done after it)
            return seen

    written._own = Racing(written._own)
    written.catalogue(reload=True)
    uploader.join(60)
    assert not uploader.is_alive()
    assert all(written.find(k) is not None for k in late)  # not lost: found before the next listing


def test_gc_counts_no_removal_from_a_pack_it_leaves_because_a_kept_array_is_damaged(
        tmp_path: Path, s3_endpoint: S3Endpoint) -> None:
    spec = s3_endpoint.spec(prefix=PREFIX)
    store = FeatureStore.open(tmp_path / "unused", remote=spec, cache_bytes=0, packed=True)
    arrays = _message(40, samples=2)
    _write(store, arrays)
    (name,) = list_packs(store.origin, WRITTEN)
    blob = bytearray(store.origin.get_bytes(f"{WRITTEN}/{name}.pack"))
    blob[-1] ^= 0xFF  # the last array's last byte: its CRC-32C no longer matches
    store.origin.put_bytes(f"{WRITTEN}/{name}.pack", bytes(blob))
    references = {"exp": {"mfcc": [list(arrays)[-1]]}}  # the damaged one kept, the others unreferenced
    dry = collect_garbage(store, references, dry_run=True)
    assert (dry.arrays, dry.kept, dry.rewritten) == (len(arrays) - 1, 1, 1)
    done = collect_garbage(store, references)
    assert (done.arrays, done.bytes, done.kept, done.rewritten) == (0, 0, 1, 0)  # left as it was, nothing removed
    assert list_packs(store.origin, WRITTEN).keys() == {name}


def test_a_missing_key_lists_the_written_packs_again_at_most_once_a_refresh(tmp_path: Path,
                                                                            s3_endpoint: S3Endpoint) -> None:
    spec = s3_endpoint.spec(prefix=PREFIX)
    reader = FeatureStore.open(tmp_path / "unused", remote=spec, cache_bytes=0)
    first = _message(50, samples=1)
    _write(FeatureStore.open(tmp_path / "unused", remote=spec, cache_bytes=0, packed=True), first)
    assert all(reader.contains(k) for k in first)  # listed now
    written = reader.written
    assert written is not None
    written._loaded -= 2.0  # the listing 2 s old: a learner asking about its samples, one a sample
    listed = written._loaded
    later = _message(51, samples=1)
    _write(FeatureStore.open(tmp_path / "unused", remote=spec, cache_bytes=0, packed=True), later)
    assert not any(reader.contains(k) for k in later) and written._loaded == listed  # not listed again per miss
    assert all(reader.contains(k, fresh_s=1.0) for k in later)  # a caller to whom it must not read missing
    assert written._loaded > listed


def test_a_pack_and_its_index_from_writers_of_two_versions_read_by_the_packs_own_header(
        tmp_path: Path, s3_endpoint: S3Endpoint) -> None:
    """A single-sample message redelivered during a rolling upgrade: an older writer's pack (its header without the
    nonce, 45 bytes shorter) beside a newer writer's index, or the other way round. Every array reads back, cached
    or not (the index's length locates nothing: the pack read whole, by its own header), and verify reports the
    pack (review #1)."""
    spec = s3_endpoint.spec(prefix=PREFIX)
    for case in ("older pack", "older index"):
        arrays = _message(60 if case == "older pack" else 61, samples=1)
        writer = FeatureStore.open(tmp_path / f"w{case}", remote=spec, cache_bytes=0, packed=True)
        before = set(list_packs(writer.origin, WRITTEN))
        _write(writer, arrays)
        (name,) = set(list_packs(writer.origin, WRITTEN)) - before
        blob = writer.origin.get_bytes(f"{WRITTEN}/{name}.pack")
        entries, good, _bad = unpack(blob)
        older_name, older_header, older = encode([(e.key, bytes(good[e.key])) for e in entries])  # no nonce
        assert older_name == name and len(older) == len(blob) - 45
        if case == "older pack":
            writer.origin.put_bytes(f"{WRITTEN}/{name}.pack", older)
        else:
            writer.origin.put_bytes(f"{WRITTEN}/{name}.json", older_header)
        for cache_bytes in (0, 1 << 30):
            reader = FeatureStore.open(tmp_path / f"r{case}{cache_bytes}", remote=spec, cache_bytes=cache_bytes)
            for mmap in (False, True):
                for key, array in arrays.items():
                    np.testing.assert_array_equal(reader.get(key, mmap=mmap), array)
        problems = verify(FeatureStore.open(tmp_path / "v", remote=spec, cache_bytes=0)).problems
        assert problems == {f"written pack {name}": "its header length differs from its index (readers locate "
                                                    "its arrays by the index)"}, problems
        writer.origin.put_bytes(f"{WRITTEN}/{name}.pack", blob)  # both of one writer: nothing to report
        header_end = len(MAGIC) + 4 + int.from_bytes(blob[len(MAGIC):len(MAGIC) + 4], "little")
        writer.origin.put_bytes(f"{WRITTEN}/{name}.json", blob[len(MAGIC) + 4:header_end])
        assert verify(FeatureStore.open(tmp_path / "v2", remote=spec, cache_bytes=0)).problems == {}
