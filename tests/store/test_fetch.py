"""FeatureStore.fetch: a remote store's entries brought into its local cache by parallel requests (a streaming
learner's chunk on a cold cache), on s3 (moto's server); a local store and an uncached one are left alone."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
from jobs.conftest import S3Endpoint

from labswarm.storage.cache import CachedStorage
from labswarm.store import FeatureStore
from labswarm.store.packer import pack
from labswarm.store.packs import REQUEST_BYTES, list_packs
from labswarm.store.store import FETCH_THREADS


def test_fetch_fills_a_cold_cache_with_parallel_requests(tmp_path: Path, s3_endpoint: S3Endpoint) -> None:
    spec = s3_endpoint.spec(prefix="features")
    writer = FeatureStore.open(tmp_path / "unused", remote=spec, cache_bytes=0)
    arrays = {f"{i:040x}": np.full((4, 6), i, dtype=np.float32) for i in range(12)}
    for key, array in arrays.items():
        writer.put(key, array)
    store = FeatureStore.open(tmp_path / "cache", remote=spec, cache_bytes=1 << 20)
    cache = store.storage
    assert isinstance(cache, CachedStorage)
    threads: set[str] = set()
    gets = {"n": 0}
    spans: list[list[float]] = []  # per GET: [start, end] in time.monotonic() s
    current = threading.local()  # the GET its thread has open
    second = threading.Event()

    def seen(**_: object) -> None:
        threads.add(threading.current_thread().name)
        gets["n"] += 1
        current.span = [time.monotonic()]
        spans.append(current.span)
        if gets["n"] >= 2:
            second.set()
        second.wait(10)  # the first GET stays open until a second one starts: they overlap only if parallel

    def answered(**_: object) -> None:
        current.span.append(time.monotonic())

    events = cache.remote._s3.meta.events  # type: ignore[attr-defined]
    events.register("before-call.s3.GetObject", seen)
    events.register("after-call.s3.GetObject", answered)
    keys = sorted(arrays)
    assert store.fetch(keys[:8]) == 8 and gets["n"] == 8
    assert len(threads) > 1 and all(t.startswith("store-fetch") for t in threads), threads
    assert any(a[0] < b[0] < a[1] for a in spans for b in spans), spans  # two GETs at once
    assert all(cache.cached_path(store.relpath(k)).is_file() for k in keys[:8])
    for key in keys[:8]:  # read from the cache: no request
        assert np.array_equal(store.get(key, mmap=True), arrays[key])
    assert gets["n"] == 8
    assert store.fetch([*keys[:8], keys[8]]) == 0  # one missing entry: left to its read
    assert store.fetch([keys[9], keys[10], "f" * 40]) == 3 and gets["n"] == 11  # a missing key: no error here
    assert np.array_equal(store.get(keys[10]), arrays[keys[10]])
    assert FeatureStore(tmp_path / "local").fetch(keys) == 0 and writer.fetch(keys) == 0


def test_fetch_holds_no_more_than_its_read_bytes(tmp_path: Path, s3_endpoint: S3Endpoint) -> None:
    """A cold fill of packed arrays holds each pack whole until it is written into the cache: its peak of bytes held
    (tracemalloc in a process of its own: the packs' bytes, the client's buffers) stays within read_bytes(threads),
    and fetch_threads fits the threads to a bound (a learner's memory limit, train/distributed/data.py)."""
    spec = s3_endpoint.spec(prefix="features")
    writer = FeatureStore.open(tmp_path / "unused", remote=spec, cache_bytes=0)
    rng = np.random.default_rng(0)
    keys = [f"{i:040x}" for i in range(48)]
    for key in keys:
        writer.put(key, rng.standard_normal((32, 1024)).astype(np.float32))  # 128 KiB
    array = len(writer.origin.get_bytes(writer.relpath(keys[0])))
    assert pack(writer, keys, pack_bytes=4 * array).packs == 12

    def reader(name: str) -> FeatureStore:
        store = FeatureStore.open(tmp_path / name, remote=spec, cache_bytes=1 << 30)
        assert store.packs is not None
        store.packs.catalogue()  # listed before the measure: a learner lists its store when it starts
        return store

    def peak(name: str, threads: int) -> int:
        """Peak bytes held by a cold fetch of every key into the cache ``name`` with ``threads`` threads, measured in
        a process of its own (fetch_peak.py): tracemalloc there sees the fetch's threads only, not the other
        threads of this pytest process (an idle pool, a reporter, a server of another test)."""
        args = {"root": str(tmp_path / name), "spec": spec, "keys": keys, "threads": threads, "packs": 12}
        done = subprocess.run([sys.executable, str(Path(__file__).with_name("fetch_peak.py")), json.dumps(args)],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-4000:]
        return int(json.loads(done.stdout.strip().splitlines()[-1])["peak"])

    store = reader("cache")
    largest = max(size for size, _index in list_packs(store.origin).values())
    assert store.read_bytes(1) == 3 * largest + array + REQUEST_BYTES  # (2 threads + PENDING - 1) packs
    assert store.read_bytes(2, 10) == 5 * largest + 2 * (array + REQUEST_BYTES) + 2 * 10
    bound = store.read_bytes(2)
    assert store.fetch_threads(bound) == 2 and store.fetch_threads(bound - 1) == 1
    assert store.fetch_threads(1) == 1 and store.fetch_threads(1 << 40) == FETCH_THREADS
    held = peak("cache", store.fetch_threads(bound))
    assert 4 * largest < held <= bound, (held, bound)  # the packs are seen, within the bound
    assert all(store.cached(k) for k in keys)
    assert all(np.array_equal(store.get(k, mmap=True), writer.get(k)) for k in keys[::7])
    held = peak("cache2", FETCH_THREADS)  # more threads, more held: the bound is what limits it
    assert held > 10 * largest > bound, (held, bound)
    assert FeatureStore(tmp_path / "local").read_bytes(8, 10) == 0 and writer.read_bytes(8, 10) == 10
