"""A job's event stream and its state changes, in the manager's database.

Every change a client can see is an event of the job (:class:`~labswarm.jobs.records.models.JobEventRow`) with the next
per-job sequence number, written in the same transaction as the change itself: a client reading the stream from
any sequence number on (``Last-Event-ID``) misses nothing and sees nothing twice. State changes go only through
:func:`transition`, which checks them against :data:`labswarm.jobs.spec.states.TRANSITIONS`.

Kinds: ``status`` (the manager), ``log``, ``metric``, ``checkpoint`` and ``progress`` (a learner's reports),
``attempt``. ``progress`` events (where an epoch stands: steps and samples done of their totals, samples/s, running
loss; :mod:`labswarm.jobs.learner.hooks`) are kept in the log like the others. Deleting superseded ones would leave gaps
in the numbers and make a stream read again after the end differ from the one read live; instead the learner
sends at most one per second and one at each epoch's end (:class:`~labswarm.jobs.learner.reporter.JobReporter`), so they
cost ~3,600 rows per learner and hour of training (~0.2 kB each) and a reconnecting client sees exactly what a live
one saw. A client that only wants logs, metrics or status skips them; :func:`log_tail`, the logs and metrics
routes never read them.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, datetime
from typing import Any, overload

from sqlalchemy import select
from sqlalchemy.orm import Session

from labswarm.jobs.records.models import JobEventRow, JobRow, naive_utcnow
from labswarm.jobs.spec.errors import ErrorCode
from labswarm.jobs.spec.states import JobState, check_transition

#: Lines of a learner's log a failed job's status carries (``log_tail``).
LOG_TAIL = 20


def append(db: Session, job: JobRow, kind: str, payload: dict[str, Any], *, key: str | None = None,
           attempt: int | None = None, time: datetime | None = None) -> JobEventRow:
    """Add one event to ``job``'s stream with the job's next sequence number (flushed, not committed).

    The caller holds the job's row for this transaction (the service's lock), so numbers have no gap and no
    duplicate; an event whose ``key`` the job already has must be filtered out before (:func:`known_keys`).
    """
    row = JobEventRow(job_id=job.id, seq=job.next_seq, kind=kind, key=key, attempt=attempt, payload=payload,
                      time=time or naive_utcnow())
    job.next_seq += 1
    db.add(row)
    return row


def known_keys(db: Session, job_id: str, keys: Collection[str]) -> set[str]:
    """Those of ``keys`` that events of the job already have."""
    if not keys:
        return set()
    return set(db.scalars(select(JobEventRow.key).where(JobEventRow.job_id == job_id,
                                                        JobEventRow.key.in_(list(keys)))))


def transition(db: Session, job: JobRow, new: JobState, *, reason: str | None = None,
               error_code: ErrorCode | None = None, detail: dict[str, Any] | None = None) -> JobEventRow:
    """Move ``job`` to ``new`` (checked against the transition table), stamp the time, and add the ``status``
    event ``{status, previous, reason, error_code, error, ...detail}``.

    Raises:
        InvalidTransition: the table does not allow it.
    """
    previous = job.status
    check_transition(previous, new)
    now = naive_utcnow()
    job.status = new.value
    job.reason = reason
    if error_code is not None or new is not JobState.FAILED:
        job.error_code = error_code.value if error_code is not None else None
    job.timestamps = {**(job.timestamps or {}), new.value: iso(now)}
    job.updated_at = now
    payload = {"status": new.value, "previous": previous, "reason": reason,
               "error_code": job.error_code, "error": error_code.text if error_code is not None else None,
               **(detail or {})}
    return append(db, job, "status", payload, attempt=job.attempt or None, time=now)


def log_tail(db: Session, job_id: str, attempt: int | None = None, lines: int = LOG_TAIL) -> list[str]:
    """The last ``lines`` log lines of the job (of one attempt), oldest first."""
    query = select(JobEventRow.payload).where(JobEventRow.job_id == job_id, JobEventRow.kind == "log")
    if attempt is not None:
        query = query.where(JobEventRow.attempt == attempt)
    rows = db.scalars(query.order_by(JobEventRow.seq.desc()).limit(lines))
    return [p.get("line", "") for p in reversed(list(rows))]


@overload
def iso(moment: datetime) -> str: ...
@overload
def iso(moment: None) -> None: ...
@overload
def iso(moment: datetime | None) -> str | None: ...


def iso(moment: datetime | None) -> str | None:
    """A naive UTC datetime (as stored) in ISO 8601 with its ``+00:00``."""
    return moment.replace(tzinfo=UTC).isoformat() if moment is not None else None
