"""Reads and writes of the session ledger (one row per sample), portable across SQLite and PostgreSQL.

Every statement that takes a list of sample ids takes it in chunks (:func:`chunks`) and as ONE bound parameter
(a JSON array read with ``json_each`` on SQLite, an array with ``= ANY`` on PostgreSQL): no statement carries
more parameters than the database allows, and a statement's text is the same whatever the number of ids. That
matters for memory: SQLite keeps each distinct statement it was given prepared (Python's ``sqlite3`` caches 128
per connection), and a prepared ``IN (?, ?, ...)`` of 5,000 ids holds ~1 MB; with one text per length the
manager's memory grew with the variety of batch sizes a long session produces. Reads of many rows stream
(:func:`pending` pages by sample id) instead of building a list of the whole ledger.

The session row keeps counts of its ledger per status (``pending``, ``done``, ``cached``, ``failed``), changed by
the same statements, in the same transaction, as the ledger rows, so progress costs one row read whatever the
session's size. Every ledger write first locks the session row (:func:`_lock`), so concurrent writers of one
session count each change once; :func:`recount` rebuilds the counts from the ledger, which stays the truth.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from itertools import islice
from typing import Any, TypeVar

from sqlalchemy import String, any_, bindparam, func, select, text, update
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from labswarm.db import utcnow
from labswarm.errors import NotFound
from labswarm.sessions.models import SampleRow, SessionRow

#: Statuses that end a sample: nothing more will happen to it.
TERMINAL = ("done", "cached", "failed")
#: Ledger status -> the session row's counter of it.
COUNTERS = {"published": "pending", "done": "done", "cached": "cached", "failed": "failed"}
#: Bound parameters one statement may carry: SQLite's limit (``SQLITE_MAX_VARIABLE_NUMBER``, 32,766 since 3.32),
#: the lower of the two databases (PostgreSQL: 65,535).
MAX_PARAMETERS = 32_766
#: Ids per statement (and rows per page of :func:`pending`): bounds what one statement and its result hold (ids
#: travel as one parameter, so :data:`MAX_PARAMETERS` is not what bounds it); a million-sample session takes 200.
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


def _postgres(db: Session) -> bool:
    return db.get_bind().dialect.name == "postgresql"


def _among(db: Session, column, ids: Sequence[str]) -> ColumnElement[bool]:
    """``column IN ids`` with ``ids`` as one parameter: a JSON array through ``json_each`` (SQLite), an array with
    ``= ANY`` (PostgreSQL); the statement's text does not depend on ``len(ids)``."""
    if _postgres(db):
        return column == any_(bindparam(None, list(ids), type_=postgresql.ARRAY(String)))
    values = func.json_each(bindparam(None, json.dumps(list(ids)), type_=String)).table_valued("value")
    return column.in_(select(values.c.value))


def _is_pending(status) -> ColumnElement[bool]:
    """``status = 'published'``, written so that no planner takes the (session, status) index for it: statements
    that also name sample ids must look them up by primary key, not scan every pending sample of the session."""
    return func.coalesce(status, "") == "published"


#: The session row's lock (a no-op write) that also checks the session exists and, with ``:owner`` not null, is
#: that user's: no row changed means neither. One fixed text: the hot path of every worker's reports.
_LOCK = text("UPDATE sessions SET pending = pending WHERE id = :sid "
             "AND (CAST(:owner AS VARCHAR) IS NULL OR owner = :owner)")
#: Every counter of a session row moved at once (``:published`` moves ``pending``, see :data:`COUNTERS`).
_COUNT = text("UPDATE sessions SET pending = pending + :published, done = done + :done, cached = cached + :cached, "
              "failed = failed + :failed WHERE id = :sid")


def _lock(db: Session, session_id: str, owner: str | None = None) -> bool:
    """Lock the session row for the rest of the transaction (a no-op write: PostgreSQL's row lock; SQLite's write
    lock, taken before anything is read): writers of one session's ledger and counters go one at a time.

    Returns:
        Whether the session exists (and, ``owner`` given, is that user's): ``False`` locked nothing.
    """
    return db.connection().execute(_LOCK, {"sid": session_id, "owner": owner}).rowcount > 0


