"""Reconciliation: after publishing, until every sample of a session has an outcome.

Once the queue has no ready message and no outcome has arrived for a while, every sample still without an
outcome is looked up in the store (a worker computed it but its report was lost: ``done``), or published again,
at most ``max_attempts`` times (then ``failed``). The store and the ledger are the truth; the broker is transport.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

from labswarm.config.experiment import ExperimentConfig
from labswarm.pipeline.features import FeaturesBlock
from labswarm.sample import Sample, iter_samples
from labswarm.sessions import ledger
from labswarm.sessions.context import SessionContext
from labswarm.sessions.models import known_session
from labswarm.sessions.ratelimit import TokenBucket
from labswarm.sessions.states import SessionState

log = logging.getLogger(__name__)

#: Samples republished per ``publish_many`` call (one round of confirms) and per ledger commit.
BATCH = 200
#: Samples of the experiment's stream looked up per ledger query while walking it: what the walk holds at once
#: (samples, their ids as one JSON parameter, SQLite's ephemeral table of them). 1,000 keeps that transient under
#: ~1 MB (5,000 left ~5 MB of freed but fragmented heap behind in the manager); a million samples take 1,000 queries.
WALK = 1_000


class Publisher(Protocol):
    """What reconciliation needs of a session's publisher (:class:`~labswarm.sessions.runner.SessionRunner`, the
    thread that calls it): the session, its runtime, its pacing and controls, and its progress clock."""

    context: SessionContext
    session_id: str
    experiment: str
    config: ExperimentConfig
    bucket: TokenBucket
    stop_event: threading.Event
    #: The slowest task seen, in s.
    max_task_seconds: float
    #: ``time.monotonic()`` of the last outcome that arrived (reconciliation resets it after each walk).
    last_progress: float
    #: Set when outcomes arrive or the runner stops (reconciliation clears it before each look at the ledger).
    outcomes_arrived: threading.Event

    def wait_running(self) -> bool:
        """Block while paused; ``False`` once stopped."""
        ...

    def finish(self, state: SessionState, error: str | None = None) -> None:
        """End the session with a terminal ``state``."""
        ...


def reconcile(runner: Publisher, block: FeaturesBlock) -> None:
    """Wait for every sample's outcome; when the queue is empty and nothing arrived for a while, republish.

    Progress is what :meth:`~labswarm.sessions.runner.SessionRunner.note_outcomes` sees arrive; the ledger is
    asked only whether any sample is still pending (one index seek per poll, whatever the session's size).
    The ledger is looked at when outcomes arrive (the session's end is seen as soon as its last outcome is
    recorded), and at least every 0.25 s. Returns once the session completed (:meth:`Publisher.finish`) or the
    runner was stopped; waits while the session is paused.

    Args:
        runner: the session's publisher (the thread calling this).
        block: the experiment's features block (its ``is_cached`` looks a sample up in the feature store).
    """
    settings = runner.context.settings
    runner.last_progress = time.monotonic()
    while not runner.stop_event.is_set():
        if not runner.wait_running():
            return
        runner.outcomes_arrived.clear()  # before the look: outcomes recorded after it wake the wait below
        with runner.context.db() as db:
            waiting = ledger.has_pending(db, runner.session_id)
        if not waiting:
            runner.finish(SessionState.COMPLETED)
            return
        idle_limit = max(settings.reconcile_after, 4 * runner.max_task_seconds)
        idle = time.monotonic() - runner.last_progress > idle_limit
        if idle and runner.context.broker.queue_depth(runner.experiment) == 0:
            republish_missing(runner, block)
            runner.last_progress = time.monotonic()
        runner.outcomes_arrived.wait(0.25)


def republish_missing(runner: Publisher, block: FeaturesBlock) -> bool:
    """Samples without an outcome: found in the store (``done``), out of attempts (``failed``) or published again.

    Streams: walks the experiment's sample stream in chunks of :data:`WALK` samples, looks up which of each chunk
    are pending (one query), settles and republishes those, and stops once as many as were pending at the start
    have been seen. Memory holds one chunk, whatever the session's size. A pause holds the walk where it is (no
    message is published while paused) and the walk goes on from there on resume; a stop ends it.

    Returns:
        ``True`` when the walk went through, ``False`` when the runner was stopped first.
    """
    with runner.context.db() as db:
        missing = ledger.count_pending(db, runner.session_id)
    if not missing:
        return True
    log.info("session %s: %d samples without outcome; reconciling", runner.session_id, missing)
    started, seen, sent_total = time.monotonic(), 0, 0
    for chunk in ledger.chunks(iter_samples(runner.config), WALK):
        if not runner.wait_running():
            return False
        with runner.context.db() as db:
            attempts = ledger.pending_among(db, runner.session_id, (s.id for s in chunk))
        if not attempts:
            continue
        seen += len(attempts)
        sent = _settle(runner, block, [s for s in chunk if s.id in attempts], attempts)
        if sent is None:
            return False
        sent_total += sent
        if seen >= missing:
            break
    log.info("session %s: reconciled %d samples in %.1f s (%d published again)", runner.session_id, seen,
             time.monotonic() - started, sent_total)
    return True


def _settle(runner: Publisher, block: FeaturesBlock, samples: list[Sample],
            attempts: dict[str, int]) -> int | None:
    """Settle one chunk's pending ``samples``: ``done`` if in the store, ``failed`` out of attempts, else
    published again; returns how many were published, ``None`` if stopped first."""
    max_attempts = runner.context.settings.max_attempts
    found: list[str] = []
    exhausted: list[str] = []
    again: list[Sample] = []
    for sample in samples:
        if block.is_cached(sample, strict=True):  # strict: one computed since the store's listing is done
            found.append(sample.id)
        elif attempts[sample.id] >= max_attempts:
            exhausted.append(sample.id)
        else:
            again.append(sample)
    with runner.context.db() as db:
        ledger.set_status(db, runner.session_id, found, "done", None)
        ledger.set_status(db, runner.session_id, exhausted, "failed",
                          f"no outcome after {max_attempts} deliveries (worker lost or task lost)")
        db.commit()
    sent = 0
    for batch in ledger.chunks(again, BATCH):
        if not runner.wait_running():  # paused: hold here; resume goes on with this batch
            return None
        for taken in range(len(batch)):
            if not runner.bucket.acquire(runner.stop_event):
                batch = batch[:taken]
                break
        n = runner.context.broker.publish_many(runner.session_id, runner.experiment, batch, runner.stop_event)
        _record_sent(runner, [s.id for s in batch[:n]])
        sent += n
        if n < len(batch) or runner.stop_event.is_set():
            return None
    return sent


def _record_sent(runner: Publisher, sample_ids: list[str]) -> None:
    """One more attempt for each republished sample; the session's message counters."""
    if not sample_ids:
        return
    with runner.context.db() as db:
        ledger.add_attempt(db, runner.session_id, sample_ids)
        row = known_session(db, runner.session_id)
        row.published += len(sample_ids)
        row.republished += len(sample_ids)
        db.commit()
