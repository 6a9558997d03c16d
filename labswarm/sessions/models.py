"""The sessions' tables: registered experiments, sessions and the per-sample ledger.

The ledger has one row per published sample; its status is the truth of a session's progress, together with the
feature store.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Index, Integer, String, Text, false, select, text
from sqlalchemy.orm import Mapped, Session, mapped_column

from labswarm.db import Base, utcnow
from labswarm.sessions.states import ACTIVE

#: SQL of "the session is active", the condition of the partial unique index on ``sessions(experiment)``:
#: ``status IN ('running', 'paused')`` (revision 0002 wrote the same text).
ACTIVE_SQL = f"status IN ({', '.join(repr(state.value) for state in ACTIVE)})"

#: The owner of rows that name none (and of every row older than revision 0005): the user of LABSWARM_API_TOKEN.
DEFAULT_OWNER = "admin"

#: Name of the unique index that allows one active session per experiment (revision 0002).
ONE_ACTIVE_INDEX = "uq_sessions_active_experiment"


class ExperimentRow(Base):
    """A registered experiment: its validated configuration as JSON, and its ``owner`` (the user who registered
    it; revision 0005). Its name is global (it names the experiment's queues): one owner per name."""

    __tablename__ = "experiments"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    config: Mapped[dict] = mapped_column(JSON)
    fingerprint: Mapped[str] = mapped_column(String(32))
    owner: Mapped[str] = mapped_column(String(64), index=True, default=DEFAULT_OWNER, server_default=DEFAULT_OWNER)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class SessionRow(Base):
    """One run of an experiment.

    ``status``: a :class:`~labswarm.sessions.states.SessionState` value, ``running`` (publishing or waiting for
    outcomes), ``paused``, ``completed``, ``cancelled``, ``failed`` (the session itself failed, e.g. unreadable
    dataset; ``error`` says why), written only by :func:`labswarm.sessions.lifecycle.transition` once created.
    ``cursor`` is the index in the experiment's sample stream of the next sample to publish: a restarted manager
    resumes there.
    ``weight`` (> 0) is the session's share of workers it shares with other sessions, relative to theirs (the
    health controller's). At most one session per experiment is active (``running`` or ``paused``): a partial
    unique index (:data:`ONE_ACTIVE_INDEX`) refuses a second one, whoever writes it. ``launcher`` names what
    runs the session's workers: ``none`` (workers started by someone else) or ``swarm``
    (a docker swarm service the manager creates, scales and removes). ``pending``, ``done``, ``cached`` and
    ``failed`` count the session's ledger rows per status (``pending``: status ``published``), kept by the ledger's
    writes in their transactions (:mod:`labswarm.sessions.ledger`; revision 0004). ``owner``: the user who
    started the session (revision 0005). ``follow``: the session follows its labels CSV (revision 0010): rows
    appended to it are published as they appear, and it ends only when cancelled
    (:mod:`labswarm.sessions.follow`); ``total`` then grows with them.
    """

    __tablename__ = "sessions"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    experiment: Mapped[str] = mapped_column(ForeignKey("experiments.name"), index=True)
    status: Mapped[str] = mapped_column(String(16), index=True)
    rate: Mapped[float] = mapped_column(Float)
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    total: Mapped[int] = mapped_column(Integer, default=0)
    cursor: Mapped[int] = mapped_column(Integer, default=0)
    published: Mapped[int] = mapped_column(Integer, default=0)
    republished: Mapped[int] = mapped_column(Integer, default=0)
    pending: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    done: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    cached: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    failed: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    fingerprint: Mapped[str] = mapped_column(String(32))
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    launcher: Mapped[str] = mapped_column(String(16), default="none")
    follow: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    owner: Mapped[str] = mapped_column(String(64), index=True, default=DEFAULT_OWNER, server_default=DEFAULT_OWNER)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(nullable=True)

    __table_args__ = (Index(ONE_ACTIVE_INDEX, "experiment", unique=True, sqlite_where=text(ACTIVE_SQL),
                            postgresql_where=text(ACTIVE_SQL)),)


class SampleRow(Base):
    """The ledger: one sample of a session, its status and delivery attempts.

    ``status``: ``published`` (no outcome yet), ``done`` (computed by a worker), ``cached`` (already in the
    store), ``failed`` (``reason`` says why). ``seconds`` is the worker's time on the sample and ``finished_at``
    when it finished (Unix time, the worker's clock).
    """

    __tablename__ = "samples"
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id"), primary_key=True)
    sample_id: Mapped[str] = mapped_column(String(512), primary_key=True)
    status: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=1)
    seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (Index("ix_samples_session_status", "session_id", "status"),)


class SeriesPointRow(Base):
    """One point of a session's history (revision 0008; :mod:`labswarm.sessions.history` writes and thins them).

    ``time``: Unix time in s of the reading; ``depth``: samples published without an outcome yet; ``published``
    and ``finished`` (done + cached + failed): the session's counters then, whose slopes are the rates;
    ``publish_rate`` and ``consume_rate``: samples/s over the window the point stands for (``None`` when no
    earlier reading is known); ``asked_rate``: the publish rate in force (tasks/s), 0 while paused.
    """

    __tablename__ = "session_series"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id"))
    time: Mapped[float] = mapped_column(Float)
    depth: Mapped[int] = mapped_column(Integer)
    published: Mapped[int] = mapped_column(Integer)
    finished: Mapped[int] = mapped_column(Integer)
    publish_rate: Mapped[float | None] = mapped_column(Float, nullable=True)
    consume_rate: Mapped[float | None] = mapped_column(Float, nullable=True)
    asked_rate: Mapped[float | None] = mapped_column(Float, nullable=True)

    __table_args__ = (Index("ix_session_series_session_time", "session_id", "time"),)


def known_session(db: Session, session_id: str) -> SessionRow:
    """The row of a session the caller knows exists: one it runs, launches or has just found (sessions are never
    deleted). Not for an id a user gave: that is a :class:`~labswarm.errors.NotFound` where it is looked up."""
    row = db.get(SessionRow, session_id)
    assert row is not None, f"session {session_id} has a row (sessions are never deleted)"
    return row


def active_session(db: Session, experiment: str) -> str | None:
    """The id of the experiment's running or paused session, if any."""
    return db.scalar(select(SessionRow.id).where(SessionRow.experiment == experiment, SessionRow.status.in_(ACTIVE)))
