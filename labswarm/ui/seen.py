"""Workers and learners seen, for the dashboard's overview and session pages (read only).

A session's workers are seen two ways: the workers its launcher runs (``Launcher.workers``: local processes alive,
or a swarm service's running containers; ``None`` when the manager runs none for it, launcher ``none``) and the
consumers the broker sees on its queue (RabbitMQ's consumer count, read with a passive queue declare; ``None``
on the embedded broker, which has no such count: shown "unknown"). A training job's learners are its current
attempt's ``job_learners`` rows that have not ended, with their last heartbeat.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select

from labswarm.errors import LabswarmError
from labswarm.queue.app import is_embedded, queue_name
from labswarm.sessions.service import SessionService

log = logging.getLogger(__name__)


def launcher_workers(sessions: SessionService, session_id: str) -> int | None:
    """Workers the session's launcher runs now, or ``None`` when the manager runs none for it (or cannot tell:
    a swarm engine that does not answer is logged, not raised)."""
    launcher = sessions.launchers.get(session_id)
    if launcher is None:
        return None
    try:
        return int(launcher.workers)
    except LabswarmError as exc:
        log.info("workers of session %s unknown: %s", session_id, exc)
        return None


def consumers(sessions: SessionService, experiment: str) -> int | None:
    """Consumers the broker sees on the experiment's queue (RabbitMQ: a passive declare's consumer count), or
    ``None`` on the embedded broker (no such count) or when the broker does not answer."""
    broker = sessions.broker
    if is_embedded(broker.url):
        return None
    try:
        with broker.celery.connection_for_read() as conn:
            ok = conn.default_channel.queue_declare(queue=queue_name(experiment), passive=True)
            return int(ok.consumer_count)
    except Exception as exc:  # a queue not declared yet, a broker down: unknown, never an error page
        log.debug("consumers of %s unknown: %s", experiment, exc)
        return None


def session_workers(sessions: SessionService, progress: dict[str, Any]) -> dict[str, Any]:
    """``{"workers": int | None, "consumers": int | None}`` for a session as :meth:`SessionService.progress`
    shows it (see the module docstring)."""
    return {"workers": launcher_workers(sessions, progress["id"]),
            "consumers": consumers(sessions, progress["experiment"])}


def _iso(value: datetime | None) -> str | None:
    return value.replace(tzinfo=UTC).isoformat() if value is not None else None


def learners_seen(sessions: SessionService, job_ids: Iterable[str], owner: str | None = None) -> list[dict[str, Any]]:
    """The learners of the jobs that hold slots now (pending, running, halting, storing), their current attempt's
    rows that have not ended.

    Args:
        sessions: the session service (its database holds the jobs' tables too).
        job_ids: ignored when empty; else only these jobs.
        owner: only this user's jobs; ``None``: everyone's.

    Returns:
        One dict per learner, by job then rank: ``job``, ``name``, ``attempt``, ``rank``, ``host``, ``pid``,
        ``last_seen`` (ISO 8601 UTC, ``None`` before its first heartbeat), ``age_s`` (seconds since it, or
        ``None``), ``progress`` (its last report: ``epoch``, ``step``, ... or ``{}``).
    """
    from labswarm.jobs.records.models import JobRow, LearnerRow
    from labswarm.jobs.spec.states import HOLDS_SLOTS

    stmt = (select(LearnerRow, JobRow.name).join(JobRow, JobRow.id == LearnerRow.job_id)
            .where(JobRow.status.in_([s.value for s in HOLDS_SLOTS]), LearnerRow.attempt == JobRow.attempt,
                   LearnerRow.ended_at.is_(None))
            .order_by(LearnerRow.job_id, LearnerRow.rank))
    ids = list(job_ids)
    if ids:
        stmt = stmt.where(JobRow.id.in_(ids))
    if owner is not None:
        stmt = stmt.where(JobRow.owner == owner)
    now = datetime.now(UTC)
    with sessions.db() as db:
        rows = list(db.execute(stmt))
    return [{"job": row.job_id, "name": name, "attempt": row.attempt, "rank": row.rank, "host": row.host,
             "pid": row.pid, "last_seen": _iso(row.last_seen),
             "age_s": (now - row.last_seen.replace(tzinfo=UTC)).total_seconds() if row.last_seen else None,
             "progress": dict(row.progress or {})} for row, name in rows]