def _count(db: Session, session_id: str, delta: Mapping[str, int]) -> None:
    """Add ``delta`` (ledger status -> change) to the session row's counters."""
    if any(delta.values()):
        db.connection().execute(_COUNT, {"sid": session_id, **{s: delta.get(s, 0) for s in COUNTERS}})


_ADD_SQLITE = text(
    "INSERT INTO samples (session_id, sample_id, status, reason, attempts, updated_at) "
    "SELECT :sid, json_extract(j.value, '$[0]'), json_extract(j.value, '$[1]'), json_extract(j.value, '$[2]'), 1, "
    ":now FROM json_each(:rows) AS j WHERE true "
    "ON CONFLICT (session_id, sample_id) DO NOTHING RETURNING status")
_ADD_POSTGRES = text(
    "INSERT INTO samples (session_id, sample_id, status, reason, attempts, updated_at) "
    "SELECT :sid, u.sample_id, u.status, u.reason, 1, :now "
    "FROM unnest(CAST(:ids AS VARCHAR[]), CAST(:statuses AS VARCHAR[]), CAST(:reasons AS TEXT[])) "
    "AS u(sample_id, status, reason) "
    "ON CONFLICT (session_id, sample_id) DO NOTHING RETURNING status")


def add_samples(db: Session, session_id: str, rows: Iterable[tuple[str, str, str | None]]) -> dict[str, int]:
    """Insert ledger rows ``(sample_id, status, reason)``; rows that exist already are left as they are.

    One statement per :data:`CHUNK` rows, the rows as one parameter; the session's counters count the rows
    inserted.

    Returns:
        rows inserted per status.
    """
    _lock(db, session_id)
    now_type = SampleRow.__table__.c.updated_at.type
    added: Counter[str] = Counter()
    for chunk in chunks(rows):
        if _postgres(db):
            stmt = _ADD_POSTGRES.bindparams(bindparam("now", type_=now_type))
            params: dict[str, Any] = {"ids": [r[0] for r in chunk], "statuses": [r[1] for r in chunk],
                                      "reasons": [r[2] for r in chunk]}
        else:
            stmt = _ADD_SQLITE.bindparams(bindparam("now", type_=now_type))
            params = {"rows": json.dumps([list(r) for r in chunk])}
        added.update(status for (status,) in db.execute(stmt, {"sid": session_id, "now": utcnow(), **params}))
    _count(db, session_id, added)
    return dict(added)


_OUTCOME_SET = (
    "ON CONFLICT (session_id, sample_id) DO UPDATE SET "
    "status = CASE WHEN samples.status IN ('done', 'cached') THEN samples.status ELSE excluded.status END, "
    "reason = CASE WHEN samples.status IN ('done', 'cached') THEN samples.reason ELSE excluded.reason END, "
    "seconds = excluded.seconds, finished_at = excluded.finished_at, updated_at = excluded.updated_at")
_OUTCOMES_SQLITE = text(
    "INSERT INTO samples (session_id, sample_id, status, reason, seconds, finished_at, attempts, updated_at) "
    "SELECT :sid, json_extract(j.value, '$[0]'), json_extract(j.value, '$[1]'), json_extract(j.value, '$[2]'), "
    "json_extract(j.value, '$[3]'), json_extract(j.value, '$[4]'), 1, :now FROM json_each(:rows) AS j WHERE true "
    + _OUTCOME_SET)
_OUTCOMES_POSTGRES = text(
    "INSERT INTO samples (session_id, sample_id, status, reason, seconds, finished_at, attempts, updated_at) "
    "SELECT :sid, u.sample_id, u.status, u.reason, u.seconds, u.finished_at, 1, :now "
    "FROM unnest(CAST(:ids AS VARCHAR[]), CAST(:statuses AS VARCHAR[]), CAST(:reasons AS TEXT[]), "
    "CAST(:seconds AS FLOAT8[]), CAST(:finished AS FLOAT8[])) AS u(sample_id, status, reason, seconds, finished_at) "
    + _OUTCOME_SET)
_STATUS_SQLITE = text("SELECT sample_id, status FROM samples WHERE session_id = :sid "
                      "AND sample_id IN (SELECT value FROM json_each(:ids))")
_STATUS_POSTGRES = text("SELECT sample_id, status FROM samples WHERE session_id = :sid "
                        "AND sample_id = ANY(CAST(:ids AS VARCHAR[]))")


