"""Forward passes shared by concurrent requests: threads of their own run the model on the rows callers queued.

Callers queue arrays of model inputs (a file's windows, :meth:`labswarm.predict.Predictor.inputs`); a thread
takes what is queued, concatenates the arrays of the same shape (at most ``max_batch`` rows, at least one array)
into one forward pass and gives each caller its rows back. A lone caller waits for no one: its array goes through
at once; under load the requests that arrive during a pass go through together in the next (dynamic batching
without a timer, as in NVIDIA Triton's dynamic batcher with no queue delay). Rows are independent (the model in
evaluation mode), so a row's probabilities do not depend on its batch, up to float rounding (~1e-7).

``runners`` threads take passes from the one queue, each pass on one core (torch's intra-op threads as the
model's ``forward`` sets them; the server's setting ``runners``, 2 by default:
:class:`~labswarm.serve.settings.ServeSettings`). At 16 concurrent clients one pass thread looked like the
endpoint's bottleneck (2026-11-26, loaded 2-core machine, the bench's model: that thread ran 70-75 % of a core,
while the two feature workers were 30-37 % busy each); two run passes side by side on the cores the feature
workers leave. Their batches are smaller, which costs no more: a pass's CPU a row of that model was flat at 1-4
rows (~5.5 ms) and higher at 16 (~10 ms).

Closing (the model evicted from the cache while requests still hold it) takes a lock that :meth:`submit` holds
from its check to its put, so every array is queued before the stop sentinel or sees the model closed: none is
left behind the sentinel with a future that never resolves. After the close an array goes through alone in a
short-lived thread of its own: :meth:`submit` never runs the model in its caller's thread (the server's event
loop).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np

#: What the thread runs: float32 ``(n, *input_shape)`` -> float64 ``(n, n_classes)``.
Forward = Callable[[np.ndarray], np.ndarray]


class BatchedModel:
    """A model's forward pass behind a queue, run by ``runners`` threads of its own.

    Args:
        forward: the model's softmax over a batch (:meth:`labswarm.predict.Predictor.forward`).
        max_batch: the most rows in one pass (an array larger than that still goes through alone).
        name: the threads' name.
        runners: passes run at once, each by a thread of its own (at least 1); :meth:`run` (a caller's own pass)
            takes one of them too.

    Attributes:
        passes: forward passes run; ``rows``: rows they held (``rows / passes`` is the mean batch).
    """

    def __init__(self, forward: Forward, max_batch: int = 64, name: str = "model", runners: int = 1) -> None:
        if runners < 1:
            raise ValueError(f"runners: at least 1, got {runners}")
        self.forward = forward
        self.max_batch = max_batch
        self.passes = 0
        self.rows = 0
        self._queue: queue.SimpleQueue[tuple[np.ndarray, Future[np.ndarray]] | None] = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()  # held across submit's check-and-put and close's flag-and-sentinel
        self._passing = threading.Semaphore(runners)  # held across a forward pass: runners at a time, any thread
        self._count = threading.Lock()  # passes and rows: updated by up to runners threads at once
        self._name = name
        self._threads = [threading.Thread(target=self._run, name=f"labswarm-serve-{name}" + (f"-{i}" if i else ""),
                                          daemon=True) for i in range(runners)]
        for thread in self._threads:
            thread.start()

    def submit(self, inputs: np.ndarray) -> Future[np.ndarray]:
        """Queue ``inputs`` (float32 ``(n, *input_shape)``); the future gives their softmax, float64
        ``(n, n_classes)``, or the model's exception. Never blocks on the model: once the model is closed
        (evicted from the cache while a request still held it), the pass runs alone in a thread of its own."""
        done: Future[np.ndarray] = Future()
        with self._lock:
            if not self._closed:
                self._queue.put((inputs, done))
                return done
        threading.Thread(target=self._pass, args=([(inputs, done)],), name=f"labswarm-serve-{self._name}-closed",
                         daemon=True).start()
        return done

    def run(self, inputs: np.ndarray) -> np.ndarray:
        """The softmax of ``inputs`` (float32 ``(n, *input_shape)`` -> float64 ``(n, n_classes)``), run in the
        caller's thread, once fewer than ``runners`` passes are in progress (a lone request spares the hand-over
        to the model's thread and back). Counted in :attr:`passes` and :attr:`rows`.

        Raises:
            Exception: whatever the model raised.
        """
        with self._passing:
            out = self.forward(inputs)
        with self._count:  # `+=` is a load and a store: two runners' counts could interleave and one be lost
            self.passes += 1
            self.rows += len(inputs)
        return out

    def close(self) -> None:
        """Stop the threads once what is queued has gone through; later :meth:`submit` calls run unbatched, each
        in a thread of its own. Closing twice does nothing more."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(None)

    def _run(self) -> None:
        """A thread: :meth:`_serve`, then what is still queued (nothing, as :meth:`submit` puts under the lock
        that :meth:`close` takes; kept so that no future is ever left unresolved), each array alone; then the stop
        sentinel queued again, for the next thread (one sentinel stops them all, one after the other)."""
        self._serve()
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                self._pass([item])
        self._queue.put(None)

    def _serve(self) -> None:
        held: list[tuple[np.ndarray, Future[np.ndarray]]] = []  # queued arrays of another shape than the last pass
        stopping = False
        while True:
            if not held:
                if stopping:
                    return
                first = self._queue.get()
                if first is None:
                    return
                held.append(first)
            while True:  # everything queued now joins this round (no waiting)
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stopping = True
                else:
                    held.append(item)
            batch, held = self._take(held)
            self._pass(batch)

    def _take(self, held: list[tuple[np.ndarray, Future[np.ndarray]]]
              ) -> tuple[list[tuple[np.ndarray, Future[np.ndarray]]], list[tuple[np.ndarray, Future[np.ndarray]]]]:
        """The first array, with the arrays of its shape that follow it while they fit in ``max_batch`` rows;
        and the rest, in order."""
        shape = held[0][0].shape[1:]
        batch, rest, rows = [held[0]], [], len(held[0][0])
        for item in held[1:]:
            if item[0].shape[1:] == shape and rows + len(item[0]) <= self.max_batch:
                batch.append(item)
                rows += len(item[0])
            else:
                rest.append(item)
        return batch, rest

    def _pass(self, batch: list[tuple[np.ndarray, Future[np.ndarray]]]) -> None:
        live = [(x, done) for x, done in batch if done.set_running_or_notify_cancel()]
        if not live:
            return
        try:
            inputs = live[0][0] if len(live) == 1 else np.concatenate([x for x, _ in live])
            out = self.run(inputs)
        except Exception as exc:  # the model failed on this batch: every caller in it gets the error
            for _, done in live:
                done.set_exception(exc)
            return
        first = 0
        for x, done in live:
            done.set_result(out[first:first + len(x)])
            first += len(x)
