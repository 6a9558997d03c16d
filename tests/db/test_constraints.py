"""What the database itself enforces, on real SQLite and PostgreSQL: foreign keys (SQLite only with
``PRAGMA foreign_keys=ON``, which make_engine sets) and one active session per experiment (a partial unique index,
so concurrent starts cannot both win, whatever they read before)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import experiment_dict
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from labswarm.db import make_engine, make_sessionmaker
from labswarm.errors import Conflict
from labswarm.sessions import ledger
from labswarm.sessions.models import ACTIVE, ExperimentRow, SessionRow
from labswarm.sessions.service import SessionService
from labswarm.settings import Settings


def test_a_ledger_row_of_an_unknown_session_is_refused(database_url: str) -> None:
    engine = make_engine(database_url)
    try:
        with make_sessionmaker(engine)() as db:
            db.add(ExperimentRow(name="e", config={}, fingerprint="f"))
            db.add(SessionRow(id="known", experiment="e", status="running", rate=1.0, fingerprint="f"))
            db.commit()
            ledger.add_samples(db, "known", [("a", "published", None)])
            db.commit()
            with pytest.raises(IntegrityError, match=r"(?i)foreign key"):
                ledger.add_samples(db, "unknown", [("a", "published", None)])
                db.commit()
            db.rollback()
            with pytest.raises(IntegrityError, match=r"(?i)foreign key"):
                db.add(SessionRow(id="orphan", experiment="no-such-experiment", status="completed", rate=1.0,
                                  fingerprint="f"))
                db.commit()
            db.rollback()
            assert ledger.counts(db, "known")["published"] == 1
    finally:
        engine.dispose()


@pytest.fixture
def service(database_url: str, tmp_path: Path) -> Iterator[SessionService]:
    svc = SessionService(Settings(home=tmp_path / "home", database_url=database_url, data_roots=[tmp_path]))
    try:
        yield svc
    finally:
        svc.stop()
        svc.engine.dispose()


def test_concurrent_starts_of_one_experiment_make_one_active_session(service: SessionService, tone_dataset: Path,
                                                                     tmp_path: Path) -> None:
    """Eight threads start a session of one experiment at the same moment: one wins, seven get Conflict (without
    the index, several pass the read check before any insert and all of them win)."""
    n = 8
    service.registry.register(experiment_dict(tone_dataset, tmp_path / "store", name="race"))
    barrier = threading.Barrier(n)
    started: list[SessionRow] = []
    conflicts: list[Conflict] = []
    others: list[BaseException] = []

    def start() -> None:
        barrier.wait(10)
        try:
            started.append(service.start_session("race", 0.5))
        except Conflict as exc:
            conflicts.append(exc)
        except BaseException as exc:  # collected: the assertion below names it
            others.append(exc)

    threads = [threading.Thread(target=start) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert others == [] and len(started) == 1 and len(conflicts) == n - 1
    assert all("already has an active session" in str(c) for c in conflicts)
    with service.db() as db:
        active = list(db.scalars(select(SessionRow.id).where(SessionRow.experiment == "race",
                                                             SessionRow.status.in_(ACTIVE))))
    assert active == [started[0].id]
    # once it has ended, the experiment may be started again
    service.cancel(started[0].id)
    assert service.start_session("race", 0.5).status == "running"
