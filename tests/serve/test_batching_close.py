"""Closing a batched model while requests submit to it (labswarm/serve/batching.py; reviewer's defect: a close
between submit's check and its put left the array behind the stop sentinel, its future never resolved; after a
close, submit ran the model in its caller's thread, the server's event loop). Real threads and an event loop."""

from __future__ import annotations

import asyncio
import queue
import threading
from concurrent.futures import Future

import numpy as np

from labswarm.serve import batching
from labswarm.serve.batching import BatchedModel


class _Recorder:
    """A forward pass (row sums) that records the threads it ran in."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []

    def __call__(self, x: np.ndarray) -> np.ndarray:
        self.threads.append(threading.current_thread())
        return x.reshape(len(x), -1).sum(1, keepdims=True).astype(np.float64)


class _CloseDuringPut(queue.SimpleQueue):
    """The batcher's queue whose next put first lets another thread close the model: the close lands between
    submit's check of the flag and its put (the race), unless submit holds a lock the close waits for."""

    def __init__(self) -> None:
        super().__init__()
        self.model: BatchedModel | None = None
        self.closer: threading.Thread | None = None

    def put(self, item, block: bool = True, timeout: float | None = None) -> None:  # type: ignore[override]
        if item is not None and self.closer is None and self.model is not None:
            self.closer = threading.Thread(target=self.model.close)
            self.closer.start()
            self.closer.join(1.0)  # done, or waiting for submit's lock: either way it had its chance
        super().put(item)


def test_a_close_during_submit_leaves_no_future_unresolved(monkeypatch) -> None:
    forward = _Recorder()
    with monkeypatch.context() as patch:  # the model's queue only
        patch.setattr(batching.queue, "SimpleQueue", _CloseDuringPut)
        model = BatchedModel(forward, name="race")
    racy = model._queue
    assert isinstance(racy, _CloseDuringPut)
    racy.model = model
    done = model.submit(np.ones((2, 3), np.float32))
    assert racy.closer is not None
    racy.closer.join(30)
    assert model._closed
    assert done.result(30).ravel().tolist() == [3.0, 3.0]
    for thread in model._threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in model._threads)


def test_after_a_close_submit_never_runs_the_model_on_the_event_loop() -> None:
    forward = _Recorder()
    model = BatchedModel(forward, name="closed")
    model.close()
    model.close()  # twice: nothing more

    async def request() -> tuple[threading.Thread, np.ndarray]:
        future: Future[np.ndarray] = model.submit(np.ones((1, 4), np.float32))
        return threading.current_thread(), await asyncio.wrap_future(future)

    loop_thread, out = asyncio.run(request())
    assert out.ravel().tolist() == [4.0]
    assert forward.threads and loop_thread not in forward.threads


def test_submits_racing_a_close_all_resolve() -> None:
    """Eight threads submit while the model closes: every future resolves with its own rows."""
    model = BatchedModel(_Recorder(), max_batch=8, name="many")
    start = threading.Barrier(9)
    futures: list[list[tuple[float, Future[np.ndarray]]]] = [[] for _ in range(8)]

    def caller(i: int) -> None:
        start.wait()
        for k in range(200):
            value = float(i * 1000 + k)
            futures[i].append((value, model.submit(np.full((1, 2), value, np.float32))))

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    start.wait()
    model.close()
    for t in threads:
        t.join(60)
    for row in futures:
        for value, future in row:
            assert future.result(30).ravel().tolist() == [2 * value]
