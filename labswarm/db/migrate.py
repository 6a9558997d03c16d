"""Schema migrations of the manager's database (Alembic), run in code: no ``alembic.ini`` at run time.

The revisions live in ``labswarm/db/migrations/versions``, numbered ``0001_...``, ``0002_...``; revision
``0001`` is the schema the manager created with ``create_all`` before migrations existed (commit 35c30d6).
:func:`upgrade` (called by :func:`labswarm.db.make_engine`) brings a database to the newest revision:

- a new database gets every revision;
- a database from before migrations (the baseline's tables, no ``alembic_version`` table) is stamped ``0001``,
  then upgraded in place;
- managers starting at once are serialised: on PostgreSQL the upgrade runs in one transaction holding an
  advisory lock (PostgreSQL's DDL is transactional), on SQLite in one ``BEGIN IMMEDIATE`` transaction (the
  database's write lock); the second one then finds the schema current and does nothing.

Adding a revision (a new column, the training jobs' tables)::

    1. change or add the models; a new module of tables goes into ``TABLE_MODULES``
    2. .venv/bin/python -m labswarm.db.migrate revision "add jobs table"
       (autogenerates labswarm/db/migrations/versions/000N_add_jobs_table.py against ``Base.metadata``, the
       models of every module of ``TABLE_MODULES``, compared with a scratch SQLite database at the newest revision)
    3. read it and complete it: autogenerate misses renames, server defaults and data changes; a new NOT NULL
       column of an existing table needs a server default or a data step; ALTERs on SQLite go through
       ``op.batch_alter_table`` (already how autogenerate renders them here)
    4. .venv/bin/python -m pytest tests/db -q  (tests/db/test_migrations.py fails while the models and the
       migrations differ, on SQLite and PostgreSQL)
"""

from __future__ import annotations

import importlib
import logging
import sys
import tempfile
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import Script, ScriptDirectory
from sqlalchemy import Connection, create_engine, inspect, text
from sqlalchemy.engine import Engine

from labswarm.errors import LabswarmError

#: The modules that define tables on :class:`Base`; each table needs a migration too (a revision
#: in labswarm/db/migrations/versions, see the module docstring).
TABLE_MODULES = ("labswarm.sessions.models", "labswarm.jobs.records.models", "labswarm.auth.models")


def import_tables() -> None:
    """Import every module of :data:`TABLE_MODULES`, so that ``Base.metadata`` holds every table."""
    for module in TABLE_MODULES:
        importlib.import_module(module)

log = logging.getLogger(__name__)

#: The folder of ``env.py``, ``script.py.mako`` and ``versions/``.
MIGRATIONS = Path(__file__).with_name("migrations")

#: The revision equal to the schema made by ``create_all`` before migrations existed.
BASELINE = "0001"

#: The baseline's tables and columns: a database with these tables and no version is stamped :data:`BASELINE`.
BASELINE_TABLES: dict[str, frozenset[str]] = {
    "experiments": frozenset({"name", "config", "fingerprint", "created_at", "updated_at"}),
    "sessions": frozenset({"id", "experiment", "status", "rate", "weight", "total", "cursor", "published",
                           "republished", "fingerprint", "error", "launcher", "created_at", "started_at",
                           "finished_at"}),
    "samples": frozenset({"session_id", "sample_id", "status", "reason", "attempts", "seconds", "finished_at",
                          "updated_at"}),
}

#: Key of the PostgreSQL advisory lock held while migrating (any constant unique to labswarm).
ADVISORY_LOCK = 0x6C616273776D  # "labswm"


class MigrationError(LabswarmError):
    """The database cannot be brought to the newest revision (it predates the baseline, or a revision failed)."""


def alembic_config(connection: Connection | None = None) -> Config:
    """The Alembic configuration of labswarm's migrations, built in code.

    Args:
        connection: the connection ``env.py`` runs the migrations on (in ``config.attributes["connection"]``).
    """
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("file_template", "%%(rev)s_%%(slug)s")
    config.attributes["connection"] = connection
    return config


def head() -> str:
    """The newest revision, e.g. ``"0002"``.

    Raises:
        MigrationError: there is no revision.
    """
    newest = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if newest is None:
        raise MigrationError(f"no revision in {MIGRATIONS / 'versions'}")
    return newest


