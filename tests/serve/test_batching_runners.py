"""Several pass threads on one batched model (labswarm/serve/batching.py, ``runners``): passes run side by side,
every queued array is answered with its own rows, and one close stops every thread. Real threads."""

from __future__ import annotations

import threading

import numpy as np
from helpers import wait_until

from labswarm.serve.batching import BatchedModel


def test_two_runners_pass_at_once_and_stop_on_one_close() -> None:
    both = threading.Barrier(2, timeout=60)  # passes once two forward passes are in progress at the same time
    met: list[bool] = []

    def forward(x: np.ndarray) -> np.ndarray:
        if not met:  # the first two passes wait for each other: a single runner would break the barrier
            try:
                both.wait()
                met.append(True)
            except threading.BrokenBarrierError:
                met.append(False)
        return x.reshape(len(x), -1).sum(1).astype(np.float64)

    model = BatchedModel(forward, max_batch=4, name="runners", runners=2)
    first = model.submit(np.full((1, 3), 1, np.float32))
    # the first pass holds its thread: the second array goes to the other runner (a deadline: a hang fails instead)
    wait_until(lambda: both.n_waiting, "the first pass at the barrier", 60, interval=0.01)
    futures = [model.submit(np.full((1, 3), i, np.float32)) for i in range(2, 40)]
    model.close()
    assert first.result(60)[0] == 3
    assert [f.result(60)[0] for f in futures] == [3 * i for i in range(2, 40)]
    assert met[:2] == [True, True]
    for thread in model._threads:
        thread.join(60)
        assert not thread.is_alive()
    assert model.rows == 39
