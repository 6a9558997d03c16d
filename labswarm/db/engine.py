"""The manager's database: one declarative base for every service's tables, the engine and session factory.

SQLite by default (WAL mode: a commit costs ~0.8 ms instead of ~8 ms), PostgreSQL by URL.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, sessionmaker


def utcnow() -> datetime:
    """Now, timezone-aware UTC."""
    return datetime.now(UTC)


class Base(DeclarativeBase):
    """The declarative base of every table of the manager (sessions, jobs)."""


#: The modules that define tables on :class:`Base` (imported before the schema is created).
TABLE_MODULES = ("labswarm.sessions.models",)


def make_engine(url: str) -> Engine:
    """An engine for ``url`` with the tables created; SQLite gets WAL mode and a busy timeout."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record) -> None:  # pragma: no cover - trivial
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()
    else:
        engine = create_engine(url, pool_pre_ping=True)
    import importlib

    for module in TABLE_MODULES:
        importlib.import_module(module)
    Base.metadata.create_all(engine)
    return engine


def make_sessionmaker(engine: Engine) -> sessionmaker:
    """A session factory whose objects stay readable after commit."""
    return sessionmaker(bind=engine, expire_on_commit=False)
