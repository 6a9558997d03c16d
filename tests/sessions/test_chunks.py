"""Statements with more ids than a database takes in one statement work in chunks (issue 10: SQLite allows
32,766 bound parameters, PostgreSQL 65,535): 40,000 ids through every ledger call that takes a list, on real
SQLite and PostgreSQL (the ``database_url`` fixture)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import pytest
from sqlalchemy import event, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from labswarm.db import make_engine, make_sessionmaker
from labswarm.sessions import ledger
from labswarm.sessions.models import ExperimentRow, SessionRow

SID = "big"
N = 40_000  # over SQLite's 32,766 bound parameters


def limited_engine(url: str) -> Engine:
    """The manager's engine; on SQLite each connection gets SQLite's default limit of bound parameters
    (32,766: Debian's build raises it to 250,000, which would hide a statement past the default)."""
    engine = make_engine(url)
    if url.startswith("sqlite"):
        engine.dispose()

        @event.listens_for(engine, "connect")
        def _limit(dbapi_conn, _record) -> None:
            dbapi_conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, ledger.MAX_PARAMETERS)
    return engine


@pytest.fixture
def db(database_url: str) -> Iterator[Session]:
    engine = limited_engine(database_url)
    with make_sessionmaker(engine)() as session:
        session.add(ExperimentRow(name="e", config={}, fingerprint="f"))
        session.flush()
        session.add(SessionRow(id=SID, experiment="e", status="running", rate=1.0, fingerprint="f"))
        session.commit()
        yield session
    engine.dispose()


