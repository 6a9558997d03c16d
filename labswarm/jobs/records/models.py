"""The training jobs' tables: jobs, their attempts, the learner processes of each attempt, and each job's events.

The manager keeps every job's state here, so a restarted manager finds each job where it was: the learners it
started (pid and process start time: it re-attaches to those still alive and never starts a second copy), the
last committed checkpoint, the restart budgets spent, and the event stream with its per-job sequence numbers.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from labswarm.db import Base, utcnow
from labswarm.sessions.models import DEFAULT_OWNER


def naive_utcnow() -> datetime:
    """Now in UTC without a time zone: how the database gives datetimes back (SQLite and ``timestamp`` columns),
    so that times read back and times made here compare."""
    return utcnow().replace(tzinfo=None)


class JobRow(Base):
    """A training job.

    ``status`` is a :class:`~labswarm.jobs.spec.states.JobState` value, changed only through
    :func:`~labswarm.jobs.spec.states.check_transition`; ``timestamps`` holds when it last entered each state
    (``{"queued": iso, ...}``). ``manifest`` is the resolved manifest (the experiment inline, the training settings
    merged). ``attempt`` is the number of the current (last) attempt, 0 before the first. ``next_seq`` is the
    sequence number the next event of the job gets (its events are numbered 1, 2, ... with no gap).
    ``checkpoint`` is the last committed checkpoint pointer the manager knows of. ``not_before``: a restart
    waits for its backoff until then. ``halt_at``: when a halt (or a delete) was asked. ``owner``: the user who
    submitted it (revision 0006; older rows: :data:`~labswarm.sessions.models.DEFAULT_OWNER`, the admin's).
    ``fingerprint``: its configuration, data and code as one hash (:mod:`labswarm.train.provenance`; revision
    0009), by which a completed job is found and reused; ``None``: never reused.
    """

    __tablename__ = "jobs"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), index=True)
    status: Mapped[str] = mapped_column(String(16), index=True)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    experiment: Mapped[str] = mapped_column(String(64))
    manifest: Mapped[dict[str, Any]] = mapped_column(JSON)
    learners: Mapped[int] = mapped_column(Integer, default=1)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    error_code: Mapped[str | None] = mapped_column(String(8), nullable=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    restarts_user: Mapped[int] = mapped_column(Integer, default=0)
    restarts_platform: Mapped[int] = mapped_column(Integer, default=0)
    checkpoint: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    next_seq: Mapped[int] = mapped_column(Integer, default=1)
    timestamps: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    not_before: Mapped[datetime | None] = mapped_column(nullable=True)
    halt_at: Mapped[datetime | None] = mapped_column(nullable=True)
    submitted_at: Mapped[datetime] = mapped_column(default=naive_utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=naive_utcnow)
    owner: Mapped[str] = mapped_column(String(64), index=True, default=DEFAULT_OWNER, server_default=DEFAULT_OWNER)
    fingerprint: Mapped[str | None] = mapped_column(String(32), nullable=True, index=True)

    __table_args__ = (Index("ix_jobs_queue", "status", "priority", "submitted_at"),)


class AttemptRow(Base):
    """One attempt of a job: its learners from deploy to exit.

    ``checkpoint_in``: the pointer it started from (``None``: from scratch); ``checkpoint_out``: the last one it
    committed. ``exit_code``, ``error_code`` and ``reason`` describe how it ended (``reason`` also for a clean
    end: ``completed``, ``halted``). ``token_sha256``: the hex SHA-256 of the attempt's own API token, which opens
    its report route only (:mod:`labswarm.jobs.records.credentials`); set when it is deployed, cleared when it ends
    (revoked); the token itself is never stored (revision 0006).
    """

    __tablename__ = "job_attempts"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    number: Mapped[int] = mapped_column(Integer, primary_key=True)
    started_at: Mapped[datetime] = mapped_column(default=naive_utcnow)
    ended_at: Mapped[datetime | None] = mapped_column(nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error_code: Mapped[str | None] = mapped_column(String(8), nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    checkpoint_in: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    checkpoint_out: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    token_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)


class LearnerRow(Base):
    """One learner process of an attempt.

    ``pid`` with ``pid_created`` (the process's start time, Unix seconds, as psutil reports it) identify the
    process even after its pid is reused. ``received``: the number of its last stored event (``-1``: none).
    ``last_seen``: its last report (the watchdog's heartbeat). ``killed``: why the platform killed it
    (``hung``, ``halt``, ``delete``, ``deploy``), ``None`` otherwise. ``gpus``: its ``CUDA_VISIBLE_DEVICES``.
    ``service_id``: the docker swarm service running it (``job_launcher: swarm``, revision 0007; ``pid`` is then
    ``None``).
    """

    __tablename__ = "job_learners"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    pid_created: Mapped[float | None] = mapped_column(Float, nullable=True)
    service_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    workdir: Mapped[str] = mapped_column(Text)
    gpus: Mapped[str | None] = mapped_column(String(255), nullable=True)
    received: Mapped[int] = mapped_column(Integer, default=-1)
    progress: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    started_at: Mapped[datetime] = mapped_column(default=naive_utcnow)
    last_seen: Mapped[datetime | None] = mapped_column(nullable=True)
    ended_at: Mapped[datetime | None] = mapped_column(nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    killed: Mapped[str | None] = mapped_column(String(16), nullable=True)
    halt_sent: Mapped[bool] = mapped_column(Boolean, default=False)


class JobEventRow(Base):
    """One event of a job's stream: ``kind`` ``status``, ``log``, ``metric``, ``checkpoint`` or ``attempt``, its
    JSON ``payload``, and its per-job sequence number ``seq`` (the SSE event id). ``key`` makes an event unique in
    its job (``epoch:3`` for a metric: a restarted attempt reports it again, it is stored once)."""

    __tablename__ = "job_events"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    key: Mapped[str | None] = mapped_column(String(64), nullable=True)
    attempt: Mapped[int | None] = mapped_column(Integer, nullable=True)
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    time: Mapped[datetime] = mapped_column(default=naive_utcnow)

    __table_args__ = (
        UniqueConstraint("job_id", "key", name="uq_job_events_key"),
        Index("ix_job_events_kind", "job_id", "kind", "seq"),
    )
