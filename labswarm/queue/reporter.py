"""Batched reporting of sample outcomes from a worker process to the manager.

Outcomes are queued in memory and sent by a daemon thread, one HTTP request per session per batch instead of one
per task: the thread sleeps until an outcome is queued, sends it at once when the last request is ``interval``
seconds old or more, else when it is (so at most one request an ``interval``, and those queued meanwhile go
together). A worker adds a message's outcomes together (:meth:`Reporter.add_many`), after its arrays are stored:
they leave together, as soon as the message is done, in one request unless they are more than
:data:`MAX_PER_REQUEST` (then in several, back to back) or a send fails part-way (those not sent go with the next
round). A round that sends nothing (its outcomes already went with the round before) does not count as a request:
the next outcome still leaves at once. A report that cannot be sent (the manager unreachable, or any other error:
an answer that is not JSON, a closed client) stays queued and is tried again ``interval`` seconds later; the thread
never dies of it. If the process dies first, the session's reconciliation finds the sample in the feature store,
so nothing is lost.

Why not a clock (the thread woke every ``interval``, 0.25 s, and sent what was queued; until issue 27): an idle
worker's pool process woke 4 times a second for nothing, on the cores the other processes compute on, and a
message's outcomes waited up to ``interval`` (0.125 s on average) before they left: the manager's progress, the
health controller's consume rate and the session's end saw every message that much later.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterable

from labswarm.client import ManagerClient
from labswarm.errors import ManagerError

log = logging.getLogger(__name__)

#: Outcomes kept while the manager is unreachable; older ones are dropped (reconciliation recovers them).
MAX_PENDING = 100_000
#: Outcomes per request at most: a backlog goes in several requests, each under the manager's body limit (1 MiB).
MAX_PER_REQUEST = 1_000


class Reporter:
    """Sends ``{sample_id, status, reason, seconds}`` outcomes to the manager in batches (see the module).

    Args:
        client: the manager client.
        interval: the least seconds between two requests (and before a failed one is tried again); an outcome
            queued when the last request is older is sent at once.
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
        self.add_many(session_id, (outcome,))

    def add_many(self, session_id: str, outcomes: Iterable[dict]) -> None:
        """Queue ``outcomes`` (a message's) for ``session_id``: they leave together, in the same round (one request
        of at most :data:`MAX_PER_REQUEST` outcomes, or several back to back)."""
        with self._lock:
            batch = self._pending[session_id]
            before = len(batch)
            batch.extend(outcomes)
            added = len(batch) > before
            if len(batch) > MAX_PENDING:
                del batch[: len(batch) - MAX_PENDING]
        if added:
            self._wake.set()

    def flush(self) -> bool:
        """Send everything queued now; ``True`` when nothing is left queued.

        Never raises: outcomes that could not be sent (any error but a 4xx refusal, which drops them with a
        warning) are queued again, ahead of those queued since.
        """
        return self._send()[0]

    def _send(self) -> tuple[bool, int]:
        """:meth:`flush`, and the number of requests tried (0: nothing was queued)."""
        with self._lock:
            pending, self._pending = self._pending, defaultdict(list)
        ok, tried = True, 0
        for session_id, outcomes in pending.items():
            sent = 0
            try:
                while sent < len(outcomes):
                    tried += 1
                    self.client.report(session_id, outcomes[sent:sent + MAX_PER_REQUEST])
                    sent += MAX_PER_REQUEST
                continue
            except ManagerError as exc:
                left = outcomes[sent:]  # those not sent yet
                if exc.status is not None and 400 <= exc.status < 500 and exc.status != 429:
                    log.warning("manager refused %d outcomes of session %s: %s", len(left), session_id, exc)
                    ok = False
                    continue  # e.g. the session was deleted: these outcomes have no one to go to
                log.warning("cannot report %d outcomes (will retry): %s", len(left), exc)
            except Exception:  # e.g. a 200 whose body is not JSON (a proxy), a closed client: kept, tried again
                left = outcomes[sent:]
                log.exception("cannot report %d outcomes of session %s (will retry)", len(left), session_id)
            ok = False
            with self._lock:
                self._pending[session_id][:0] = left
        return ok, tried

    def _run(self) -> None:
        last = -float("inf")  # when the last request was sent (monotonic s)
        while not self._stop.is_set():
            self._wake.wait()  # an outcome queued (or close())
            if self._stop.wait(max(0.0, last + self.interval - time.monotonic())):
                return  # close() sends what is left
            self._wake.clear()  # before the flush takes the queue: an outcome queued after it wakes the next round
            started = time.monotonic()
            try:
                ok, tried = self._send()
            except Exception:  # not expected (_send keeps its errors): the thread must not die of it
                log.exception("the outcome reporter's round failed (will retry)")
                ok, tried = False, 1
            if tried:
                last = started  # a round that sent nothing (its outcomes went with the last one) is no request
            if not ok:
                self._wake.set()  # what is left (a manager unreachable) is tried again an interval later

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread without sending what is queued: it stays queued until :meth:`flush` or :meth:`close`
        (tests read the queue this way without the thread emptying it meanwhile)."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread (waiting ``timeout`` s at most for a round under way), then send what is left."""
        self.stop(timeout)
        self.flush()