def record_outcomes(db: Session, session_id: str, outcomes: Iterable[dict],
                    in_flight: Collection[str] = (), owner: str | None = None) -> tuple[int, list[str]]:
    """Record worker outcomes ``{sample_id, status, reason, seconds, finished_at}`` of the session's own samples.

    Only a sample in the session's ledger, or among ``in_flight`` (published, its ledger row not yet written:
    the row is inserted here and the publisher's later insert leaves it), is recorded; any other id is not.
    A sample already ``done`` or ``cached`` keeps that status (at-least-once delivery can run it twice); a sample
    named twice in one batch ends as the outcomes applied one after the other would leave it.

    The cost does not depend on the ORM: four fixed SQL texts per call (per :data:`CHUNK` outcomes, the ids and
    rows as one parameter each): the session row's lock, which also checks the session and its ``owner``; the
    statuses before, read under that lock; one upsert of the batch; the counters' change.

    Args:
        owner: when given, the session must be this user's.

    Returns:
        ``(applied, rejected)``: outcomes recorded, and the sample ids refused (not samples of the session).

    Raises:
        NotFound: no such session, or (``owner`` given) another user's; nothing is written.
    """
    if not _lock(db, session_id, owner):
        raise NotFound(f"no session {session_id!r}")
    conn = db.connection()
    postgres = _postgres(db)
    upsert = (_OUTCOMES_POSTGRES if postgres else _OUTCOMES_SQLITE).bindparams(
        bindparam("now", type_=SampleRow.__table__.c.updated_at.type))
    now = utcnow()
    applied = 0
    rejected: list[str] = []
    delta: Counter[str] = Counter()
    for chunk in chunks(outcomes):
        ids = list(dict.fromkeys(o["sample_id"] for o in chunk))
        state: dict[str, str | None] = dict(conn.execute(
            _STATUS_POSTGRES if postgres else _STATUS_SQLITE,
            {"sid": session_id, "ids": ids if postgres else json.dumps(ids)}).all())
        rows: dict[str, list] = {}  # sample id -> [id, status, reason, seconds, finished_at]: the last word
        for outcome in chunk:
            sample_id = outcome["sample_id"]
            status = "done" if outcome["status"] == "computed" else outcome["status"]
            if status not in _RANK:
                continue
            if sample_id not in state and sample_id not in in_flight:
                rejected.append(sample_id)
                continue
            applied += 1
            old = state.get(sample_id)
            row = rows.get(sample_id)
            if old in ("done", "cached"):  # the statement's rule, row by row: a success stays
                reason = row[2] if row else None
                status = old
            else:
                reason = outcome.get("reason")
                if old is not None:
                    delta[old] -= 1
                delta[status] += 1
                state[sample_id] = status
            rows[sample_id] = [sample_id, status, reason, outcome.get("seconds"), outcome.get("finished_at")]
        if not rows:
            continue
        batch = list(rows.values())
        if postgres:
            params: dict[str, Any] = {name: [r[i] for r in batch] for i, name in
                                      enumerate(("ids", "statuses", "reasons", "seconds", "finished"))}
        else:
            params = {"rows": json.dumps(batch)}
        conn.execute(upsert, {"sid": session_id, "now": now, **params})
    _count(db, session_id, delta)
    return applied, rejected


def counts(db: Session, session_id: str) -> dict[str, int]:
    """Samples per status (``published``, ``done``, ``cached``, ``failed``) in a session's ledger: counted from the
    ledger (one ``GROUP BY``; cost grows with the session: progress reads :func:`counters`)."""
    rows = db.execute(
        select(SampleRow.status, func.count()).where(SampleRow.session_id == session_id).group_by(SampleRow.status)
    ).all()
    out = dict.fromkeys(COUNTERS, 0)
    out.update({status: n for status, n in rows})
    return out


def counters(row: SessionRow) -> dict[str, int]:
    """The counts per ledger status kept on a session row (same keys as :func:`counts`)."""
    return {status: getattr(row, column) or 0 for status, column in COUNTERS.items()}


def recount(db: Session, session_id: str) -> dict[str, int]:
    """Set the session row's counters from its ledger (:func:`counts`, under the session's lock) and return them:
    the ledger is the truth (a manager calls it once per session after a start)."""
    _lock(db, session_id)
    fresh = counts(db, session_id)
    db.execute(update(SessionRow).where(SessionRow.id == session_id)
               .values(**{COUNTERS[status]: n for status, n in fresh.items()})
               .execution_options(synchronize_session=False))
    return fresh


