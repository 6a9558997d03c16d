"""FeatureStore.fetch: a remote store's entries brought into its local cache by parallel requests (a streaming
learner's chunk on a cold cache), on s3 (moto's server); a local store and an uncached one are left alone."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
from jobs.conftest import S3Endpoint

from labswarm.storage.cache import CachedStorage
from labswarm.store import FeatureStore


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
