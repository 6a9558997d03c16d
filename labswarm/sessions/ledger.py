"""Reads and writes of the session ledger (one row per sample), portable across SQLite and PostgreSQL.

Every statement that takes a list of sample ids takes it in chunks (:func:`chunks`), so none carries more bound
parameters than the database allows, whatever the session's size; reads of many rows stream
(:func:`pending` pages by sample id) instead of building a list of the whole ledger.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from itertools import islice
from typing import TypeVar

from sqlalchemy import case, func, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from labswarm.db import utcnow
from labswarm.sessions.models import SampleRow

#: Statuses that end a sample: nothing more will happen to it.
TERMINAL = ("done", "cached", "failed")
#: Bound parameters one statement may carry: SQLite's limit (``SQLITE_MAX_VARIABLE_NUMBER``, 32,766 since 3.32),
#: the lower of the two databases (PostgreSQL: 65,535).
MAX_PARAMETERS = 32_766
#: Ids per statement (and rows per page of :func:`pending`): far under :data:`MAX_PARAMETERS`, with room for the
#: statement's other parameters; large enough that a million-sample session takes 200 statements.
CHUNK = 5_000
#: An outcome never downgrades a better one: a duplicate run's failure does not undo a success.
_RANK = {"published": 0, "failed": 1, "done": 2, "cached": 2}


T = TypeVar("T")


def chunks(items: Iterable[T], size: int = CHUNK) -> Iterator[list[T]]:
    """``items`` in lists of at most ``size``, consumed lazily (a generator of ids is never materialised whole).

    Raises:
        ValueError: ``size`` is not in ``1 .. MAX_PARAMETERS - 100`` (a statement must keep room for its other
            parameters).
    """
    if not 1 <= size <= MAX_PARAMETERS - 100:
        raise ValueError(f"size must be in 1..{MAX_PARAMETERS - 100}, got {size}")
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk


def _insert(db: Session):
    return (postgresql.insert if db.bind.dialect.name == "postgresql" else sqlite.insert)(SampleRow)


def add_samples(db: Session, session_id: str, rows: Sequence[tuple[str, str, str | None]]) -> None:
    """Insert ledger rows ``(sample_id, status, reason)``; rows that exist already are left as they are."""
    now = utcnow()
    for chunk in chunks(rows, CHUNK // 6):  # six parameters per row
        stmt = _insert(db).values([
            {"session_id": session_id, "sample_id": sid, "status": status, "reason": reason, "attempts": 1,
             "updated_at": now}
            for sid, status, reason in chunk
        ])
        db.execute(stmt.on_conflict_do_nothing(index_elements=["session_id", "sample_id"]))


def record_outcomes(db: Session, session_id: str, outcomes: Iterable[dict]) -> int:
    """Upsert worker outcomes ``{sample_id, status, reason, seconds}``; returns how many were applied.

    One executemany per :data:`CHUNK` outcomes (each row its own parameter set). A sample already ``done`` or
    ``cached`` keeps that status (at-least-once delivery can run it twice).
    """
    now = utcnow()
    rows = (
        {"session_id": session_id, "sample_id": outcome["sample_id"], "status": status,
         "reason": outcome.get("reason"), "seconds": outcome.get("seconds"),
         "finished_at": outcome.get("finished_at"), "attempts": 1, "updated_at": now}
        for outcome in outcomes
        if (status := "done" if outcome["status"] == "computed" else outcome["status"]) in _RANK
    )
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
    applied = 0
    for chunk in chunks(rows):
        db.execute(stmt, chunk)
        applied += len(chunk)
    return applied


def counts(db: Session, session_id: str) -> dict[str, int]:
    """Samples per status (``published``, ``done``, ``cached``, ``failed``) in a session's ledger."""
    rows = db.execute(
        select(SampleRow.status, func.count()).where(SampleRow.session_id == session_id).group_by(SampleRow.status)
    ).all()
    out = dict.fromkeys(("published", "done", "cached", "failed"), 0)
    out.update({status: n for status, n in rows})
    return out


def count_pending(db: Session, session_id: str) -> int:
    """Samples of the session still without an outcome (counts only their index entries)."""
    return db.scalar(select(func.count()).select_from(SampleRow).where(
        SampleRow.session_id == session_id, SampleRow.status == "published")) or 0


