"""A remote feature store's writes inside a batch (:meth:`labswarm.store.FeatureStore.batch`), sent by background
threads while the computing thread goes on, all of them waited for at the batch's end.

Into an object store each array is a PUT request that waits for the service (the moto server on this machine:
~48 ms of wall time a 220 kB PUT at load ~8, against a sample's ~0.1-0.2 s of feature computation, 2026-11-26,
docs/benchmarks/store.md): made on the computing thread, the worker waits on it for every array. Inside a batch
(a task's message, of one sample or several, a local run's chunk) :meth:`Uploads.submit` hands the array's bytes to a
small pool of threads and returns; :meth:`Uploads.flush`, at the end of the batch, waits until every one is
stored. The caller acknowledges a message (or reports its samples) only after the flush, so "a task is
acknowledged only after its arrays are durable in the store" still holds: a process killed inside the batch has
acknowledged nothing, and an object store makes each object appear whole (no partial array). A write that fails
is tried again by its thread, :data:`STORE_RETRIES` attempts in all with :data:`RETRY_DELAY` s of backoff doubled
each time (the policy :func:`labswarm.queue.task.run_sample` applies to a sample's store failures outside a
batch), and only then counted failed; one the store refuses for good (a bucket that is not there, credentials
refused: :class:`~labswarm.errors.StorageRefused`) is not tried again. Memory is bounded: at most
:data:`UPLOAD_BYTES` of a batch's arrays wait, travel or wait to be tried again at once; beyond,
:meth:`Uploads.submit` waits for the oldest to finish (backpressure, as a bounded queue).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from labswarm.errors import StorageError, StorageRefused, StoreError, StoreRefused

log = logging.getLogger(__name__)

#: Threads of a feature store's upload pool (each :class:`~labswarm.store.FeatureStore` of a remote store makes
#: its own at its first batch, and a forked child its own again), so uploads in flight at once per store: a
#: sample's arrays (one per feature) and the next sample's go out together; the S3 client keeps 32 connections
#: (:data:`labswarm.storage.s3.POOL_CONNECTIONS`).
UPLOAD_THREADS = 4
#: Most bytes of arrays one batch (one :class:`Uploads`) holds for upload at once (waiting, being sent, or waiting
#: to be tried again) before its next write waits for room: ~300 mel arrays of the demo set's 220 kB. A bound per
#: batch: a worker process computes one message at a time, so one batch; batches of several threads hold theirs
#: each.
UPLOAD_BYTES = 64 * 2**20
#: Attempts of one write to the feature store when it fails (a transient failure: a network or service error):
#: an upload in a batch here, a whole sample's run in :func:`labswarm.queue.task.run_sample`. Each attempt of an
#: upload is itself the S3 client's request with its own retries.
STORE_RETRIES = 3
#: Seconds before the second attempt; doubled before each next one (0.5 s then 1 s: 1.5 s of waiting in all).
RETRY_DELAY = 0.5


class Uploads:
    """The background writes of one batch.

    Args:
        pool: the threads that send them (the store's, shared by its batches in this process).
        max_bytes: the most bytes held at once (default :data:`UPLOAD_BYTES`); an array larger than that is sent
            alone.
    """

    def __init__(self, pool: ThreadPoolExecutor, max_bytes: int | None = None) -> None:
        self._pool, self.max_bytes = pool, UPLOAD_BYTES if max_bytes is None else max_bytes
        self._room = threading.Condition()
        self._held = 0
        self._sent: list[Future[None]] = []
        self._failed: list[tuple[str, Exception]] = []

    @property
    def held(self) -> int:
        """Bytes waiting or being sent now."""
        with self._room:
            return self._held

    def submit(self, what: str, size: int, send: Callable[[], None], stored: Callable[[], None] | None) -> None:
        """Have ``send()`` (the write of ``size`` bytes, ``what`` in messages) run by a background thread, tried
        again on a :class:`~labswarm.errors.StorageError` as :func:`send_retried` does, then ``stored()`` once it
        succeeded; waits first while :attr:`max_bytes` are held (unless nothing is)."""
        with self._room:
            while self._held and self._held + size > self.max_bytes:
                self._room.wait()
            self._held += size

        def run() -> None:
            try:
                send_retried(what, send)
                if stored is not None:
                    stored()
            except Exception as exc:  # reported by flush(), on the batch's thread
                self._failed.append((what, exc))
            finally:
                with self._room:
                    self._held -= size
                    self._room.notify_all()

        self._sent.append(self._pool.submit(run))

    def flush(self) -> None:
        """Wait until every write submitted is done.

        Raises:
            StoreRefused: some failed, every one refused for good (:class:`~labswarm.errors.StorageRefused`: no
                bucket, credentials refused), tried once; the others are stored.
            StoreError: some failed, each after :data:`STORE_RETRIES` attempts (how many, and the first one's
                reason); the others are stored.
        """
        for sent in self._sent:
            sent.result()
        count = len(self._sent)
        self._sent = []
        if self._failed:
            what, exc = self._failed[0]
            failed, self._failed = self._failed, []
            error = StoreRefused if all(isinstance(e, StorageRefused) for _, e in failed) else StoreError
            raise error(f"{len(failed)} of {count} arrays not stored, e.g. {what}: {exc}") from exc


def send_retried(what: str, send: Callable[[], None]) -> None:
    """``send()``, run again after a :class:`~labswarm.errors.StorageError` until :data:`STORE_RETRIES` attempts
    are made, :data:`RETRY_DELAY` s before the second and twice as long before each next one (logged).

    Raises:
        StorageError: the last attempt's; any other error of ``send()`` at once (not a store failure), and a
            :class:`~labswarm.errors.StorageRefused` too (no bucket, credentials refused: trying again changes
            nothing).
    """
    delay = RETRY_DELAY
    for _ in range(STORE_RETRIES - 1):
        try:
            send()
            return
        except StorageRefused:
            raise
        except StorageError as exc:
            log.warning("upload of %s: %s; retrying in %.1f s", what, exc, delay)
            time.sleep(delay)
            delay *= 2
    send()  # the last attempt, whatever its outcome
