"""Batched reporting of sample outcomes from a worker process to the manager.

Outcomes are queued in memory and sent every ``interval`` seconds by a daemon thread (one HTTP request per
session per batch instead of one per task). A report that cannot be sent stays queued and is retried; if the
process dies first, the session's reconciliation finds the sample in the feature store, so nothing is lost.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict

from labswarm.client import ManagerClient
from labswarm.errors import ManagerError

log = logging.getLogger(__name__)

#: Outcomes kept while the manager is unreachable; older ones are dropped (reconciliation recovers them).
MAX_PENDING = 100_000
#: Outcomes per request at most: a backlog goes in several requests, each under the manager's body limit (1 MiB).
MAX_PER_REQUEST = 1_000


class Reporter:
    """Sends ``{sample_id, status, reason, seconds}`` outcomes to the manager in batches.

    Args:
        client: the manager client.
        interval: seconds between flushes.
    """

    def __init__(self, client: ManagerClient, interval: float = 0.25) -> None:
        self.client = client
        self.interval = interval
        self._pending: dict[str, list[dict]] = defaultdict(list)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="labswarm-reporter", daemon=True)
        self._thread.start()

    def add(self, session_id: str, outcome: dict) -> None:
        """Queue one outcome for ``session_id``."""
        with self._lock:
            batch = self._pending[session_id]
            batch.append(outcome)
            if len(batch) > MAX_PENDING:
                del batch[: len(batch) - MAX_PENDING]

    def flush(self) -> bool:
        """Send everything queued now; ``True`` when nothing is left queued."""
        with self._lock:
            pending, self._pending = self._pending, defaultdict(list)
        ok = True
        for session_id, outcomes in pending.items():
            sent = 0
            try:
                while sent < len(outcomes):
                    self.client.report(session_id, outcomes[sent:sent + MAX_PER_REQUEST])
                    sent += MAX_PER_REQUEST
            except ManagerError as exc:
                outcomes = outcomes[sent:]  # those not sent yet
                ok = False
                if exc.status is not None and 400 <= exc.status < 500 and exc.status != 429:
                    log.warning("manager refused %d outcomes of session %s: %s", len(outcomes), session_id, exc)
                    continue  # e.g. the session was deleted: these outcomes have no one to go to
                log.warning("cannot report %d outcomes (will retry): %s", len(outcomes), exc)
                with self._lock:
                    self._pending[session_id][:0] = outcomes
        return ok

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            self.flush()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread after a last flush."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)
        self.flush()
