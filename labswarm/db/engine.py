"""The manager's database: one declarative base for every service's tables, the engine and session factory.

SQLite by default (WAL mode: a commit costs ~0.8 ms instead of ~8 ms; foreign keys enforced, as PostgreSQL
does), PostgreSQL by URL. :func:`make_engine` brings the schema to the newest migration
(:mod:`labswarm.db.migrate`).
"""

from __future__ import annotations

import sqlite3
import time
from datetime import UTC, datetime

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, sessionmaker


def utcnow() -> datetime:
    """Now, timezone-aware UTC."""
    return datetime.now(UTC)


class Base(DeclarativeBase):
    """The declarative base of every table of the manager (sessions, jobs)."""


#: SQLite connections the pool keeps open, and how many more it may open under load (SQLAlchemy's defaults,
#: made explicit: they bound the memory of the connections' caches, see :func:`make_engine`).
SQLITE_POOL = (5, 10)


def enable_wal(conn: sqlite3.Connection, timeout: float = 30.0) -> None:
    """Put ``conn``'s SQLite database in WAL mode (a property of the file: once set, every connection has it).

    Connections opening one new file at once race for the change, which needs the file's exclusive lock, and
    SQLite answers ``database is locked`` at once instead of consulting the busy handler (measured: 2 of 60 starts
    of 6 engines on one new file failed). So the mode is read first (no lock when it is already WAL) and the
    change retried with a backoff of 5 ms doubling to 100 ms for up to ``timeout`` seconds.

    Raises:
        sqlite3.OperationalError: still locked after ``timeout`` seconds, or any other error of the pragma.
    """
    deadline, delay = time.monotonic() + timeout, 0.005
    while True:
        try:
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.1)


def make_engine(url: str, *, migrate: bool = True) -> Engine:
    """An engine for ``url`` with the schema at the newest migration.

    A new database gets every migration; one made before migrations existed (tables, no ``alembic_version``) is
    stamped as the baseline revision and upgraded in place. Managers starting at once are serialised (see
    :func:`labswarm.db.migrate.upgrade`). SQLite connections get WAL mode, ``synchronous=NORMAL``, foreign keys
    on and a 30 s busy timeout.

    Memory (issue 10: the manager's RSS must not grow with a session): on SQLite the pool keeps at most
    :data:`SQLITE_POOL` connections open (more are opened under load and closed when returned), each with
    SQLite's default page cache (2 MiB) and no memory map of the file (``mmap_size`` 0, the default: mapped
    pages would count in RSS as the database grows). Each connection also keeps its prepared statements (128,
    Python's ``sqlite3`` default): statements must have one text whatever their data (the ledger passes id
    lists as one parameter), or that cache fills with large variants (measured: ~1 MB per ``IN`` of 5,000 ids).

    Args:
        url: a SQLAlchemy URL (``sqlite:///path``, ``postgresql+psycopg://user:password@host/db``).
        migrate: ``False`` leaves the schema as it is (tests of the migrations).

    Raises:
        MigrationError: the database cannot be brought to the newest revision (e.g. it predates the baseline).
    """
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30},
                               pool_size=SQLITE_POOL[0], max_overflow=SQLITE_POOL[1])

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record) -> None:  # pragma: no cover - trivial
            enable_wal(dbapi_conn)
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()
    else:
        engine = create_engine(url, pool_pre_ping=True)
    if migrate:
        from labswarm.db.migrate import upgrade

        upgrade(engine)
    return engine


def make_sessionmaker(engine: Engine) -> sessionmaker:
    """A session factory whose objects stay readable after commit."""
    return sessionmaker(bind=engine, expire_on_commit=False)