def count_pending(db: Session, session_id: str) -> int:
    """Samples of the session still without an outcome (counts only their index entries)."""
    return db.scalar(select(func.count()).select_from(SampleRow).where(
        SampleRow.session_id == session_id, SampleRow.status == "published")) or 0


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
    """``sample_id -> attempts`` of those of ``sample_ids`` still without an outcome (one query per chunk, by
    primary key)."""
    out: dict[str, int] = {}
    for chunk in chunks(sample_ids):
        out.update(db.execute(
            select(SampleRow.sample_id, SampleRow.attempts).where(
                SampleRow.session_id == session_id, _among(db, SampleRow.sample_id, chunk),
                _is_pending(SampleRow.status))
        ).all())
    return out


def known_among(db: Session, session_id: str, sample_ids: Iterable[str]) -> set[str]:
    """Those of ``sample_ids`` that have a ledger row in the session, whatever their status (one query per chunk,
    by primary key): what a followed session published or recorded already, and publishes no more."""
    out: set[str] = set()
    for chunk in chunks(sample_ids):
        out.update(db.scalars(select(SampleRow.sample_id).where(
            SampleRow.session_id == session_id, _among(db, SampleRow.sample_id, chunk))))
    return out


def set_status(db: Session, session_id: str, sample_ids: Iterable[str], status: str, reason: str | None) -> int:
    """Give pending samples a terminal status (reconciliation); returns how many changed. One statement per
    :data:`CHUNK` ids; samples that have an outcome already are left as they are. The counters move with them.

    Raises:
        ValueError: ``status`` is not a terminal status (``done``, ``cached``, ``failed``).
    """
    if status not in TERMINAL:
        raise ValueError(f"status must be one of {TERMINAL}, got {status!r}")
    _lock(db, session_id)
    changed = 0
    now = utcnow()
    for chunk in chunks(sample_ids):
        result = db.execute(
            update(SampleRow)
            .where(SampleRow.session_id == session_id, _among(db, SampleRow.sample_id, chunk),
                   _is_pending(SampleRow.status))
            .values(status=status, reason=reason, updated_at=now)
            .execution_options(synchronize_session=False)
        )
        assert isinstance(result, CursorResult), "an UPDATE without RETURNING gives a CursorResult"
        changed += result.rowcount
    _count(db, session_id, {"published": -changed, status: changed})
    return changed


def add_attempt(db: Session, session_id: str, sample_ids: Iterable[str]) -> None:
    """Count one more delivery of each of ``sample_ids`` (one statement per :data:`CHUNK` ids)."""
    _lock(db, session_id)
    now = utcnow()
    for chunk in chunks(sample_ids):
        db.execute(
            update(SampleRow)
            .where(SampleRow.session_id == session_id, _among(db, SampleRow.sample_id, chunk))
            .values(attempts=SampleRow.attempts + 1, updated_at=now)
            .execution_options(synchronize_session=False)
        )


def redelivery(db: Session, session_id: str, sample_id: str, max_attempts: int) -> bool:
    """Count a broker redelivery; returns whether the sample may run again.

    When the sample has used ``max_attempts`` deliveries it is recorded as failed (a poison sample that kills
    its workers) and ``False`` is returned.
    """
    _lock(db, session_id)
    row = db.get(SampleRow, (session_id, sample_id), populate_existing=True)
    if row is None:
        return True
    if row.status in TERMINAL:
        return False  # it has its outcome already: nothing to run
    row.attempts += 1
    row.updated_at = utcnow()
    if row.attempts > max_attempts:
        row.status = "failed"
        row.reason = f"worker lost during each of {max_attempts} deliveries (crash or out of memory?)"
        _count(db, session_id, {"published": -1, "failed": 1})
        return False
    return True


def failures(db: Session, session_id: str, limit: int = 1000, offset: int = 0) -> list[SampleRow]:
    """Failed samples of a session, by sample id: at most ``limit`` from ``offset`` (the caller bounds them)."""
    return list(db.scalars(
        select(SampleRow).where(SampleRow.session_id == session_id, SampleRow.status == "failed")
        .order_by(SampleRow.sample_id).limit(limit).offset(offset)
    ))