def current(engine: Engine) -> str | None:
    """The database's revision; ``None`` for a database without ``alembic_version``."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring ``engine``'s database to ``revision`` (default the newest), serialised against other processes.

    Raises:
        MigrationError: the database has some of the baseline's tables or columns but not all (made by code older
            than the baseline: delete it), or a revision failed (nothing of the upgrade is kept on PostgreSQL).
    """
    try:
        if engine.dialect.name == "sqlite":
            _upgrade_sqlite(engine, revision)
        else:
            with engine.begin() as conn:
                if engine.dialect.name == "postgresql":
                    conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": ADVISORY_LOCK})
                _upgrade(conn, revision)
    except MigrationError:
        raise
    except Exception as exc:
        raise MigrationError(f"cannot migrate the database {engine.url!r} to {revision}: {exc}") from exc


def _upgrade_sqlite(engine: Engine, revision: str) -> None:
    # pysqlite begins transactions only before DML, so DDL would commit statement by statement: drive the
    # transaction ourselves (BEGIN IMMEDIATE takes the write lock, waiting up to the busy timeout). Foreign keys
    # are off while tables are rebuilt (batch ALTERs), as SQLite's documentation prescribes; the pragma is a no-op
    # inside a transaction, hence before BEGIN.
    with engine.connect() as conn:
        dbapi = conn.connection.driver_connection  # pysqlite's connection
        if dbapi is None:
            raise MigrationError(f"{engine.url!r}: the connection has no driver connection (invalidated)")
        saved = dbapi.isolation_level
        dbapi.isolation_level = None
        try:
            conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
            conn.exec_driver_sql("BEGIN IMMEDIATE")
            try:
                migrated = _upgrade(conn, revision)
                if migrated and (violations := conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()):
                    # rows written while foreign keys were not enforced (before migrations): kept, reported
                    log.warning("%s: %d rows without their parent row (first: %s)", engine.url, len(violations),
                                violations[:3])
            except BaseException:
                dbapi.rollback()
                raise
            dbapi.commit()
        finally:
            conn.exec_driver_sql("PRAGMA foreign_keys=ON")
            dbapi.isolation_level = saved
            conn.rollback()  # SQLAlchemy's view of the connection: nothing pending


def _upgrade(conn: Connection, revision: str) -> bool:
    """Stamp a pre-migrations database, upgrade; ``False`` when it was at ``revision`` already."""
    config = alembic_config(conn)
    version = MigrationContext.configure(conn).get_current_revision()
    if version is not None and version == ScriptDirectory.from_config(config).as_revision_number(revision):
        return False  # current: the common case, without loading env.py
    if version is None:
        tables = set(inspect(conn).get_table_names())
        present = tables & BASELINE_TABLES.keys()
        if present:
            _check_baseline(conn, present)
            command.stamp(config, BASELINE)
    command.upgrade(config, revision)
    return True


def _check_baseline(conn: Connection, present: set[str]) -> None:
    missing = [f"table {t}" for t in sorted(BASELINE_TABLES.keys() - present)]
    for table in sorted(present):
        columns = {c["name"] for c in inspect(conn).get_columns(table)}
        missing += [f"{table}.{c}" for c in sorted(BASELINE_TABLES[table] - columns)]
    if missing:
        raise MigrationError(f"the database has no alembic_version and lacks {', '.join(missing)} of revision "
                             f"{BASELINE}: it was made by a labswarm older than the migrations; delete it")


def new_revision(message: str) -> Path:
    """Autogenerate the next revision (``000N_<slug>.py``) from the difference between ``Base.metadata`` and the
    newest revision (applied to a scratch SQLite database). Returns the new file; read and complete it.
    """
    import_tables()
    rev_id = f"{int(head()) + 1:04d}"
    with tempfile.TemporaryDirectory() as tmp:
        engine = create_engine(f"sqlite:///{Path(tmp) / 'scratch.sqlite'}")
        try:
            with engine.begin() as conn:
                script = command.revision(alembic_config(conn), message, autogenerate=True, rev_id=rev_id)
        finally:
            engine.dispose()
    if not isinstance(script, Script):  # None or a list: one revision per branch, and labswarm's are linear
        raise MigrationError(f"autogenerate made no single revision: {script!r}")
    return Path(script.path)


def main(argv: list[str] | None = None) -> int:
    """``python -m labswarm.db.migrate revision MESSAGE`` | ``upgrade URL`` | ``current URL`` | ``head``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "revision":
        print(new_revision(args[1]))
    elif len(args) == 2 and args[0] in ("upgrade", "current"):
        engine = create_engine(args[1])
        try:
            if args[0] == "upgrade":
                upgrade(engine)
            print(current(engine))
        finally:
            engine.dispose()
    elif args == ["head"]:
        print(head())
    else:
        print(main.__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
