"""The session service, independent of HTTP: session lifecycle, publisher threads, outcomes.

It composes the experiment registry (:mod:`labswarm.sessions.registry`), the broker client
(:mod:`labswarm.sessions.broker`), the launchers of the sessions whose workers it runs
(:mod:`labswarm.sessions.launchers`) and one :class:`~labswarm.sessions.runner.SessionRunner` thread per active
session. Its parts get the runtime they share (:class:`~labswarm.sessions.context.SessionContext`: database,
settings, broker) and a hook, never the service. A session's state changes only through
:func:`labswarm.sessions.lifecycle.transition` (the table: :mod:`labswarm.sessions.states`). The manager hosts it
beside the training-jobs service.

Owners (issue 11): a session records the user who started it (:attr:`SessionRow.owner`). Reads and controls
take an ``owner`` filter (``None``: an admin, who sees every session); another user's session is
:class:`~labswarm.errors.NotFound`, as one that does not exist.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from labswarm.auth.overrides import PolicyStore
from labswarm.db import make_engine, make_sessionmaker, utcnow
from labswarm.errors import Conflict, LabswarmError, NotFound
from labswarm.paths import DataRoots
from labswarm.sessions import ledger, lifecycle, queries
from labswarm.sessions import outcomes as outcomes_of
from labswarm.sessions.broker import BrokerClient
from labswarm.sessions.context import SessionContext
from labswarm.sessions.history import HistoryRecorder
from labswarm.sessions.launchers import SessionLaunchers
from labswarm.sessions.models import (
    ACTIVE,
    DEFAULT_OWNER,
    ONE_ACTIVE_INDEX,
    SessionRow,
    active_session,
    known_session,
)
from labswarm.sessions.queries import MAX_FAILURES_PAGE, MAX_SESSIONS_PAGE, SESSION_STATUSES, SESSIONS_PAGE
from labswarm.sessions.registry import ExperimentRegistry
from labswarm.sessions.runner import SessionRunner
from labswarm.sessions.states import SessionState
from labswarm.settings import Settings

__all__ = ["MAX_FAILURES_PAGE", "MAX_SESSIONS_PAGE", "SESSIONS_PAGE", "SESSION_STATUSES", "SessionService"]

log = logging.getLogger(__name__)


class SessionService:
    """Owns the sessions: their rows, publisher threads, launchers; the registry and broker client they use.

    Args:
        settings: runtime settings (database and broker URLs, attempts, rates).
        engine: the manager's database engine; default: one for ``settings``' database URL.
        broker: the broker client the publishers use; default: a :class:`BrokerClient` for ``settings``' broker
            (a test passes one of the same interface).
    """

    def __init__(self, settings: Settings, engine: Engine | None = None, broker: BrokerClient | None = None) -> None:
        self.settings = settings
        settings.home.mkdir(parents=True, exist_ok=True)
        self.engine = engine or make_engine(settings.resolved_database_url())
        self._sessionmaker = make_sessionmaker(self.engine)
        self.registry = ExperimentRegistry(self.db, DataRoots.from_settings(settings))
        #: What the service's parts share (runners, reconciliation, launchers), instead of the service itself.
        self.context = SessionContext(db=self.db, settings=settings, broker=broker or BrokerClient(settings, self.db))
        #: the users' quotas (labswarm.auth.overrides): active_sessions checked at a start, workers by launchers
        self.policies = PolicyStore.from_settings(settings, self.db)
        self.launchers = SessionLaunchers(self.context, self.fail_session, self.policies)
        self._runners: dict[str, SessionRunner] = {}
        self._lock = threading.Lock()
        self.history = HistoryRecorder(self.db, self.progress_of)  # runs from start(): every session's history

    @property
    def broker(self) -> BrokerClient:
        """The broker client of the sessions' queues."""
        return self.context.broker

    def db(self) -> AbstractContextManager[Session]:
        """A new database session (use as a context manager)."""
        return self._sessionmaker()

    # lifecycle
    def start(self) -> None:
        """Resume the sessions left active by a previous manager process; keep every session's history.

        Every stored experiment is checked again (configuration and data roots): an invalid one is logged and
        stays listed as invalid (no session starts on it). A session whose experiment is invalid, or whose
        publisher cannot be made, is failed with the reason in its ``error`` (its queue purged, its launcher
        stopped); the others resume.
        """
        for name, invalid in self.registry.problems().items():
            log.error("experiment %s is invalid and will not be served: %s", name, invalid)
        with self.db() as db:
            rows = list(db.execute(select(SessionRow.id, SessionRow.experiment)
                                   .where(SessionRow.status.in_(ACTIVE)).order_by(SessionRow.created_at)))
        self.launchers.restore()
        for session_id, experiment in rows:
            problem = self.registry.problem(experiment)
            if problem is None:
                log.info("resuming session %s", session_id)
                try:
                    self._spawn(session_id)
                    continue
                except LabswarmError as exc:
                    problem = f"cannot resume the session after a manager restart: {exc}"
            log.error("session %s (experiment %s) failed: %s", session_id, experiment, problem)
            self.fail_session(session_id, problem)
            self.launchers.stop(session_id)
        self.history.begin()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every publisher thread; their sessions stay active in the database, to be resumed."""
        with self._lock:
            runners = list(self._runners.values())
            self._runners.clear()
        for runner in runners:
            runner.stop()
        for runner in runners:
            runner.join(timeout)
        self.history.stop()

    def _spawn(self, session_id: str) -> SessionRunner:
        """Start the publisher thread of an active session.

        Raises:
            NotFound: no such session.
            LabswarmError: its experiment's configuration cannot be read (e.g. ConfigError).
        """
        row = self.session(session_id)
        runner = SessionRunner(self.context, row, self.registry.config(row.experiment), self.session_finished)
        with self._lock:
            self._runners[session_id] = runner
        runner.start()
        return runner

    def session_finished(self, session_id: str) -> None:
        """Called by a runner when it has ended its session: the runner is forgotten, the workers stop too."""
        with self._lock:
            self._runners.pop(session_id, None)
        self.launchers.stop(session_id)

    # sessions
    def start_session(self, experiment: str, rate: float | None = None, *, weight: float = 1.0,
                      owner: str = DEFAULT_OWNER, admin: bool = True, follow: bool = False) -> SessionRow:
        """Start a session of ``experiment`` publishing at ``rate`` tasks/s (default from settings); with ``follow``,
        the rows appended to its labels CSV later too, until cancelled (:mod:`labswarm.sessions.follow`).

        ``weight`` (> 0) is its share of the workers it shares with other sessions, relative to theirs.
        ``owner`` (default :data:`~labswarm.sessions.models.DEFAULT_OWNER`) is the user starting it, recorded as
        the session's owner; unless ``admin``, the experiment must be theirs.

        Raises:
            ValueError: ``weight`` is not > 0.
            NotFound: unknown experiment, or another user's (``admin`` false).
            ConfigError: the experiment is invalid (see :meth:`ExperimentRegistry.problem`).
            Conflict: the experiment already has an active session (its id told only to who may see it).
            DatasetError: the dataset cannot be read.
            QuotaExceeded: the owner's ``active_sessions`` quota is reached (:mod:`labswarm.auth.quotas`; HTTP
                429; two starts at the same moment are not counted against each other).
        """
        if not weight > 0:
            raise ValueError("weight must be > 0")
        stored = self.registry.get(experiment, None if admin else owner)
        with self.db() as db:
            if active := active_session(db, experiment):
                shown = active if admin or known_session(db, active).owner == owner else "(another user's)"
                raise Conflict(f"experiment {experiment!r} already has an active session {shown}")
            mine = db.scalar(select(func.count()).select_from(SessionRow).where(
                SessionRow.owner == owner, SessionRow.status.in_([state.value for state in ACTIVE])))
            self.policies.of(owner).check(owner, "active_sessions", int(mine or 0))
        # its labels CSV's rows checked again (the file may have changed since registration) and counted: one read
        config, clips = self.registry.config_and_clips(experiment, stored)
        total = clips * len(config.transformations)
        self.broker.declare_queue(experiment)
        row = SessionRow(
            id=uuid.uuid4().hex[:12], experiment=experiment, status=SessionState.RUNNING.value,
            rate=rate or self.settings.default_rate, weight=weight, total=total, fingerprint=config.fingerprint(),
            started_at=utcnow(), owner=owner, follow=follow,
        )
        with self.db() as db:
            db.add(row)
            try:
                db.commit()
            except IntegrityError as exc:
                # a concurrent start won: the partial unique index allows one active session per experiment
                db.rollback()
                active = active_session(db, experiment)
                message = str(exc.orig)
                if active is None and ONE_ACTIVE_INDEX not in message and "sessions.experiment" not in message:
                    raise
                raise Conflict(f"experiment {experiment!r} already has an active session") from None
        self._spawn(row.id)
        return row

    def sessions(self, status: Sequence[str] | None = None, limit: int = SESSIONS_PAGE,
                 offset: int = 0, owner: str | None = None) -> list[SessionRow]:
        """One page of sessions, newest first (creation time, then id).

        Args:
            status: only sessions in these statuses (e.g. ``ACTIVE``); ``None``: any.
            owner: only the sessions of this user; ``None``: everyone's.
            limit: sessions per page, 1 to :data:`MAX_SESSIONS_PAGE` (default :data:`SESSIONS_PAGE`).
            offset: sessions skipped.

        Raises:
            ValueError: ``limit`` or ``offset`` out of range, or an unknown status (the message names the field).
        """
        with self.db() as db:
            return queries.sessions_page(db, status, limit, offset, owner)

    def session(self, session_id: str, owner: str | None = None) -> SessionRow:
        """The row of one session; when ``owner`` is given, it must be theirs.

        Raises:
            NotFound: no such session, or (``owner`` given) another user's.
        """
        with self.db() as db:
            row = db.get(SessionRow, session_id)
        if row is None or (owner is not None and row.owner != owner):
            raise NotFound(f"no session {session_id!r}")
        return row

    def progress(self, session_id: str, owner: str | None = None) -> dict[str, Any]:
        """A session's progress: counts per status, rate (tasks/s), times, samples/s.

        The counts are the counters on the session row (one row read, whatever the session's size: see
        :mod:`~labswarm.sessions.ledger`). The first read of an active session by this manager process recounts
        them from the ledger, the truth (one ``GROUP BY`` per active session per process start).

        Args:
            owner: when given, the session must be this user's (checked on the same row read).

        Raises:
            NotFound: no such session, or (``owner`` given) another user's.
        """
        return self.progress_of(self.session(session_id, owner))

    def progress_of(self, row: SessionRow) -> dict[str, Any]:
        """:meth:`progress` of a session row just read (e.g. a page of :meth:`sessions`): no second read of it,
        but for the recount of an active session's first read by this process.

        Raises:
            NotFound: the session was deleted before its recount.
        """
        session_id = row.id
        recounted = self.__dict__.setdefault("_recounted", set())
        if row.status in ACTIVE and session_id not in recounted:
            with self.db() as db:
                ledger.recount(db, session_id)
                db.commit()
            recounted.add(session_id)
            row = self.session(session_id)
        runner = self._runners.get(session_id)
        return queries.progress(row) if runner is None else queries.progress(row, runner.phase, runner.bucket.rate)

    def _control(self, session_id: str, *, state: SessionState | None = None, rate: float | None = None,
                 weight: float | None = None) -> SessionRow:
        """Change an active session's state (a request for the state it is in already changes nothing), rate
        and/or weight in the database.

        Raises:
            NotFound: no such session.
            Conflict: the session has ended.
            InvalidTransition: the state change is not in the transition table.
        """
        with self.db() as db:
            row = db.get(SessionRow, session_id)
            if row is None:
                raise NotFound(f"no session {session_id!r}")
            if row.status not in ACTIVE:
                raise Conflict(f"session {session_id} is {row.status}")
            if state is not None and row.status != state:
                lifecycle.transition(row, state)
            if rate is not None:
                row.rate = rate
            if weight is not None:
                row.weight = weight
            db.commit()
            return row

    def set_rate(self, session_id: str, rate: float) -> SessionRow:
        """Set the publish rate (tasks/s) of a session, live.

        Raises:
            ValueError: ``rate`` is not > 0.
            NotFound: no such session.
            Conflict: the session has ended.
        """
        if not rate > 0:
            raise ValueError("rate must be > 0")
        row = self._control(session_id, rate=rate)
        runner = self._runners.get(session_id)
        if runner is not None:
            runner.set_rate(rate)
        return row

    def set_weight(self, session_id: str, weight: float) -> SessionRow:
        """Set the weight of an active session (its share of shared workers; the health controller applies it).

        Raises:
            ValueError: ``weight`` is not > 0.
            NotFound: no such session.
            Conflict: the session has ended.
        """
        if not weight > 0:
            raise ValueError("weight must be > 0")
        return self._control(session_id, weight=weight)

    def pause(self, session_id: str) -> SessionRow:
        """Stop publishing until :meth:`resume` (workers finish what is queued)."""
        row = self._control(session_id, state=SessionState.PAUSED)
        if (runner := self._runners.get(session_id)) is not None:
            runner.pause()
        return row

    def resume(self, session_id: str) -> SessionRow:
        """Publish again after :meth:`pause`."""
        row = self._control(session_id, state=SessionState.RUNNING)
        runner = self._runners.get(session_id)
        if runner is not None:
            runner.resume()
        else:
            self._spawn(session_id)
        return row

    def cancel(self, session_id: str) -> SessionRow:
        """Cancel a session: stop publishing, purge its queue, stop the workers the manager runs for it."""
        row = self._control(session_id, state=SessionState.CANCELLED)
        with self._lock:
            runner = self._runners.pop(session_id, None)
        if runner is not None:
            runner.stop()
            runner.join(10)
        self.broker.purge_queue(row.experiment)
        self.launchers.stop(session_id, raise_errors=True)
        return row

    def fail_session(self, session_id: str, error: str) -> None:
        """Stop an active session's publisher and record it as failed with ``error``.

        Raises:
            NotFound: no such session.
        """
        with self._lock:
            runner = self._runners.pop(session_id, None)
        if runner is not None:
            runner.stop()
            runner.join(10)
        with self.db() as db:
            row = db.get(SessionRow, session_id)
            if row is None:
                raise NotFound(f"no session {session_id!r}")
            lifecycle.end(row, SessionState.FAILED, error=error)
            db.commit()
            experiment = row.experiment
        self.broker.purge_queue(experiment)

    def failures(self, session_id: str, limit: int = 1000, offset: int = 0) -> list[dict[str, Any]]:
        """Failed samples of a session with their reasons, by sample id: one page of at most ``limit``.

        Raises:
            ValueError: ``limit`` not in 1..:data:`MAX_FAILURES_PAGE` or ``offset`` < 0.
            NotFound: no such session.
        """
        with self.db() as db:
            return queries.failures_page(db, session_id, limit, offset)

    # worker side
    def record_outcomes(self, session_id: str, outcomes: list[dict[str, Any]], owner: str | None = None
                        ) -> tuple[int, list[dict[str, str]]]:
        """Apply a batch of worker outcomes to the ledger, for the samples of this session only (see
        :func:`labswarm.sessions.outcomes.record_outcomes`).

        Returns:
            ``(applied, rejected)``: how many were recorded, and ``{sample_id, reason}`` for each one rejected.

        Raises:
            NotFound: no such session, or (``owner`` given) another user's; nothing is recorded.
        """
        with self.db() as db:
            return outcomes_of.record_outcomes(db, self._runners.get(session_id), session_id, outcomes, owner)

    def redelivered(self, session_id: str, sample_id: str) -> bool:
        """Count a broker redelivery of a sample; ``False`` means the worker skips it (see ledger.redelivery)."""
        self.session(session_id)
        with self.db() as db:
            run = ledger.redelivery(db, session_id, sample_id, self.settings.max_attempts)
            db.commit()
        return run
