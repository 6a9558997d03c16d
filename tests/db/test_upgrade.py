"""A database made by the code before migrations (commit 35c30d6, ``data/manager-35c30d6.sqlite``, made by
``data/make_manager_35c30d6.py``) opened by today's code: stamped as the baseline, upgraded in place, every row
intact, the new constraints in force."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import inspect, select
from sqlalchemy.exc import IntegrityError

from labswarm.db import make_engine, make_sessionmaker
from labswarm.db.migrate import current, head
from labswarm.sessions import ledger
from labswarm.sessions.models import ONE_ACTIVE_INDEX, ExperimentRow, SampleRow, SessionRow

DATA = Path(__file__).with_name("data") / "manager-35c30d6.sqlite"
T0 = datetime(2025, 1, 2, 3, 4, 5)


def test_a_database_of_35c30d6_upgrades_in_place(tmp_path: Path) -> None:
    data = DATA.read_bytes()
    path = tmp_path / "manager.sqlite"
    path.write_bytes(data)
    before = make_engine(f"sqlite:///{path}", migrate=False)
    assert current(before) is None and "alembic_version" not in inspect(before).get_table_names()
    before.dispose()

    engine = make_engine(f"sqlite:///{path}")
    try:
        assert current(engine) == head()
        assert ONE_ACTIVE_INDEX in {i["name"] for i in inspect(engine).get_indexes("sessions")}
        with make_sessionmaker(engine)() as db:
            experiment = db.get(ExperimentRow, "legacy")
            assert experiment.config["name"] == "legacy" and experiment.config["store"]["root"] == "/store/legacy"
            assert (experiment.created_at, experiment.updated_at) == (T0, T0)
            session = db.get(SessionRow, "legacy0001")
            assert (session.experiment, session.status, session.rate, session.weight, session.total, session.cursor,
                    session.published, session.launcher, session.started_at, session.error) == (
                "legacy", "running", 5.0, 2.0, 3, 3, 3, "none", T0, None)
            assert session.fingerprint == experiment.fingerprint
            assert experiment.owner == session.owner == "admin"  # revision 0005: rows older than owners
            rows = {r.sample_id: (r.status, r.reason, r.attempts, r.seconds, r.finished_at)
                    for r in db.scalars(select(SampleRow))}
            assert rows == {"a": ("done", None, 1, 0.25, 1.5e9),
                            "b": ("failed", "AudioError: b.wav: unreadable", 3, None, None),
                            "c": ("cached", None, 1, None, None)}
            assert ledger.counts(db, "legacy0001") == {"published": 0, "done": 1, "cached": 1, "failed": 1}

            # the new constraints hold on the upgraded file: one active session per experiment, foreign keys
            db.add(SessionRow(id="second", experiment="legacy", status="running", rate=1.0, fingerprint="f"))
            with pytest.raises(IntegrityError, match="UNIQUE"):
                db.commit()
            db.rollback()
            with pytest.raises(IntegrityError, match="FOREIGN KEY"):
                ledger.add_samples(db, "no-such-session", [("x", "published", None)])
                db.commit()
            db.rollback()
    finally:
        engine.dispose()
    assert DATA.read_bytes() == data  # the test data itself is untouched
