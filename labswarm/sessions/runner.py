"""A session's publisher: streams an experiment's samples onto its queue at the session's rate, then
reconciles the ledger until every sample has an outcome.

Phases, each resumable after a manager restart:

1. **publish**: walk the sample stream from the persisted ``cursor``; a sample already in the feature store is
   recorded ``cached`` without a message; the others are published in batches, as many at a time as the token
   bucket and the start window (:mod:`labswarm.sessions.window`: samples outstanding before anyone sets the
   rate) allow. Ledger rows and the cursor are committed in batches *after* the messages are confirmed, so a
   crash republishes at most one batch (harmless: tasks are idempotent).
2. **reconcile**: once the queue has no ready message and no outcome has arrived for a while, every sample
   still without an outcome is looked up in the store (a worker computed it but its report was lost: ``done``),
   or published again, at most ``max_attempts`` times (then ``failed``). The store and the ledger are the truth;
   the broker is transport.

A followed session (``follow``) has one **follow** phase instead (:mod:`labswarm.sessions.follow`): the labels
CSV's rows are published as they appear, those the ledger holds skipped (a restart reads the file again, rows
removed or reordered meanwhile included), until the session is cancelled.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from labswarm.config.experiment import ExperimentConfig
from labswarm.paths import DataRoots
from labswarm.pipeline.features import FeaturesBlock
from labswarm.sample import Sample, iter_samples
from labswarm.sessions import ledger, lifecycle
from labswarm.sessions.context import SessionContext
from labswarm.sessions.follow import follow
from labswarm.sessions.models import SessionRow, known_session
from labswarm.sessions.packing import MessagePacking
from labswarm.sessions.ratelimit import TokenBucket
from labswarm.sessions.reconcile import reconcile
from labswarm.sessions.states import SessionState
from labswarm.sessions.window import StartWindow

log = logging.getLogger(__name__)

#: Samples published in one batch (one ``publish_many``), and ledger rows committed together while publishing.
BATCH = 200
#: Longest time between two ledger commits while publishing, in seconds.
BATCH_SECONDS = 0.5
#: Seconds between two reads of the outstanding count from the ledger while the start window holds.
RESYNC_SECONDS = 10.0


@dataclass
class _Pending:
    """What the publisher did since its last ledger commit."""

    cursor: int  # index of the next sample to take from the stream
    committed: int = 0  # the cursor as last committed
    rows: list[tuple[str, str, str | None]] = field(default_factory=list)
    published: int = 0
    last_commit: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.committed = self.cursor


class SessionRunner(threading.Thread):
    """The thread that publishes and reconciles one session.

    Args:
        context: the runtime it shares with the service (database, settings, broker).
        row: the session to run, as just read: its id, experiment, rate and state (the cursor is read when the
            thread starts).
        config: the session's experiment configuration.
        on_end: called with the session's id once the thread has ended the session (completed or failed), so its
            owner forgets the thread and stops the session's workers.
    """

    def __init__(self, context: SessionContext, row: SessionRow, config: ExperimentConfig,
                 on_end: Callable[[str], None]) -> None:
        super().__init__(name=f"session-{row.id}", daemon=True)
        self.context = context
        self.session_id = row.id
        self.experiment = row.experiment
        self.bucket = TokenBucket(row.rate)
        self.window = StartWindow(context.settings.start_window)
        self.packing = MessagePacking(context.settings.samples_per_message)
        self.config = config
        self.follow = bool(row.follow)
        self._on_end = on_end
        self.stop_event = threading.Event()
        self.running = threading.Event()
        if row.status != SessionState.PAUSED:
            self.running.set()
        self.phase = "publish"
        self.max_task_seconds = 0.0
        self.last_progress = time.monotonic()
        #: set when outcomes arrive (or on stop): reconciliation looks at the ledger then, not at its next poll
        self.outcomes_arrived = threading.Event()
        self._forgiven = 0  # outstanding samples the window stopped counting (lost messages or reports)
        # ids handed to the broker whose ledger rows are not yet committed: their outcomes are the session's
        self._in_flight: set[str] = set()
        self._in_flight_lock = threading.Lock()

    # control, from API threads
    def set_rate(self, rate: float) -> None:
        """Publish at ``rate`` tasks/s from now on; the first rate set lifts the start window (someone steers)."""
        self.bucket.set_rate(rate)
        self.window.lift()

    def pause(self) -> None:
        self.running.clear()

    def resume(self) -> None:
        self.running.set()

    def stop(self) -> None:
        self.stop_event.set()
        self.outcomes_arrived.set()
        self.running.set()  # wake a paused thread so it can see the stop

    def note_outcomes(self, max_seconds: float, count: int = 0, seconds: float = 0.0, timed: int = 0) -> None:
        """Called when ``count`` outcomes arrive: progress was made; remember the slowest task (``max_seconds``,
        s); the start window opens by ``count``; ``timed`` of them took ``seconds`` in all (the task time that
        chooses the samples per message, :mod:`labswarm.sessions.packing`)."""
        self.last_progress = time.monotonic()
        self.packing.observe(seconds, timed)
        self.max_task_seconds = max(self.max_task_seconds, max_seconds)
        self.window.outcomes(count, max_seconds)
        self.outcomes_arrived.set()

    def in_flight(self, sample_ids: list[str]) -> set[str]:
        """Those of ``sample_ids`` that this publisher has handed to the broker and not yet written to the ledger
        (at most one batch, :data:`BATCH`): samples of the session whose outcome may arrive before their row."""
        with self._in_flight_lock:
            return {sample_id for sample_id in sample_ids if sample_id in self._in_flight}

    def wait_running(self) -> bool:
        """Block while paused; ``False`` once the runner is stopped."""
        self.running.wait()  # set while running; stop() sets it too, to wake a paused thread
        return not self.stop_event.is_set()

    # the thread
    def run(self) -> None:
        try:
            block = FeaturesBlock(self.config)
            if self.follow:  # the whole file read, the ledger skipping what it holds: no cursor to trust
                self.phase = "follow"
                with self.context.db() as db:
                    self.window.resync(ledger.counts(db, self.session_id)["published"])
                follow(self, block, DataRoots.from_settings(self.context.settings))
                return
            self._publish_phase(block)
            if not self.stop_event.is_set():
                self.phase = "reconcile"
                reconcile(self, block)
        except Exception as exc:
            log.exception("session %s failed", self.session_id)
            self.finish(SessionState.FAILED, f"{type(exc).__name__}: {exc}")

    def _publish_phase(self, block: FeaturesBlock) -> None:
        """Publish from the cursor on, in batches of at most :data:`BATCH` samples: as many as the token bucket
        and the start window allow now, one :meth:`BrokerClient.publish_many` call each. Ledger rows and the
        cursor are committed after the confirms (every :data:`BATCH` rows, every :data:`BATCH_SECONDS`, and
        before a wait longer than that), so a restart republishes at most one batch and skips nothing.
        """
        with self.context.db() as db:
            cursor = known_session(db, self.session_id).cursor
            self.window.resync(ledger.counts(db, self.session_id)["published"])
        self._publish(block, itertools.islice(enumerate(iter_samples(self.config)), cursor, None), _Pending(cursor))

    def publish_more(self, block: FeaturesBlock, samples: list[Sample]) -> None:
        """Publish ``samples`` (a followed labels CSV's new rows, none of them in the ledger) as the publish phase
        does: paced by the token bucket and the start window, ledger rows and cursor committed after the
        confirms. Returns once they are all published, or stopped."""
        with self.context.db() as db:
            cursor = known_session(db, self.session_id).cursor
        self._publish(block, enumerate(samples, start=cursor), _Pending(cursor))

    def _publish(self, block: FeaturesBlock, stream: Iterator[tuple[int, Sample]], pend: _Pending) -> None:
        """The publish loop over ``stream`` (``(index, sample)`` pairs, the index the cursor's)."""
        while True:
            if not self.running.is_set():
                self._flush(pend)
            if not self.wait_running():
                break
            wanted = self._wait_allowance(pend, BATCH - len(pend.rows))
            if wanted == 0:
                break  # stopped
            per_message = self.packing.size()
            tokens = self._take_tokens(pend, wanted, min(per_message, wanted))
            if tokens == 0:
                break  # stopped
            if not self.running.is_set():
                continue  # paused while waiting: publish nothing more
            batch, exhausted = self._next_batch(stream, block, pend, tokens)
            if batch:
                with self._in_flight_lock:  # before the broker has them: a worker may answer at once
                    self._in_flight.update(s.id for _, s in batch)
                sent = self.context.broker.publish_many(self.session_id, self.experiment, [s for _, s in batch],
                                                        self.stop_event, per_message=per_message)
                self.window.sent(sent)
                pend.rows.extend((s.id, "published", None) for _, s in batch[:sent])
                pend.published += sent
                if sent < len(batch):  # stopped mid-batch: resume at the first sample not confirmed
                    pend.cursor = batch[sent][0]
                    break
            if exhausted:
                self._flush(pend)
                return
            if len(pend.rows) >= BATCH or time.monotonic() - pend.last_commit > BATCH_SECONDS:
                self._flush(pend)
        self._flush(pend)

    def _wait_allowance(self, pend: _Pending, limit: int) -> int:
        """Samples the window allows now, at most ``limit`` (>= 1), waiting while it allows none; 0 if stopped,
        1 if paused meanwhile (the caller sees the pause before publishing).

        Samples whose message or report was lost never get an outcome: when the window stays closed with no
        outcome for as long as reconciliation waits (``reconcile_after``, at least 4x the slowest task) and the
        queue is empty, they stop counting (reconciliation republishes them later), so the publisher never stalls.
        """
        last_sync = waiting_since = time.monotonic()
        settings = self.context.settings
        while not self.stop_event.is_set():
            allowed = self.window.allowance()
            if allowed is None or allowed > 0:
                return max(1, min(limit, BATCH if allowed is None else allowed))
            if not self.running.is_set():
                return 1
            self._flush(pend)  # the ledger shows what is outstanding while we wait
            now = time.monotonic()
            idle = now - max(self.last_progress, waiting_since)
            if idle > max(settings.reconcile_after, 4 * self.max_task_seconds) and \
                    self.context.broker.queue_depth(self.experiment) == 0:
                log.info("session %s: %d samples outstanding, no outcome for %.0f s and the queue empty: the start "
                         "window stops counting them", self.session_id, self.window.outstanding, idle)
                self._forgiven += self.window.outstanding
                self.window.resync(0)
                waiting_since = now
            elif now - last_sync > RESYNC_SECONDS:
                with self.context.db() as db:
                    self.window.resync(ledger.counts(db, self.session_id)["published"] - self._forgiven)
                last_sync = now
            self.window.wait(0.25)
        return 0

    def _take_tokens(self, pend: _Pending, wanted: int, least: int = 1) -> int:
        """Up to ``wanted`` tokens: those there now, else block until there are ``least`` (<= ``wanted``: the
        samples of one message, so that a message is not cut short by the rate); 0 if stopped.

        Before blocking, the rows held are committed when the wait is long (over :data:`BATCH_SECONDS`) or they
        have waited that long already: not before every token. At a publish rate of tens per second a commit per
        token was a ledger transaction per sample (the manager's CPU with the health controller steering was
        ~3x that of the same run flat out); a restart still republishes at most :data:`BATCH_SECONDS` of
        samples (the cursor moves with the commit) and skips none.
        """
        taken, wait = 0, 0.0
        while taken < wanted and (wait := self.bucket.try_acquire()) == 0.0:
            taken += 1
        if taken >= least:
            return taken
        wait += (least - taken - 1) / max(self.bucket.rate, 1e-9)
        if wait > BATCH_SECONDS or time.monotonic() - pend.last_commit > BATCH_SECONDS:
            self._flush(pend)
        while taken < least:
            if not self.bucket.acquire(self.stop_event):
                return 0
            taken += 1
        return taken

    def _next_batch(self, stream, block: FeaturesBlock, pend: _Pending,
                    size: int) -> tuple[list[tuple[int, Sample]], bool]:
        """The next ``size`` samples to publish from ``stream``; cached ones on the way get their ledger rows.

        Returns:
            ``(batch, exhausted)``: ``(index, sample)`` pairs, and whether the stream ended.
        """
        batch: list[tuple[int, Sample]] = []
        for index, sample in stream:
            if block.is_cached(sample):
                pend.rows.append((sample.id, "cached", None))
                pend.cursor = index + 1
                if len(pend.rows) >= BATCH:
                    if not batch:
                        self._flush(pend)
                    else:
                        return batch, False
                continue
            batch.append((index, sample))
            pend.cursor = index + 1
            if len(batch) >= size or len(pend.rows) + len(batch) >= BATCH:
                return batch, False
        return batch, True

    def _flush(self, pend: _Pending) -> None:
        if pend.rows or pend.cursor > pend.committed:
            self._commit(pend.rows, pend.cursor, pend.published)
            pend.committed = pend.cursor
            with self._in_flight_lock:  # after the commit: the ledger has them now
                self._in_flight.difference_update(sample_id for sample_id, _status, _reason in pend.rows)
        pend.rows, pend.published, pend.last_commit = [], 0, time.monotonic()

    def _commit(self, rows: list[tuple[str, str, str | None]], cursor: int, published: int) -> None:
        with self.context.db() as db:
            ledger.add_samples(db, self.session_id, rows)
            row = known_session(db, self.session_id)
            row.cursor = max(row.cursor, cursor)
            row.published += published
            db.commit()

    def finish(self, state: SessionState, error: str | None = None) -> None:
        """End the session with the terminal ``state`` (unless it ended already, e.g. cancelled meanwhile: its end
        stays) and tell the owner of this thread (``on_end``): the session's workers stop too.

        Args:
            state: a terminal state (completed, or failed with ``error``).
            error: why the session failed.

        Raises:
            InvalidTransition: ``state`` is not terminal.
        """
        with self.context.db() as db:
            row = known_session(db, self.session_id)
            lifecycle.end(row, state, error=error)
            db.commit()
        for listener in list(self.context.on_end):
            try:
                listener(self.session_id)
            except Exception:  # a listener's failure never keeps the session's workers running
                log.exception("session %s: a listener of its end failed", self.session_id)
        self._on_end(self.session_id)
