"""The manager's core, independent of HTTP: experiments, sessions and their publisher threads, outcomes."""

from __future__ import annotations

import logging
import threading
import uuid
from contextlib import AbstractContextManager, suppress
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from labswarm.config import ExperimentConfig, parse_experiment
from labswarm.deploy.base import Launcher
from labswarm.deploy.sessions import NONE, session_launcher
from labswarm.errors import ConfigError, DeployError, LabswarmError
from labswarm.manager import ledger
from labswarm.manager.db import ExperimentRow, SessionRow, make_engine, make_sessionmaker, utcnow
from labswarm.manager.session import SessionRunner
from labswarm.queue.app import TASK_NAME, app_queue, declare_queue, make_celery, queue_name
from labswarm.sample import Sample, count_samples
from labswarm.settings import Settings

log = logging.getLogger(__name__)

#: Session statuses in which a publisher thread runs.
ACTIVE = ("running", "paused")


class NotFound(LabswarmError):
    """No experiment or session of that name / id."""


class Conflict(LabswarmError):
    """The request conflicts with the current state (e.g. a second active session of one experiment)."""


class Manager:
    """Owns the database, the Celery app (publishing only) and one :class:`SessionRunner` per active session.

    Args:
        settings: runtime settings (database and broker URLs, attempts, rates).
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        settings.home.mkdir(parents=True, exist_ok=True)
        self.broker_url = settings.resolved_broker_url()
        self.engine = make_engine(settings.resolved_database_url())
        self._sessionmaker = make_sessionmaker(self.engine)
        self.celery = make_celery(self.broker_url, settings.max_queue_length)
        self._runners: dict[str, SessionRunner] = {}
        self._lock = threading.Lock()
        self._configs: dict[str, ExperimentConfig] = {}
        self._launchers: dict[str, Launcher] = {}

    def db(self) -> AbstractContextManager[Session]:
        """A new database session (use as a context manager)."""
        return self._sessionmaker()

    # lifecycle
    def start(self) -> None:
        """Resume every session left active by a previous manager process."""
        with self.db() as db:
            ids = list(db.scalars(select(SessionRow.id).where(SessionRow.status.in_(ACTIVE))))
        self._restore_launchers()
        for session_id in ids:
            log.info("resuming session %s", session_id)
            self._spawn(session_id)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every publisher thread; their sessions stay active in the database, to be resumed."""
        with self._lock:
            runners = list(self._runners.values())
            self._runners.clear()
        for runner in runners:
            runner.stop()
        for runner in runners:
            runner.join(timeout)

    def _spawn(self, session_id: str) -> SessionRunner:
        runner = SessionRunner(self, session_id)
        with self._lock:
            self._runners[session_id] = runner
        runner.start()
        return runner

    def session_finished(self, session_id: str) -> None:
        """Called by a runner when its session ended."""
        with self._lock:
            self._runners.pop(session_id, None)
        self._stop_launcher(session_id)

    # experiments
    def register_experiment(self, data: dict[str, Any] | str) -> ExperimentRow:
        """Validate and store an experiment (replacing one of the same name without an active session).

        Raises:
            ConfigError: invalid configuration.
            Conflict: the experiment has an active session and a different configuration.
        """
        config = parse_experiment(data, source="request body")
        with self.db() as db:
            row = db.get(ExperimentRow, config.name)
            changed = row is not None and row.fingerprint != config.fingerprint()
            if changed and (active := _active_session(db, config.name)):
                raise Conflict(f"experiment {config.name!r} has an active session {active}; cancel it first")
            if row is None:
                row = ExperimentRow(name=config.name)
                db.add(row)
            row.config = config.model_dump(mode="json")
            row.fingerprint = config.fingerprint()
            row.updated_at = utcnow()
            db.commit()
            self._configs.pop(config.name, None)
            return row

    def experiments(self) -> list[ExperimentRow]:
        with self.db() as db:
            return list(db.scalars(select(ExperimentRow).order_by(ExperimentRow.name)))

    def experiment(self, name: str) -> ExperimentRow:
        with self.db() as db:
            row = db.get(ExperimentRow, name)
        if row is None:
            raise NotFound(f"no experiment {name!r}")
        return row

    def experiment_config(self, name: str) -> ExperimentConfig:
        """The validated configuration of a registered experiment.

        Raises:
            NotFound: no such experiment.
        """
        cached = self._configs.get(name)
        if cached is None:
            cached = self._configs[name] = ExperimentConfig.model_validate(self.experiment(name).config)
        return cached

    # sessions
    def start_session(self, experiment: str, rate: float | None = None, *, weight: float = 1.0) -> SessionRow:
        """Start a session of ``experiment`` publishing at ``rate`` tasks/s (default from settings).

        ``weight`` (> 0) is its share of the workers it shares with other sessions, relative to theirs.

        Raises:
            ValueError: ``weight`` is not > 0.
            NotFound: unknown experiment.
            Conflict: the experiment already has an active session.
            DatasetError: the dataset cannot be read.
        """
        if not weight > 0:
            raise ValueError("weight must be > 0")
        config = self.experiment_config(experiment)
        with self.db() as db:
            if active := _active_session(db, experiment):
                raise Conflict(f"experiment {experiment!r} already has an active session {active}")
        total = count_samples(config)
        self.declare_queue(experiment)
        row = SessionRow(
            id=uuid.uuid4().hex[:12], experiment=experiment, status="running",
            rate=rate or self.settings.default_rate, weight=weight, total=total, fingerprint=config.fingerprint(),
            started_at=utcnow(),
        )
        with self.db() as db:
            db.add(row)
            db.commit()
        self._spawn(row.id)
        return row

    def sessions(self) -> list[SessionRow]:
        with self.db() as db:
            return list(db.scalars(select(SessionRow).order_by(SessionRow.created_at.desc())))

    def session(self, session_id: str) -> SessionRow:
        with self.db() as db:
            row = db.get(SessionRow, session_id)
        if row is None:
            raise NotFound(f"no session {session_id!r}")
        return row

    def progress(self, session_id: str) -> dict[str, Any]:
        """A session's progress: counts per status, rate, times, samples/s."""
        row = self.session(session_id)
        with self.db() as db:
            counts = ledger.counts(db, session_id)
        end = row.finished_at or utcnow()
        start = row.started_at or row.created_at
        elapsed = max((_aware(end) - _aware(start)).total_seconds(), 1e-9)
        finished = counts["done"] + counts["cached"] + counts["failed"]
        runner = self._runners.get(session_id)
        return {
            "id": row.id, "experiment": row.experiment, "status": row.status,
            "phase": runner.phase if runner else None,
            "total": row.total, "published": row.published, "republished": row.republished,
            "done": counts["done"], "cached": counts["cached"], "failed": counts["failed"],
            "pending": counts["published"], "finished": finished,
            "rate": runner.bucket.rate if runner else row.rate, "weight": row.weight,
            "samples_per_s": counts["done"] / elapsed,
            "created_at": row.created_at, "started_at": row.started_at, "finished_at": row.finished_at,
            "elapsed_s": elapsed, "error": row.error, "queue": queue_name(row.experiment),
            "launcher": row.launcher,
        }

    def _control(self, session_id: str, *, status: str | None = None, rate: float | None = None,
                 weight: float | None = None) -> SessionRow:
        """Change an active session's status, rate and/or weight in the database.

        Raises:
            NotFound: no such session.
            Conflict: the session has ended.
        """
        with self.db() as db:
            row = db.get(SessionRow, session_id)
            if row is None:
                raise NotFound(f"no session {session_id!r}")
            if row.status not in ACTIVE:
                raise Conflict(f"session {session_id} is {row.status}")
            if status is not None:
                row.status = status
                if status in ("cancelled", "completed"):
                    row.finished_at = utcnow()
            if rate is not None:
                row.rate = rate
            if weight is not None:
                row.weight = weight
            db.commit()
            return row

    def set_rate(self, session_id: str, rate: float) -> SessionRow:
        """Set the publish rate (tasks/s) of a session, live."""
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
        row = self._control(session_id, status="paused")
        if (runner := self._runners.get(session_id)) is not None:
            runner.pause()
        return row

    def resume(self, session_id: str) -> SessionRow:
        row = self._control(session_id, status="running")
        runner = self._runners.get(session_id)
        if runner is not None:
            runner.resume()
        else:
            self._spawn(session_id)
        return row

    def cancel(self, session_id: str) -> SessionRow:
        """Cancel a session: stop publishing and purge its queue."""
        row = self._control(session_id, status="cancelled")
        with self._lock:
            runner = self._runners.pop(session_id, None)
        if runner is not None:
            runner.stop()
            runner.join(10)
        self.purge_queue(row.experiment)
        self._stop_launcher(session_id, raise_errors=True)
        return row

    # workers (launchers)
    def launch(self, session_id: str, launcher: str, workers: int) -> None:
        """Start ``workers`` workers for an active session with the launcher named ``launcher``.

        ``none`` starts nothing (workers are run by someone else). The launcher is recorded with the session: the
        manager scales it (:meth:`set_workers`), stops it when the session ends or is cancelled, and finds it
        again after a restart. A session that has already ended (e.g. every sample was cached, so it completed
        right after :meth:`start_session`) has nothing left to run: nothing is started. One that ends while its
        workers start has them stopped again.

        Raises:
            NotFound: no such session.
            Conflict: the session already has a launcher.
            ConfigError: unknown launcher name, or invalid ``swarm_*`` settings; the session is then failed.
            DeployError: the workers could not be started; the session is then failed with that reason.
            ValueError: ``workers`` < 0.
        """
        if workers < 0:
            raise ValueError(f"workers must be >= 0, got {workers}")
        row = self.session(session_id)
        if launcher == NONE:
            return
        if row.status not in ACTIVE:
            return  # it ended already (all samples cached, cancelled, failed): no workers to run
        if session_id in self._launchers:
            raise Conflict(f"session {session_id} already has its launcher")
        try:
            instance = session_launcher(launcher, row.experiment, session_id, self.settings)
            instance.start(workers)
        except (ConfigError, DeployError) as exc:
            self._fail_session(session_id, f"{launcher} launcher: {exc}")
            raise
        # registered before the status is read again: a session that ends from now on finds its launcher in
        # session_finished; one that ended during start() is seen here. _stop_launcher pops it, so exactly one of
        # the two stops it
        self._launchers[session_id] = instance
        with self.db() as db:
            current = db.get(SessionRow, session_id)
            current.launcher = launcher
            db.commit()
            ended = current.status not in ACTIVE
        if ended:
            self._stop_launcher(session_id)

    def set_workers(self, session_id: str, workers: int) -> None:
        """Run ``workers`` workers for an active session from now on, through its launcher.

        Raises:
            NotFound: no such session.
            Conflict: the session has ended, or its workers are not the manager's (launcher ``none``).
            DeployError: the launcher failed (e.g. the Docker engine refused).
            ValueError: ``workers`` < 0.
        """
        if workers < 0:
            raise ValueError(f"workers must be >= 0, got {workers}")
        row = self.session(session_id)
        if row.status not in ACTIVE:
            raise Conflict(f"session {session_id} is {row.status}")
        launcher = self._launchers.get(session_id)
        if launcher is None:
            raise Conflict(f"session {session_id} has no launcher (started with launcher {row.launcher!r}): its "
                           "workers are started outside the manager (labswarm worker ...)")
        launcher.scale(workers)

    def _restore_launchers(self) -> None:
        """Rebuild the launchers of the active sessions that have one (after a manager restart)."""
        with self.db() as db:
            rows = list(db.execute(select(SessionRow.id, SessionRow.experiment, SessionRow.launcher)
                                   .where(SessionRow.status.in_(ACTIVE), SessionRow.launcher != NONE)))
        for session_id, experiment, name in rows:
            try:
                instance = session_launcher(name, experiment, session_id, self.settings)
            except LabswarmError as exc:
                log.error("session %s: cannot restore its %s launcher: %s", session_id, name, exc)
                continue
            if instance is not None:
                self._launchers.setdefault(session_id, instance)

    def _stop_launcher(self, session_id: str, raise_errors: bool = False) -> None:
        """Stop the workers of a session that ended, if the manager started them."""
        launcher = self._launchers.pop(session_id, None)
        if launcher is None:
            return
        try:
            launcher.stop()
        except LabswarmError as exc:
            log.error("session %s: cannot stop its workers: %s", session_id, exc)
            if raise_errors:
                raise

    def _fail_session(self, session_id: str, error: str) -> None:
        """Stop an active session's publisher and record it as failed with ``error``."""
        with self._lock:
            runner = self._runners.pop(session_id, None)
        if runner is not None:
            runner.stop()
            runner.join(10)
        with self.db() as db:
            row = db.get(SessionRow, session_id)
            if row.status in ACTIVE:
                row.status, row.error, row.finished_at = "failed", error, utcnow()
            db.commit()
            experiment = row.experiment
        self.purge_queue(experiment)

    def failures(self, session_id: str, limit: int = 1000, offset: int = 0) -> list[dict[str, Any]]:
        self.session(session_id)
        with self.db() as db:
            rows = ledger.failures(db, session_id, limit, offset)
        return [{"sample_id": r.sample_id, "reason": r.reason, "attempts": r.attempts} for r in rows]

    # worker side
    def record_outcomes(self, session_id: str, outcomes: list[dict[str, Any]]) -> int:
        self.session(session_id)
        with self.db() as db:
            n = ledger.record_outcomes(db, session_id, outcomes)
            db.commit()
        runner = self._runners.get(session_id)
        if runner is not None and outcomes:
            runner.note_outcomes(max(float(o.get("seconds") or 0.0) for o in outcomes))
        return n

    def redelivered(self, session_id: str, sample_id: str) -> bool:
        self.session(session_id)
        with self.db() as db:
            run = ledger.redelivery(db, session_id, sample_id, self.settings.max_attempts)
            db.commit()
        return run

    # broker
    def declare_queue(self, experiment: str) -> None:
        """Declare the experiment's durable queue (idempotent)."""
        declare_queue(self.celery, experiment)

    def publish(self, session_id: str, experiment: str, sample: Sample, stop: threading.Event) -> bool:
        """Publish one task, retrying with backoff while the broker is unreachable; ``False`` if stopped first."""
        queue = app_queue(self.celery, experiment)
        delay = 0.2
        while not stop.is_set():
            try:
                self.celery.send_task(
                    TASK_NAME, args=(session_id, sample.to_dict()), queue=queue,
                    exchange=queue.exchange, routing_key=queue.routing_key,
                    retry=True, retry_policy={"max_retries": 3, "interval_start": 0.2, "interval_step": 0.5},
                )
                return True
            except Exception as exc:  # broker down, or the queue full (reject-publish): wait, publish again
                log.warning("publish failed (%s: %s); retrying in %.1f s", type(exc).__name__, exc, delay)
                if stop.wait(delay):
                    return False
                delay = min(delay * 2, 2.0)
                with suppress(Exception):
                    self.declare_queue(experiment)
        return False

    def queue_depth(self, experiment: str) -> int | None:
        """Ready messages in the experiment's queue, or ``None`` when the broker cannot be asked."""
        try:
            with self.celery.connection_for_read() as conn:
                ok = conn.default_channel.queue_declare(queue=queue_name(experiment), passive=True)
                return int(ok.message_count)
        except Exception as exc:
            log.debug("queue depth of %s unknown: %s", experiment, exc)
            return None

    def purge_queue(self, experiment: str) -> None:
        try:
            with self.celery.connection_for_write() as conn:
                conn.default_channel.queue_purge(queue_name(experiment))
        except Exception as exc:
            log.warning("cannot purge the queue of %s: %s", experiment, exc)


def _active_session(db: Session, experiment: str) -> str | None:
    """The id of the experiment's running or paused session, if any."""
    return db.scalar(select(SessionRow.id).where(SessionRow.experiment == experiment, SessionRow.status.in_(ACTIVE)))


def _aware(value):
    from datetime import UTC

    return value if value.tzinfo else value.replace(tzinfo=UTC)
