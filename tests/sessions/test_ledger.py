"""The per-sample ledger on real databases: SQLite (WAL, foreign keys on, as the manager opens it) and
PostgreSQL (the ``database_url`` fixture runs each test on both)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from labswarm.db import make_engine, make_sessionmaker
from labswarm.sessions import ledger
from labswarm.sessions.models import ExperimentRow, SampleRow, SessionRow

SID = "s1"


@pytest.fixture
def db(database_url: str) -> Iterator[Session]:
    engine = make_engine(database_url)
    with make_sessionmaker(engine)() as session:
        session.add(ExperimentRow(name="e", config={}, fingerprint="f"))
        session.flush()
        session.add(SessionRow(id=SID, experiment="e", status="running", rate=1.0, fingerprint="f"))
        session.add(SessionRow(id="other", experiment="e", status="completed", rate=1.0, fingerprint="f"))
        session.commit()
        yield session
    engine.dispose()


def _row(db: Session, sample_id: str) -> SampleRow:
    db.expire_all()
    return db.get(SampleRow, (SID, sample_id))


def test_sqlite_pragmas(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'manager.sqlite'}")
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    finally:
        engine.dispose()


def test_add_samples_is_idempotent(db: Session) -> None:
    ledger.add_samples(db, SID, [("a", "published", None), ("b", "cached", None)])
    db.commit()
    ledger.record_outcomes(db, SID, [{"sample_id": "a", "status": "computed", "seconds": 0.1}])
    # a restarted publisher adds the same rows again (and one new): nothing existing changes
    ledger.add_samples(db, SID, [("a", "published", None), ("b", "published", None), ("c", "published", None)])
    ledger.add_samples(db, SID, [])
    db.commit()
    assert ledger.counts(db, SID) == {"published": 1, "done": 1, "cached": 1, "failed": 0}
    assert _row(db, "a").status == "done" and _row(db, "a").attempts == 1


def test_record_outcomes_never_downgrades_a_success(db: Session) -> None:
    ledger.add_samples(db, SID, [("a", "published", None), ("b", "published", None), ("c", "cached", None)])
    applied, rejected = ledger.record_outcomes(db, SID, [
        {"sample_id": "a", "status": "computed", "reason": None, "seconds": 0.2},
        {"sample_id": "b", "status": "failed", "reason": "AudioError: b.wav: unreadable", "seconds": 0.01},
        {"sample_id": "z", "status": "bogus"},  # unknown statuses are ignored
    ])
    db.commit()
    assert (applied, rejected) == (2, [])
    assert (_row(db, "a").status, _row(db, "a").seconds) == ("done", 0.2)
    # a duplicate delivery of a done sample fails (e.g. a transient error): it stays done, reason-free
    ledger.record_outcomes(db, SID, [
        {"sample_id": "a", "status": "failed", "reason": "StoreError: disk full"},
        {"sample_id": "c", "status": "failed", "reason": "late"},
    ])
    db.commit()
    assert (_row(db, "a").status, _row(db, "a").reason) == ("done", None)
    assert _row(db, "c").status == "cached"
    # a failure can be upgraded by a later success
    ledger.record_outcomes(db, SID, [{"sample_id": "b", "status": "done", "seconds": 0.3}])
    db.commit()
    assert (_row(db, "b").status, _row(db, "b").reason) == ("done", None)
    # an outcome can arrive before the publisher committed its ledger row (the sample is in flight)
    ledger.record_outcomes(db, SID, [{"sample_id": "early", "status": "cached"}], in_flight={"early"})
    ledger.add_samples(db, SID, [("early", "published", None)])
    db.commit()
    assert _row(db, "early").status == "cached"
    assert ledger.counts(db, SID) == {"published": 0, "done": 2, "cached": 2, "failed": 0}


def test_outcomes_of_samples_not_of_the_session_are_rejected_and_not_recorded(db: Session) -> None:
    """Issue 11, item 6: an outcome names a sample of its session (in its ledger, or in flight); another
    session's sample or an unknown id is refused and never written, and the rest of the batch is recorded."""
    ledger.add_samples(db, SID, [("a", "published", None), ("b", "published", None)])
    ledger.add_samples(db, "other", [("x", "published", None)])
    db.commit()
    applied, rejected = ledger.record_outcomes(db, SID, [
        {"sample_id": "a", "status": "computed"}, {"sample_id": "x", "status": "computed"},
        {"sample_id": "/etc/passwd#0", "status": "failed", "reason": "forged"},
        {"sample_id": "b", "status": "failed", "reason": "r"}, {"sample_id": "soon", "status": "computed"},
    ], in_flight={"soon"})
    db.commit()
    assert (applied, rejected) == (3, ["x", "/etc/passwd#0"])
    rows = {(r.session_id, r.sample_id): r.status for r in db.scalars(select(SampleRow))}
    assert rows == {(SID, "a"): "done", (SID, "b"): "failed", (SID, "soon"): "done", ("other", "x"): "published"}
    assert ledger.counts(db, SID) == ledger.counters(db.get(SessionRow, SID, populate_existing=True)) == {
        "published": 0, "done": 2, "cached": 0, "failed": 1}


