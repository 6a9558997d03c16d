"""Reads of the sessions for :class:`~labswarm.sessions.service.SessionService`: pages of sessions, a session's
progress, pages of its failed samples. Database reads only; what the publisher threads know (phase, rate in
force) is handed in.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from labswarm.db import utcnow
from labswarm.errors import NotFound
from labswarm.queue.app import queue_name
from labswarm.sessions import ledger
from labswarm.sessions.models import SessionRow
from labswarm.sessions.states import SessionState

#: Every status a session can have (the values of :class:`~labswarm.sessions.states.SessionState`).
SESSION_STATUSES: tuple[str, ...] = tuple(state.value for state in SessionState)
#: Sessions per page of :func:`sessions_page` by default, and the most one page may have.
SESSIONS_PAGE, MAX_SESSIONS_PAGE = 50, 1_000
#: The most failed samples one page of :func:`failures_page` may have.
MAX_FAILURES_PAGE = 10_000


def sessions_page(db: Session, status: Sequence[str] | None = None, limit: int = SESSIONS_PAGE,
                  offset: int = 0, owner: str | None = None) -> list[SessionRow]:
    """One page of sessions, newest first (creation time, then id).

    Args:
        db: a database session.
        status: only sessions in these statuses (e.g. ``ACTIVE``); ``None``: any.
        limit: sessions per page, 1 to :data:`MAX_SESSIONS_PAGE` (default :data:`SESSIONS_PAGE`).
        offset: sessions skipped.
        owner: only the sessions of this user; ``None``: everyone's.

    Raises:
        ValueError: ``limit`` or ``offset`` out of range, or an unknown status (the message names the field).
    """
    if not 1 <= limit <= MAX_SESSIONS_PAGE:
        raise ValueError(f"limit must be in 1..{MAX_SESSIONS_PAGE}, got {limit}")
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    stmt = select(SessionRow)
    if status is not None:
        if unknown := set(status) - set(SESSION_STATUSES):
            raise ValueError(f"status: unknown {sorted(unknown)}; known: {', '.join(SESSION_STATUSES)}")
        stmt = stmt.where(SessionRow.status.in_([str(s) for s in status]))
    if owner is not None:
        stmt = stmt.where(SessionRow.owner == owner)
    stmt = stmt.order_by(SessionRow.created_at.desc(), SessionRow.id.desc()).limit(limit).offset(offset)
    return list(db.scalars(stmt))


def progress(row: SessionRow, phase: str | None = None, rate: float | None = None) -> dict[str, Any]:
    """A session's progress from its row: counts per status, rate (tasks/s), times, samples/s.

    Args:
        row: the session's row (its counters are those of its ledger: :func:`~labswarm.sessions.ledger.counters`).
        phase: its publisher thread's phase (``publish``, ``reconcile``, ``follow``), ``None`` when it has none
            here.
        rate: the publish rate its thread applies now (tasks/s); ``None``: the row's.
    """
    counts = ledger.counters(row)
    end = row.finished_at or utcnow()
    start = row.started_at or row.created_at
    elapsed = max((_aware(end) - _aware(start)).total_seconds(), 1e-9)
    finished = counts["done"] + counts["cached"] + counts["failed"]
    return {
        "id": row.id, "experiment": row.experiment, "status": row.status, "phase": phase,
        "total": row.total, "published": row.published, "republished": row.republished,
        "done": counts["done"], "cached": counts["cached"], "failed": counts["failed"],
        "pending": counts["published"], "finished": finished,
        "rate": row.rate if rate is None else rate, "weight": row.weight,
        "samples_per_s": counts["done"] / elapsed,
        "created_at": row.created_at, "started_at": row.started_at, "finished_at": row.finished_at,
        "elapsed_s": elapsed, "error": row.error, "queue": queue_name(row.experiment),
        "launcher": row.launcher, "owner": row.owner, "follow": bool(row.follow),
    }


def failures_page(db: Session, session_id: str, limit: int = 1000, offset: int = 0) -> list[dict[str, Any]]:
    """Failed samples of a session with their reasons, by sample id: one page of at most ``limit``.

    Raises:
        ValueError: ``limit`` not in 1..:data:`MAX_FAILURES_PAGE` or ``offset`` < 0.
        NotFound: no such session.
    """
    if not 1 <= limit <= MAX_FAILURES_PAGE:
        raise ValueError(f"limit must be in 1..{MAX_FAILURES_PAGE}, got {limit}")
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    if db.get(SessionRow, session_id) is None:
        raise NotFound(f"no session {session_id!r}")
    rows = ledger.failures(db, session_id, limit, offset)
    return [{"sample_id": r.sample_id, "reason": r.reason, "attempts": r.attempts} for r in rows]


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)