def test_chunks_are_lazy_and_bounded() -> None:
    def ids():
        yield from range(10)
        raise AssertionError("read past what was asked")  # never reached: only two chunks are taken

    it = ledger.chunks(ids(), 4)
    assert [next(it), next(it)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert list(ledger.chunks([], 3)) == []
    assert [len(c) for c in ledger.chunks(range(N))] == [ledger.CHUNK] * (N // ledger.CHUNK)
    with pytest.raises(ValueError, match="size"):
        list(ledger.chunks([1], ledger.MAX_PARAMETERS))


def test_one_statement_with_all_ids_is_refused_by_sqlite(tmp_path) -> None:
    """The limit is real (so the test below can fail): 40,000 ids in one IN list are refused."""
    engine = limited_engine(f"sqlite:///{tmp_path / 'm.sqlite'}")
    with engine.connect() as conn, pytest.raises(Exception, match="too many SQL variables"):
        placeholders = ",".join("?" * N)
        conn.exec_driver_sql(f"SELECT 1 WHERE 1 IN ({placeholders})", tuple(range(N)))
    engine.dispose()


def test_40k_ids_through_every_ledger_call(db: Session) -> None:
    ids = [f"clip{i:06d}.wav#{i % 9}" for i in range(N)]
    ledger.add_samples(db, SID, [(sid, "published", None) for sid in ids])
    db.commit()
    assert ledger.count_pending(db, SID) == N
    ledger.add_attempt(db, SID, iter(ids))  # a generator: never a list of every id
    db.commit()
    assert ledger.pending_among(db, SID, ids[:3]) == dict.fromkeys(ids[:3], 2)
    assert len(ledger.pending_among(db, SID, (i for i in ids))) == N
    n, rejected = ledger.record_outcomes(db, SID, ({"sample_id": sid, "status": "computed"} for sid in ids[: N // 2]))
    db.commit()
    assert (n, rejected) == (N // 2, [])
    assert ledger.set_status(db, SID, ids, "failed", "lost") == N - N // 2  # only the pending ones change
    db.commit()
    assert ledger.counts(db, SID) == {"published": 0, "done": N // 2, "cached": 0, "failed": N - N // 2}
    assert not ledger.has_pending(db, SID)
    page = ledger.failures(db, SID, limit=10)
    assert [r.sample_id for r in page] == sorted(ids[N // 2:])[:10]


def test_pending_streams_by_sample_id_in_pages(db: Session) -> None:
    ids = [f"s{i:05d}" for i in range(12_345)]
    ledger.add_samples(db, SID, [(sid, "published", None) for sid in ids])
    ledger.set_status(db, SID, ids[::3], "done", None)
    db.commit()
    queries = []
    engine = db.get_bind()
    listener = lambda *args: queries.append(args[2])  # noqa: E731
    event.listen(engine, "before_cursor_execute", listener)
    try:
        stream = ledger.pending(db, SID, page=1000)
        first = next(stream)
        assert first == (ids[1], 1) and len(queries) == 1  # one page read, not the whole ledger
        rest = list(stream)
    finally:
        event.remove(engine, "before_cursor_execute", listener)
    expected = [sid for k, sid in enumerate(ids) if k % 3]
    assert [first[0], *(sid for sid, _ in rest)] == expected
    assert len(queries) == len(expected) // 1000 + 1
    assert db.execute(text("SELECT count(*) FROM samples")).scalar() == len(ids)


def test_statements_have_one_text_whatever_the_number_of_ids(db: Session) -> None:
    """The memory fix: SQLite keeps every distinct statement prepared (~1 MB for an IN list of 5,000 ids), so a
    statement's text must not depend on how many ids it names."""
    texts: list[str] = []
    engine = db.get_bind()
    listener = lambda *args: texts.append(args[2])  # noqa: E731
    ids = [f"s{i:05d}" for i in range(3_000)]
    event.listen(engine, "before_cursor_execute", listener)
    try:
        for n in (1, 7, 2_999):
            texts.clear()
            ledger.add_samples(db, SID, [(sid, "published", None) for sid in ids[:n]])
            ledger.pending_among(db, SID, ids[:n])
            ledger.add_attempt(db, SID, ids[:n])
            ledger.set_status(db, SID, ids[n - 1:n], "done", None)
            ledger.record_outcomes(db, SID, [{"sample_id": sid, "status": "computed"} for sid in ids[:n]])
            db.commit()
            assert max(len(t) for t in texts) < 1_000, n  # no id list spelt out in the text
            ledger_texts = [t for t in texts if not t.startswith("UPDATE sessions SET")]  # counters: <= 15 shapes
            if n == 1:
                first = ledger_texts
            assert ledger_texts == first, n
    finally:
        event.remove(engine, "before_cursor_execute", listener)


def test_counters_on_the_session_row_follow_every_ledger_write(db: Session) -> None:
    """Progress reads the session row's counters: each ledger write moves them as the ledger moved, and
    ``recount`` (the ledger is the truth) finds nothing to correct."""
    def counters() -> dict[str, int]:
        db.expire_all()
        return ledger.counters(db.get(SessionRow, SID))

    ids = [f"s{i:05d}" for i in range(12_000)]
    # before its ledger row: the publisher has it in flight
    ledger.record_outcomes(db, SID, [{"sample_id": "early", "status": "computed"}], in_flight={"early"})
    ledger.add_samples(db, SID, [(sid, "cached" if k % 4 == 0 else "published", None) for k, sid in enumerate(ids)]
                       + [("early", "published", None)])
    db.commit()
    assert counters() == ledger.counts(db, SID) == {"published": 9_000, "done": 1, "cached": 3_000, "failed": 0}
    outcomes = [{"sample_id": sid, "status": "failed", "reason": "x"} for sid in ids[:6_000]]
    outcomes += [{"sample_id": sid, "status": "computed"} for sid in ids[:2_000]]  # twice in one batch: done wins
    ledger.record_outcomes(db, SID, outcomes)
    ledger.set_status(db, SID, ids, "failed", "lost")
    ledger.add_samples(db, SID, [(sid, "published", None) for sid in ids])  # a restarted publisher: no change
    db.commit()
    ledger.add_samples(db, SID, [("poison", "published", None)])
    for _ in range(3):
        ledger.redelivery(db, SID, "poison", 2)
    db.commit()
    truth = ledger.counts(db, SID)
    assert truth == {"published": 0, "done": 1 + 1_500, "cached": 3_000, "failed": 12_000 - 3_000 - 1_500 + 1}
    assert counters() == truth
    assert ledger.recount(db, SID) == truth
    db.commit()
    assert counters() == truth
