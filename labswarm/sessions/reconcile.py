"""Reconciliation: after publishing, until every sample of a session has an outcome.

Once the queue has no ready message and no outcome has arrived for a while, every sample still without an
outcome is looked up in the store (a worker computed it but its report was lost: ``done``), or published again,
at most ``max_attempts`` times (then ``failed``). The store and the ledger are the truth; the broker is transport.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from labswarm.sample import Sample, iter_samples
from labswarm.sessions import ledger
from labswarm.sessions.models import SessionRow

if TYPE_CHECKING:
    from labswarm.pipeline.features import FeaturesBlock
    from labswarm.sessions.runner import SessionRunner

log = logging.getLogger(__name__)


def reconcile(runner: SessionRunner, block: FeaturesBlock) -> None:
    """Wait for every sample's outcome; when the queue is empty and nothing arrived for a while, republish.

    Returns once the session completed (:meth:`SessionRunner.finish`) or the runner was stopped.
    """
    settings = runner.service.settings
    last_counts = None
    runner.last_progress = time.monotonic()
    while not runner.stop_event.is_set():
        if not runner.wait_running():
            return
        with runner.service.db() as db:
            counts = ledger.counts(db, runner.session_id)
        if counts["published"] == 0:
            runner.finish("completed")
            return
        if counts != last_counts:
            last_counts, runner.last_progress = counts, time.monotonic()
        idle_limit = max(settings.reconcile_after, 4 * runner.max_task_seconds)
        idle = time.monotonic() - runner.last_progress > idle_limit
        if idle and runner.service.broker.queue_depth(runner.experiment) == 0:
            republish_missing(runner, block)
            runner.last_progress = time.monotonic()
        runner.stop_event.wait(0.25)



def republish_missing(runner: SessionRunner, block: FeaturesBlock) -> None:
    """Samples without an outcome: found in the store (``done``), out of attempts (``failed``) or published again."""
    max_attempts = runner.service.settings.max_attempts
    with runner.service.db() as db:
        missing = ledger.pending(db, runner.session_id)
    if not missing:
        return
    log.info("session %s: %d samples without outcome; reconciling", runner.session_id, len(missing))
    found: list[str] = []
    exhausted: list[str] = []
    again: list[Sample] = []
    for sample in iter_samples(runner.config):
        attempts = missing.get(sample.id)
        if attempts is None:
            continue
        if block.is_cached(sample):
            found.append(sample.id)
        elif attempts >= max_attempts:
            exhausted.append(sample.id)
        else:
            again.append(sample)
    with runner.service.db() as db:
        ledger.set_status(db, runner.session_id, found, "done", None)
        ledger.set_status(db, runner.session_id, exhausted, "failed",
                          f"no outcome after {max_attempts} deliveries (worker lost or task lost)")
        db.commit()
    sent: list[str] = []
    for sample in again:
        if not runner.bucket.acquire(runner.stop_event):
            break
        if not runner.service.broker.publish(runner.session_id, runner.experiment, sample, runner.stop_event):
            break
        sent.append(sample.id)
    with runner.service.db() as db:
        ledger.add_attempt(db, runner.session_id, sent)
        row = db.get(SessionRow, runner.session_id)
        row.published += len(sent)
        row.republished += len(sent)
        db.commit()
