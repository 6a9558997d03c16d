"""The prediction endpoint's feature computation, in worker processes of its own.

Decoding a file and computing its features (:class:`labswarm.predict.Inputs`) is most of a prediction's work
(~20 ms of a 10-s clip's ~30 ms; the forward pass is the rest: 2026-11-26, 2-core machine under load;
docs/benchmarks/training.md), and much of it holds the GIL (librosa's framing,
numpy's small operations): in threads of the server's process it would run one file at a time and slow the
server's event loop (the manager's whole API). A pool of ``workers`` processes computes the files of concurrent
requests in parallel instead, each with its maths libraries on one thread (:func:`labswarm.threads.limit_threads`,
as every feature worker of labswarm: two threads per pool on the shared 2-core machine made the mel projection of
a clip 5-70x slower, same conditions). The model stays in the server's process, where the forward passes of
concurrent requests are batched (:mod:`labswarm.serve.batching`).

A worker keeps the :class:`~labswarm.predict.Inputs` of the last few models it served (each sent pickled, ~2 KB,
with every file: the experiment's configuration; rebuilt once per model and worker). A worker that dies (killed,
out of memory) fails the files it had with :class:`~concurrent.futures.process.BrokenProcessPool`; the next file
starts a new pool. A worker ends with the server's process, however that ends.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import threading
import uuid
import weakref
from collections import OrderedDict
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np

from labswarm.predict import Inputs

#: Models whose :class:`Inputs` a worker keeps built.
KEPT = 8

_kept: OrderedDict[str, Inputs] = OrderedDict()  # in a worker: token -> Inputs, most recently used last


def _start_worker() -> None:
    """A worker's start: one thread per maths library; Ctrl-C is the server's to handle (the pool ends its
    workers); and a thread that ends the worker when the server's process ends, however it ends (a worker waits
    for files on a pipe whose both ends it holds, so it would otherwise outlive a killed server)."""
    from labswarm.threads import limit_threads

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    limit_threads(1)
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_end_with, args=(parent.sentinel,), name="labswarm-parent-watch", daemon=True).start()


def _end_with(sentinel: int) -> None:
    multiprocessing.connection.wait([sentinel])  # readable once the parent process has ended
    os._exit(0)


class WorkerError(Exception):
    """An exception raised in a feature worker, as its type's name (``kind``) and its message: every exception
    crosses back this way (many libraries' exceptions do not unpickle, and one that fails to unpickle would break
    the whole pool; labswarm's :class:`~labswarm.errors.AudioError` does since 2026-11-26). ``str()`` is
    ``"kind: message"``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(kind, message)
        self.kind = kind
        self.message = message

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


def _compute(token: str, spec: bytes, path: str) -> tuple[int, list[np.ndarray]]:
    """In a worker: the inputs of ``path`` (see :meth:`Inputs.__call__`) and this process's id.

    Raises:
        WorkerError: whatever computing them raised.
    """
    inputs = _kept.get(token)
    if inputs is None:
        inputs = _kept[token] = pickle.loads(spec)
        while len(_kept) > KEPT:
            _kept.popitem(last=False)
    _kept.move_to_end(token)
    try:
        return os.getpid(), inputs(path)
    except Exception as exc:
        raise WorkerError(type(exc).__name__, str(exc)) from None


def _ready() -> int:
    return os.getpid()


class FeaturePool:
    """``workers`` processes computing the model inputs of audio files.

    Args:
        workers: processes (at least 1); the pool (its queues, its processes) is made on the first :meth:`submit`
            or by :meth:`warm`: a manager that predicts nothing starts nothing.

    Attributes:
        pids: the processes that computed inputs so far (none of them this one).
        restarts: pools started again after a worker died.
    """

    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"workers: at least 1, got {workers}")
        self.workers = workers
        self.pids: set[int] = set()
        self.restarts = 0
        self._lock = threading.Lock()
        self._specs: weakref.WeakKeyDictionary[Inputs, tuple[str, bytes]] = weakref.WeakKeyDictionary()
        self._executor: ProcessPoolExecutor | None = None

    def _new(self) -> ProcessPoolExecutor:
        # spawn: the server's process runs threads (uvicorn's, torch's), which a fork would copy mid-state
        return ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_start_worker)

    def submit(self, inputs: Inputs, path: Path) -> Future[list[np.ndarray]]:
        """Compute ``inputs(path)`` in a worker; the future gives the float32 arrays of :meth:`Inputs.__call__`, or
        a :class:`WorkerError` (what it raised), or :class:`BrokenProcessPool` (the worker died meanwhile)."""
        with self._lock:
            spec = self._specs.get(inputs)
            if spec is None:
                spec = self._specs[inputs] = (uuid.uuid4().hex, pickle.dumps(inputs))
            executor = self._executor = self._executor or self._new()
            try:
                inner = executor.submit(_compute, *spec, str(path))
            except BrokenProcessPool:  # a worker died: the pool is unusable, start another
                executor.shutdown(wait=False, cancel_futures=True)
                executor = self._executor = self._new()
                self.restarts += 1
                inner = executor.submit(_compute, *spec, str(path))
        outer: Future[list[np.ndarray]] = Future()
        inner.add_done_callback(lambda done: self._settle(done, outer))
        return outer

    def _settle(self, inner: Future[tuple[int, list[np.ndarray]]], outer: Future[list[np.ndarray]]) -> None:
        if inner.cancelled():  # the pool was closed
            outer.cancel()
            return
        error = inner.exception()
        if error is not None:
            outer.set_exception(error)
            return
        pid, arrays = inner.result()
        self.pids.add(pid)
        outer.set_result(arrays)

    def warm(self) -> set[int]:
        """Start every worker now and wait until each is ready, so that the first files wait for no process
        start (a few seconds each: the feature libraries' imports). Returns their process ids."""
        with self._lock:
            executor = self._executor = self._executor or self._new()
        pending = [executor.submit(_ready) for _ in range(self.workers)]  # none idle yet: one process each
        return {p.result() for p in pending}

    def close(self) -> None:
        """End the workers (files in progress fail with ``CancelledError``)."""
        with self._lock:
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)
