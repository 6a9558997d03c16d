"""The fair-share order (labswarm.jobs.lifecycle.fairshare) on a real, migrated SQLite database: usage read from
the attempts of the jobs' rows, decayed by the half-life; with one slot and equal weights two users alternate,
with weight 2 a user gets two starts for the other's one; priority orders a user's own jobs only; the default
slots are the cores the process may run on (a child pinned to one core gets 1)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from labswarm.db.engine import make_engine, make_sessionmaker
from labswarm.jobs.lifecycle.fairshare import FairQueue, decayed_seconds, machine_slots, queue_order, usage
from labswarm.jobs.records.models import AttemptRow, JobRow

T0 = datetime(2026, 11, 26, 12, 0, 0)
WEEK = 7 * 24 * 3600.0


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Session]:
    engine = make_engine(f"sqlite:///{tmp_path / 'jobs.sqlite'}")
    with make_sessionmaker(engine)() as session:
        yield session
    engine.dispose()


def _job(db: Session, job_id: str, owner: str, at: int, *, priority: int = 0, learners: int = 1) -> JobRow:
    job = JobRow(id=job_id, name=job_id, status="queued", priority=priority, experiment="e", manifest={},
                 learners=learners, submitted_at=T0 + timedelta(seconds=at), owner=owner)
    db.add(job)
    db.flush()
    return job


def _run(db: Session, job: JobRow, start: datetime, seconds: float) -> datetime:
    """Record ``job`` as having run one attempt of ``seconds`` from ``start`` (completed); returns its end."""
    end = start + timedelta(seconds=seconds)
    job.status = "completed"
    db.add(AttemptRow(job_id=job.id, number=1, started_at=start, ended_at=end))
    db.flush()
    return end


def _starts(db: Session, weights: dict[str, float], seconds: float = 60.0) -> list[str]:
    """Run the queue on one slot: each time, the head of the fair order runs ``seconds``; the owners in order."""
    now, order = T0 + timedelta(hours=1), []
    while jobs := queue_order(db, lambda user: weights.get(user, 1.0), WEEK, now):
        now = _run(db, jobs[0], now, seconds)
        order.append(jobs[0].owner)
    return order


def test_two_users_on_one_slot_alternate_instead_of_first_come_first_served(db: Session) -> None:
    for i in range(3):
        _job(db, f"a{i}", "alice", i)
    for i in range(3):
        _job(db, f"b{i}", "bob", 10 + i)  # every one of bob's jobs submitted after all of alice's
    assert _starts(db, {}) == ["alice", "bob"] * 3  # submission order would be alice x3, then bob x3


def test_a_weight_of_two_gets_two_starts_for_one(db: Session) -> None:
    for i in range(4):
        _job(db, f"a{i}", "alice", i)
        _job(db, f"b{i}", "bob", 10 + i)
    order = _starts(db, {"bob": 2.0})
    assert order[:6].count("bob") == 4 and order[:6].count("alice") == 2, order


def test_priority_orders_a_user_s_own_jobs_and_not_the_others(db: Session) -> None:
    _job(db, "a-low", "alice", 0)
    _job(db, "a-high", "alice", 1, priority=9)
    _job(db, "b", "bob", 2)
    now = T0 + timedelta(hours=1)
    assert [j.id for j in queue_order(db, lambda _: 1.0, WEEK, now)] == ["a-high", "b", "a-low"]


def test_held_slots_come_before_history_and_usage_decays_by_the_half_life(db: Session) -> None:
    now = T0 + timedelta(days=30)
    old = _job(db, "old", "alice", 0, learners=2)
    _run(db, old, now - timedelta(days=7, hours=1), 3600.0)  # an hour of 2 learners, a week ago
    used = usage(db, {"alice", "bob"}, now, WEEK)
    assert used["bob"] == 0.0
    # one half-life ago it counts about half: 2 learners x the integral of 2^(-age / H) over ages 7 d to 7 d 1 h
    assert used["alice"] == pytest.approx(2 * WEEK / math.log(2) * (2 ** -1 - 2 ** -(1 + 1 / 168)))
    assert 0.49 * 7200 < used["alice"] < 0.5 * 7200
    assert decayed_seconds(now - timedelta(seconds=10), None, now, 1e9) == pytest.approx(10.0, rel=1e-4)
    a, b = _job(db, "a", "alice", 1), _job(db, "b", "bob", 2)
    fair = FairQueue([a, b], {"bob": 1}, used, lambda _: 1.0)  # bob holds a slot, alice has the history
    assert fair.peek() is a


def test_the_default_slots_are_the_cores_this_process_may_run_on() -> None:
    assert machine_slots() == len(os.sched_getaffinity(0))
    pinned = subprocess.run(
        [sys.executable, "-c", "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
         "from labswarm.jobs.lifecycle.fairshare import machine_slots; print(machine_slots())"],
        capture_output=True, text=True, check=True)
    assert pinned.stdout.strip() == "1"
