"""Reads and writes of the session ledger (one row per sample), portable across SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import case, func, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from labswarm.db import utcnow
from labswarm.sessions.models import SampleRow

#: Statuses that end a sample: nothing more will happen to it.
TERMINAL = ("done", "cached", "failed")
#: An outcome never downgrades a better one: a duplicate run's failure does not undo a success.
_RANK = {"published": 0, "failed": 1, "done": 2, "cached": 2}


def _insert(db: Session):
    return (postgresql.insert if db.bind.dialect.name == "postgresql" else sqlite.insert)(SampleRow)


def add_samples(db: Session, session_id: str, rows: Sequence[tuple[str, str, str | None]]) -> None:
    """Insert ledger rows ``(sample_id, status, reason)``; rows that exist already are left as they are."""
    if not rows:
        return
    now = utcnow()
    stmt = _insert(db).values([
        {"session_id": session_id, "sample_id": sid, "status": status, "reason": reason, "attempts": 1,
         "updated_at": now}
        for sid, status, reason in rows
    ])
    db.execute(stmt.on_conflict_do_nothing(index_elements=["session_id", "sample_id"]))


def record_outcomes(db: Session, session_id: str, outcomes: Iterable[dict]) -> int:
    """Upsert worker outcomes ``{sample_id, status, reason, seconds}``; returns how many were applied.

    One multi-row statement per batch. A sample already ``done`` or ``cached`` keeps that status
    (at-least-once delivery can run it twice).
    """
    now = utcnow()
    rows = []
    for outcome in outcomes:
        status = "done" if outcome["status"] == "computed" else outcome["status"]
        if status not in _RANK:
            continue
        rows.append({"session_id": session_id, "sample_id": outcome["sample_id"], "status": status,
                     "reason": outcome.get("reason"), "seconds": outcome.get("seconds"),
                     "finished_at": outcome.get("finished_at"), "attempts": 1, "updated_at": now})
    if not rows:
        return 0
    stmt = _insert(db)
    keep = or_(SampleRow.status == "done", SampleRow.status == "cached")  # no IN: not allowed in executemany
    stmt = stmt.on_conflict_do_update(
        index_elements=["session_id", "sample_id"],
        set_={
            "status": case((keep, SampleRow.status), else_=stmt.excluded.status),
            "reason": case((keep, SampleRow.reason), else_=stmt.excluded.reason),
            "seconds": stmt.excluded.seconds,
            "finished_at": stmt.excluded.finished_at,
            "updated_at": stmt.excluded.updated_at,
        },
    )
    db.execute(stmt, rows)
    return len(rows)


def counts(db: Session, session_id: str) -> dict[str, int]:
    """Samples per status (``published``, ``done``, ``cached``, ``failed``) in a session's ledger."""
    rows = db.execute(
        select(SampleRow.status, func.count()).where(SampleRow.session_id == session_id).group_by(SampleRow.status)
    ).all()
    out = dict.fromkeys(("published", "done", "cached", "failed"), 0)
    out.update({status: n for status, n in rows})
    return out


def pending(db: Session, session_id: str) -> dict[str, int]:
    """``sample_id -> attempts`` of every sample still without an outcome."""
    rows = db.execute(
        select(SampleRow.sample_id, SampleRow.attempts).where(
            SampleRow.session_id == session_id, SampleRow.status == "published"
        )
    ).all()
    return dict(rows)


def set_status(db: Session, session_id: str, sample_ids: Sequence[str], status: str, reason: str | None) -> None:
    """Give pending samples a terminal status (reconciliation)."""
    if sample_ids:
        db.execute(
            update(SampleRow)
            .where(SampleRow.session_id == session_id, SampleRow.sample_id.in_(sample_ids),
                   SampleRow.status == "published")
            .values(status=status, reason=reason, updated_at=utcnow())
        )


def add_attempt(db: Session, session_id: str, sample_ids: Sequence[str]) -> None:
    """Count one more delivery of each pending sample."""
    if sample_ids:
        db.execute(
            update(SampleRow)
            .where(SampleRow.session_id == session_id, SampleRow.sample_id.in_(sample_ids))
            .values(attempts=SampleRow.attempts + 1, updated_at=utcnow())
        )


def redelivery(db: Session, session_id: str, sample_id: str, max_attempts: int) -> bool:
    """Count a broker redelivery; returns whether the sample may run again.

    When the sample has used ``max_attempts`` deliveries it is recorded as failed (a poison sample that kills
    its workers) and ``False`` is returned.
    """
    row = db.get(SampleRow, (session_id, sample_id))
    if row is None:
        return True
    if row.status in TERMINAL:
        return False  # it has its outcome already: nothing to run
    row.attempts += 1
    row.updated_at = utcnow()
    if row.attempts > max_attempts:
        row.status = "failed"
        row.reason = f"worker lost during each of {max_attempts} deliveries (crash or out of memory?)"
        return False
    return True


def failures(db: Session, session_id: str, limit: int = 1000, offset: int = 0) -> list[SampleRow]:
    """Failed samples of a session, by sample id."""
    return list(db.scalars(
        select(SampleRow).where(SampleRow.session_id == session_id, SampleRow.status == "failed")
        .order_by(SampleRow.sample_id).limit(limit).offset(offset)
    ))