def test_counts_pending_and_failures(db: Session) -> None:
    assert ledger.counts(db, SID) == {"published": 0, "done": 0, "cached": 0, "failed": 0}
    ledger.add_samples(db, SID, [(f"s{i}", "published", None) for i in range(5)])
    ledger.add_samples(db, "other", [("s0", "published", None)])
    ledger.record_outcomes(db, SID, [{"sample_id": "s0", "status": "computed"},
                                     {"sample_id": "s1", "status": "failed", "reason": "r1"}])
    ledger.add_attempt(db, SID, ["s2"])
    db.commit()
    assert ledger.counts(db, SID) == {"published": 3, "done": 1, "cached": 0, "failed": 1}
    assert dict(ledger.pending(db, SID)) == {"s2": 2, "s3": 1, "s4": 1}
    assert [(r.sample_id, r.reason) for r in ledger.failures(db, SID)] == [("s1", "r1")]
    # reconciliation: found in the store / out of attempts
    ledger.set_status(db, SID, ["s3", "s0"], "done", None)  # s0 has its outcome already: untouched
    ledger.set_status(db, SID, ["s4"], "failed", "no outcome")
    db.commit()
    assert dict(ledger.pending(db, SID)) == {"s2": 2}
    assert [r.sample_id for r in ledger.failures(db, SID, limit=1, offset=1)] == ["s4"]
    assert ledger.counts(db, "other")["published"] == 1


def test_redelivery_counts_attempts_up_to_max(db: Session) -> None:
    ledger.add_samples(db, SID, [("poison", "published", None), ("ok", "published", None)])
    db.commit()
    # the first delivery was attempt 1; with max_attempts 3, redeliveries 2 and 3 may run, the 4th may not
    assert ledger.redelivery(db, SID, "poison", 3) is True
    assert ledger.redelivery(db, SID, "poison", 3) is True
    db.commit()
    assert _row(db, "poison").attempts == 3 and _row(db, "poison").status == "published"
    assert ledger.redelivery(db, SID, "poison", 3) is False
    db.commit()
    row = _row(db, "poison")
    assert row.status == "failed" and "3 deliveries" in row.reason
    assert dict(ledger.pending(db, SID)) == {"ok": 1}
    # a redelivered sample that already has its outcome is not run again
    ledger.record_outcomes(db, SID, [{"sample_id": "ok", "status": "computed"}])
    db.commit()
    assert ledger.redelivery(db, SID, "ok", 3) is False
    assert _row(db, "ok").attempts == 1
    # a sample the ledger does not know yet (row not committed) runs
    assert ledger.redelivery(db, SID, "unknown", 3) is True


def test_a_batch_naming_a_sample_twice_ends_as_its_outcomes_applied_in_order(db: Session) -> None:
    """record_outcomes upserts each sample once per batch (one statement): the last word, but a success stays;
    seconds and finish time are the last outcome's; the counters move once per sample, as the ledger did."""
    ledger.add_samples(db, SID, [(s, "published", None) for s in ("a", "b", "c", "d")])
    ledger.add_samples(db, "other", [("a", "published", None)])
    db.commit()
    applied, rejected = ledger.record_outcomes(db, SID, [
        {"sample_id": "a", "status": "failed", "reason": "oom", "seconds": 1.0},
        {"sample_id": "a", "status": "computed", "seconds": 2.0, "finished_at": 20.0},  # a retry succeeded
        {"sample_id": "b", "status": "computed", "seconds": 3.0},
        {"sample_id": "b", "status": "failed", "reason": "late duplicate", "seconds": 4.0},  # does not undo it
        {"sample_id": "c", "status": "failed", "reason": "r1"}, {"sample_id": "c", "status": "failed", "reason": "r2"},
        {"sample_id": "nope", "status": "computed"}, {"sample_id": "nope", "status": "failed"},
    ])
    db.commit()
    assert (applied, rejected) == (6, ["nope", "nope"])
    a, b, c, d = (_row(db, s) for s in "abcd")
    assert (a.status, a.reason, a.seconds, a.finished_at) == ("done", None, 2.0, 20.0)
    assert (b.status, b.reason, b.seconds) == ("done", None, 4.0)
    assert (c.status, c.reason) == ("failed", "r2")
    assert d.status == "published" and _row(db, "nope") is None
    assert db.get(SampleRow, ("other", "a")).status == "published"
    assert ledger.counts(db, SID) == ledger.counters(db.get(SessionRow, SID, populate_existing=True)) == {
        "published": 1, "done": 2, "cached": 0, "failed": 1}
    # a later batch: a success stays, a failure may still become a success
    ledger.record_outcomes(db, SID, [{"sample_id": "b", "status": "failed"}, {"sample_id": "c", "status": "cached"}])
    db.commit()
    assert ledger.counts(db, SID) == ledger.counters(db.get(SessionRow, SID, populate_existing=True)) == {
        "published": 1, "done": 2, "cached": 1, "failed": 0}


def test_record_outcomes_checks_the_session_and_its_owner_in_its_transaction(db: Session) -> None:
    """The owner check of POST /sessions/{id}/outcomes happens in the ledger write: another user's session, or
    none, is NotFound and nothing is written; its owner (and an admin: no owner given) records."""
    from labswarm.errors import NotFound

    ledger.add_samples(db, SID, [("a", "published", None), ("b", "published", None)])
    db.execute(update(SessionRow).where(SessionRow.id == SID).values(owner="alice"))
    db.commit()
    for session_id, owner in ((SID, "bob"), ("missing", None), ("missing", "alice")):
        with pytest.raises(NotFound, match="no session"):
            ledger.record_outcomes(db, session_id, [{"sample_id": "a", "status": "computed"}], owner=owner)
        db.rollback()
    assert _row(db, "a").status == "published"
    assert ledger.record_outcomes(db, SID, [{"sample_id": "a", "status": "computed"}], owner="alice") == (1, [])
    assert ledger.record_outcomes(db, SID, [{"sample_id": "b", "status": "computed"}]) == (1, [])
    db.commit()
    assert ledger.counters(db.get(SessionRow, SID, populate_existing=True))["done"] == 2
