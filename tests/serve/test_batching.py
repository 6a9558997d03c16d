"""Shared forward passes (labswarm/serve/batching.py) and the bounded model cache (labswarm/serve/cache.py), with
real threads and arrays."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from labswarm.serve.batching import BatchedModel
from labswarm.serve.cache import ModelCache, Served


class _Gated:
    """A forward pass (row sums as a 1-class "softmax") that records its batches and holds its first pass until
    released, so that what arrives meanwhile is queued."""

    def __init__(self) -> None:
        self.batches: list[int] = []
        self.release = threading.Event()
        self.entered = threading.Event()

    def __call__(self, x: np.ndarray) -> np.ndarray:
        self.entered.set()
        self.release.wait(30)
        self.batches.append(len(x))
        return x.reshape(len(x), -1).sum(1, keepdims=True).astype(np.float64)


def test_requests_queued_during_a_pass_share_the_next_one_and_get_their_own_rows() -> None:
    forward = _Gated()
    model = BatchedModel(forward, max_batch=64)
    first = model.submit(np.ones((2, 3, 4), np.float32))
    assert forward.entered.wait(30)
    queued = [model.submit(np.full((n, 3, 4), n, np.float32)) for n in (1, 3, 2)]
    other_shape = model.submit(np.ones((1, 3, 5), np.float32))
    forward.release.set()
    assert first.result(30).ravel().tolist() == [12.0, 12.0]
    for n, done in zip((1, 3, 2), queued, strict=True):
        assert done.result(30).ravel().tolist() == [12.0 * n] * n
    assert other_shape.result(30).ravel().tolist() == [15.0]
    assert forward.batches == [2, 6, 1]  # the three same-shaped arrays in one pass, the other shape alone
    assert (model.passes, model.rows) == (3, 9)
    model.close()


def test_max_batch_splits_the_queue_and_an_error_reaches_its_batch_only() -> None:
    forward = _Gated()
    model = BatchedModel(forward, max_batch=4)
    model.submit(np.ones((1, 2), np.float32))
    assert forward.entered.wait(30)
    later = [model.submit(np.ones((2, 2), np.float32)) for _ in range(3)]
    forward.release.set()
    assert all(d.result(30).shape == (2, 1) for d in later)
    assert forward.batches == [1, 4, 2]

    def broken(x: np.ndarray) -> np.ndarray:
        raise RuntimeError(f"shape {x.shape}")

    failing = BatchedModel(broken)
    with pytest.raises(RuntimeError, match="shape"):
        failing.submit(np.ones((1, 2), np.float32)).result(30)
    failing.close()
    model.close()
    assert model.submit(np.ones((1, 2), np.float32)).result(30).shape == (1, 1)  # closed: runs in the caller


def test_the_cache_loads_a_model_once_for_concurrent_callers_and_closes_the_least_recently_used() -> None:
    loading = threading.Event()
    started: list[str] = []

    def load(key: str) -> Served:
        started.append(key)
        if key == "a":
            loading.wait(30)
        return Served(predictor=None, batched=BatchedModel(lambda x: x.astype(np.float64), name=key))  # type: ignore[arg-type]

    cache = ModelCache(2, load)
    with ThreadPoolExecutor(8) as pool:
        waiting = [pool.submit(cache.get, "a") for _ in range(8)]
        loading.set()
        got = {id(w.result(30)) for w in waiting}
    assert len(got) == 1 and started == ["a"] and cache.loads == 1
    a = cache.get("a")
    cache.get("b")
    cache.get("a")  # a is now the most recently used
    cache.get("c")  # b goes
    assert cache.keys() == ["a", "c"] and started == ["a", "b", "c"]
    cache.get("b")  # loaded again; a goes
    assert cache.keys() == ["c", "b"] and started == ["a", "b", "c", "b"]
    assert a.batched._closed and not cache.get("c").batched._closed

    def bad(key: str) -> Served:
        raise FileNotFoundError(key)

    failing = ModelCache(1, bad)
    for _ in range(2):  # a failed load is not cached: the next call tries again
        with pytest.raises(FileNotFoundError):
            failing.get("x")
    assert failing.loads == 2 and failing.keys() == []
    cache.close()