class CountsCache:
    """:func:`counts` of sessions, each computed at most once per ``ttl`` seconds, for at most ``size`` sessions
    (the least recently read dropped): every poller of a session's progress (the health loop, ``/metrics``, the
    API, every second each) shares one count, so a poll costs one ``GROUP BY`` per session per ``ttl``, not one
    per caller.

    Args:
        db: a factory of database sessions (context managers).
        ttl: seconds a running session's counts are reused (default 1 s: the health loop's period).
        ended_ttl: seconds an ended session's counts are reused (late duplicate outcomes can still change them).
        size: sessions kept.
    """

    def __init__(self, db: Callable[[], AbstractContextManager[Session]], ttl: float = 1.0,
                 ended_ttl: float = 30.0, size: int = 256) -> None:
        self._db, self.ttl, self.ended_ttl, self.size = db, ttl, ended_ttl, size
        self._cache: OrderedDict[str, tuple[float, bool, dict[str, int]]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, session_id: str, active: bool) -> dict[str, int]:
        """The session's counts per status (see :func:`counts`), at most ``ttl`` (or ``ended_ttl``) s old; counted
        afresh when the session ended since (``active`` differs from the cached counts')."""
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(session_id)
            if hit is not None and hit[1] == active and now - hit[0] < (self.ttl if active else self.ended_ttl):
                self._cache.move_to_end(session_id)
                return dict(hit[2])
        with self._db() as db:
            fresh = counts(db, session_id)
        with self._lock:
            self._cache[session_id] = (now, active, fresh)
            self._cache.move_to_end(session_id)
            while len(self._cache) > self.size:
                self._cache.popitem(last=False)
        return dict(fresh)


def has_pending(db: Session, session_id: str) -> bool:
    """Whether any sample of the session is still without an outcome (one index seek, whatever the size)."""
    return db.scalar(
        select(SampleRow.sample_id).where(SampleRow.session_id == session_id, SampleRow.status == "published")
        .limit(1)
    ) is not None


def pending(db: Session, session_id: str, page: int = CHUNK) -> Iterator[tuple[str, int]]:
    """Stream ``(sample_id, attempts)`` of every sample still without an outcome, by sample id.

    Keyset pagination: one query per ``page`` rows (``sample_id > last``, on the primary key), so neither this
    process nor the database holds more than a page, and no read transaction stays open between pages.
    """
    last = None
    while True:
        stmt = select(SampleRow.sample_id, SampleRow.attempts).where(
            SampleRow.session_id == session_id, SampleRow.status == "published")
        if last is not None:
            stmt = stmt.where(SampleRow.sample_id > last)
        rows = db.execute(stmt.order_by(SampleRow.sample_id).limit(page)).all()
        yield from ((sid, attempts) for sid, attempts in rows)
        if len(rows) < page:
            return
        last = rows[-1][0]


def pending_among(db: Session, session_id: str, sample_ids: Iterable[str]) -> dict[str, int]:
    """``sample_id -> attempts`` of those of ``sample_ids`` still without an outcome (one query per chunk)."""
    out: dict[str, int] = {}
    for chunk in chunks(sample_ids):
        out.update(db.execute(
            select(SampleRow.sample_id, SampleRow.attempts).where(
                SampleRow.session_id == session_id, SampleRow.status == "published",
                SampleRow.sample_id.in_(chunk))
        ).all())
    return out


def set_status(db: Session, session_id: str, sample_ids: Iterable[str], status: str, reason: str | None) -> int:
    """Give pending samples a terminal status (reconciliation); returns how many changed. One statement per
    :data:`CHUNK` ids; samples that have an outcome already are left as they are."""
    changed = 0
    now = utcnow()
    for chunk in chunks(sample_ids):
        changed += db.execute(
            update(SampleRow)
            .where(SampleRow.session_id == session_id, SampleRow.sample_id.in_(chunk),
                   SampleRow.status == "published")
            .values(status=status, reason=reason, updated_at=now)
        ).rowcount
    return changed


def add_attempt(db: Session, session_id: str, sample_ids: Iterable[str]) -> None:
    """Count one more delivery of each of ``sample_ids`` (one statement per :data:`CHUNK` ids)."""
    now = utcnow()
    for chunk in chunks(sample_ids):
        db.execute(
            update(SampleRow)
            .where(SampleRow.session_id == session_id, SampleRow.sample_id.in_(chunk))
            .values(attempts=SampleRow.attempts + 1, updated_at=now)
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
    """Failed samples of a session, by sample id: at most ``limit`` from ``offset`` (the caller bounds them)."""
    return list(db.scalars(
        select(SampleRow).where(SampleRow.session_id == session_id, SampleRow.status == "failed")
        .order_by(SampleRow.sample_id).limit(limit).offset(offset)
    ))
