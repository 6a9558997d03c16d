"""A session's publisher: streams an experiment's samples onto its queue at the session's rate, then
reconciles the ledger until every sample has an outcome.

Phases, each resumable after a manager restart:

1. **publish**: walk the sample stream from the persisted ``cursor``; a sample already in the feature store is
   recorded ``cached`` without a message; the others are published through the token bucket. Ledger rows and
   the cursor are committed in batches *after* the messages are confirmed, so a crash republishes at most one
   batch (harmless: tasks are idempotent).
2. **reconcile**: once the queue has no ready message and no outcome has arrived for a while, every sample
   still without an outcome is looked up in the store (a worker computed it but its report was lost: ``done``),
   or published again, at most ``max_attempts`` times (then ``failed``). The store and the ledger are the truth;
   the broker is transport.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from labswarm.db import utcnow
from labswarm.pipeline.features import FeaturesBlock
from labswarm.sample import iter_samples
from labswarm.sessions import ledger
from labswarm.sessions.models import SessionRow
from labswarm.sessions.ratelimit import TokenBucket
from labswarm.sessions.reconcile import reconcile

if TYPE_CHECKING:
    from labswarm.sessions.service import SessionService

log = logging.getLogger(__name__)

#: Ledger rows committed together while publishing.
BATCH = 200
#: Longest time between two ledger commits while publishing, in seconds.
BATCH_SECONDS = 0.5


class SessionRunner(threading.Thread):
    """The thread that publishes and reconciles one session.

    Args:
        service: the session service (database, broker, settings).
        session_id: the session to run; its row gives the experiment, rate, cursor and status.
    """

    def __init__(self, service: SessionService, session_id: str) -> None:
        super().__init__(name=f"session-{session_id}", daemon=True)
        self.service = service
        self.session_id = session_id
        with service.db() as db:
            row = db.get(SessionRow, session_id)
            self.experiment = row.experiment
            self.bucket = TokenBucket(row.rate)
            paused = row.status == "paused"
        self.config = service.registry.config(self.experiment)
        self.stop_event = threading.Event()
        self.running = threading.Event()
        if not paused:
            self.running.set()
        self.phase = "publish"
        self.max_task_seconds = 0.0
        self.last_progress = time.monotonic()

    # control, from API threads
    def set_rate(self, rate: float) -> None:
        self.bucket.set_rate(rate)

    def pause(self) -> None:
        self.running.clear()

    def resume(self) -> None:
        self.running.set()

    def stop(self) -> None:
        self.stop_event.set()
        self.running.set()  # wake a paused thread so it can see the stop

    def note_outcomes(self, max_seconds: float) -> None:
        """Called when outcomes arrive: progress was made; remember the slowest task."""
        self.last_progress = time.monotonic()
        self.max_task_seconds = max(self.max_task_seconds, max_seconds)

    def wait_running(self) -> bool:
        """Block while paused; ``False`` once the runner is stopped."""
        self.running.wait()  # set while running; stop() sets it too, to wake a paused thread
        return not self.stop_event.is_set()

    # the thread
    def run(self) -> None:
        try:
            block = FeaturesBlock(self.config)
            self._publish_phase(block)
            if not self.stop_event.is_set():
                self.phase = "reconcile"
                reconcile(self, block)
        except Exception as exc:
            log.exception("session %s failed", self.session_id)
            with self.service.db() as db:
                row = db.get(SessionRow, self.session_id)
                row.status, row.error, row.finished_at = "failed", f"{type(exc).__name__}: {exc}", utcnow()
                db.commit()
            self.service.session_finished(self.session_id)  # its workers stop too

    def _publish_phase(self, block: FeaturesBlock) -> None:
        with self.service.db() as db:
            cursor = db.get(SessionRow, self.session_id).cursor
        rows: list[tuple[str, str, str | None]] = []
        published = 0
        last_commit = time.monotonic()
        index = -1
        for index, sample in enumerate(iter_samples(self.config)):
            if index < cursor:
                continue
            if not self.wait_running():
                break
            if block.is_cached(sample):
                rows.append((sample.id, "cached", None))
            else:
                if not self.bucket.acquire(self.stop_event):
                    break
                if not self.service.broker.publish(self.session_id, self.experiment, sample, self.stop_event):
                    break
                rows.append((sample.id, "published", None))
                published += 1
            if len(rows) >= BATCH or time.monotonic() - last_commit > BATCH_SECONDS:
                self._commit(rows, index + 1, published)
                rows, published, last_commit = [], 0, time.monotonic()
        else:
            self._commit(rows, index + 1, published)
            return
        # stopped mid-stream: the sample at `index` was not published; resume there
        self._commit(rows, index, published)

    def _commit(self, rows: list[tuple[str, str, str | None]], cursor: int, published: int) -> None:
        with self.service.db() as db:
            ledger.add_samples(db, self.session_id, rows)
            row = db.get(SessionRow, self.session_id)
            row.cursor = max(row.cursor, cursor)
            row.published += published
            db.commit()

    def finish(self, status: str) -> None:
        """End the session with ``status`` (unless it ended already) and tell the service."""
        with self.service.db() as db:
            row = db.get(SessionRow, self.session_id)
            if row.status in ("running", "paused"):
                row.status, row.finished_at = status, utcnow()
            db.commit()
        self.service.session_finished(self.session_id)
