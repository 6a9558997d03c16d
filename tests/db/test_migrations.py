"""The migrations on real SQLite and PostgreSQL: they agree with the models, a new database gets them all,
managers starting at once do not trip over each other, revision 0002 copes with a database a race left with two
active sessions of one experiment."""

from __future__ import annotations

import importlib.util
import pkgutil
import re
import threading
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

import labswarm
from labswarm.db import Base, make_engine
from labswarm.db.migrate import BASELINE, TABLE_MODULES, MigrationError, current, head, import_tables, upgrade
from labswarm.sessions.models import ONE_ACTIVE_INDEX


def _model_modules() -> list[str]:
    """Every module of the package that declares tables on ``Base`` (found by its source, then imported)."""
    names = []
    for info in pkgutil.walk_packages(labswarm.__path__, "labswarm."):
        spec = importlib.util.find_spec(info.name)
        if info.ispkg or spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        if re.search(r"^class \w+\(Base\):", Path(spec.origin).read_text(encoding="utf-8"), re.MULTILINE):
            importlib.import_module(info.name)
            names.append(info.name)
    return sorted(names)


def test_every_module_of_tables_is_migrated() -> None:
    """make_engine and the migrations' env.py know the tables through TABLE_MODULES."""
    assert _model_modules() == sorted(TABLE_MODULES)


def test_models_and_migrations_agree(database_url: str) -> None:
    """A column, table or index added to the models without a migration fails here (every ``models`` module of
    the package imported, whatever the other tests imported)."""
    _model_modules()
    import_tables()
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(context, Base.metadata) == []
            indexes = {i["name"]: i for i in inspect(conn).get_indexes("sessions")}
        assert indexes[ONE_ACTIVE_INDEX]["unique"]
        assert current(engine) == head() != BASELINE
    finally:
        engine.dispose()


def test_a_new_database_gets_every_revision_and_a_second_start_changes_nothing(database_url: str) -> None:
    engine = make_engine(database_url)
    again = make_engine(database_url)
    try:
        assert current(engine) == current(again) == head()
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM alembic_version")).scalar() == 1
            assert {"experiments", "sessions", "samples"} <= set(inspect(conn).get_table_names())
    finally:
        engine.dispose()
        again.dispose()


def test_managers_starting_at_once_migrate_once(database_url: str) -> None:
    """Six engines upgrade one new database at the same moment: all succeed, the schema is whole (without the
    lock, SQLite refuses the second CREATE TABLE experiments and PostgreSQL deadlocks)."""
    n = 6
    barrier, errors = threading.Barrier(n), []
    engines = [make_engine(database_url, migrate=False) for _ in range(n)]

    def start(engine) -> None:
        barrier.wait(10)
        try:
            upgrade(engine)
        except Exception as exc:  # collected: the assertion below names it
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert not any(t.is_alive() for t in threads), "an upgrade is still waiting after 60 s"
        assert errors == []
        assert all(current(e) == head() for e in engines)
        with engines[0].connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM alembic_version")).scalar() == 1
    finally:
        for e in engines:
            e.dispose()


def test_0002_keeps_the_newest_of_two_active_sessions(database_url: str) -> None:
    engine = make_engine(database_url, migrate=False)
    try:
        upgrade(engine, BASELINE)
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO experiments VALUES ('e', '{}', 'f', '2025-01-01', '2025-01-01')"))
            for sid, created in (("old", "2025-01-01 00:00:00"), ("new", "2025-01-02 00:00:00")):
                conn.execute(text(
                    "INSERT INTO sessions (id, experiment, status, rate, weight, total, cursor, published, "
                    "republished, fingerprint, launcher, created_at) "
                    "VALUES (:id, 'e', 'running', 1, 1, 0, 0, 0, 0, 'f', 'none', :created)"),
                    {"id": sid, "created": created})
        upgrade(engine)
        with engine.connect() as conn:
            rows = dict(conn.execute(text("SELECT id, status FROM sessions")).all())
            error = conn.execute(text("SELECT error FROM sessions WHERE id = 'old'")).scalar()
        assert rows == {"old": "failed", "new": "running"}
        assert "(new) was active too" in error
    finally:
        engine.dispose()


def test_a_database_older_than_the_baseline_is_refused_with_what_it_lacks(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ancient.sqlite'}"
    engine = make_engine(url, migrate=False)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE experiments (name VARCHAR(64) PRIMARY KEY, config JSON)"))
    try:
        with pytest.raises(MigrationError, match=r"lacks table samples, table sessions, experiments\.created_at"):
            upgrade(engine)
        assert current(engine) is None  # nothing stamped
    finally:
        engine.dispose()


def test_0005_gives_the_rows_of_a_0004_database_the_owner_admin(database_url: str) -> None:
    """Owners (issue 11): experiments and sessions that exist before revision 0005 belong to ``admin`` (the
    reserved user of LABSWARM_API_TOKEN: visible to admins only); the column is indexed, not null, and a row
    written without an owner gets ``admin`` too."""
    engine = make_engine(database_url, migrate=False)
    try:
        upgrade(engine, "0004")
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO experiments VALUES ('e', '{}', 'f', '2025-01-01', '2025-01-01')"))
            for sid, status in (("s1", "completed"), ("s2", "running")):
                conn.execute(text(
                    "INSERT INTO sessions (id, experiment, status, rate, weight, total, cursor, published, "
                    "republished, fingerprint, launcher, created_at, done) "
                    "VALUES (:id, 'e', :status, 1, 1, 3, 3, 3, 0, 'f', 'none', '2025-01-02', 2)"),
                    {"id": sid, "status": status})
        upgrade(engine, "0005")
        assert current(engine) == "0005"
        with engine.begin() as conn:
            assert conn.execute(text("SELECT name, owner FROM experiments")).all() == [("e", "admin")]
            assert sorted(conn.execute(text("SELECT id, owner, status, done FROM sessions")).all()) == [
                ("s1", "admin", "completed", 2), ("s2", "admin", "running", 2)]
            conn.execute(text("INSERT INTO experiments (name, config, fingerprint, created_at, updated_at) "
                              "VALUES ('later', '{}', 'f', '2025-01-03', '2025-01-03')"))
            assert conn.execute(text("SELECT owner FROM experiments WHERE name = 'later'")).scalar() == "admin"
        for table in ("experiments", "sessions"):
            assert f"ix_{table}_owner" in {i["name"] for i in inspect(engine).get_indexes(table)}
        with pytest.raises(IntegrityError), engine.begin() as conn:
            conn.execute(text("UPDATE sessions SET owner = NULL WHERE id = 's1'"))
    finally:
        engine.dispose()
