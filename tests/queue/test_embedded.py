"""The embedded broker (kombu's SQLAlchemy transport on SQLite, no server) loses no sample either: it cannot
redeliver a killed worker's task, so the session's ledger republishes what has no outcome."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from labswarm.queue.app import declare_queue, make_celery


def _declare(broker_url: str, barrier, results) -> None:
    app = make_celery(broker_url)
    barrier.wait()
    try:
        declare_queue(app, "race")
        results.put("ok")
    except Exception as exc:
        results.put(f"{type(exc).__name__}: {exc}")


def test_concurrent_declarations_on_a_fresh_broker(tmp_path: Path) -> None:
    # a manager starting a session while its workers start: kombu creates its tables and the queue row by
    # check-then-insert ("table kombu_queue already exists", "UNIQUE constraint failed") unless serialized
    ctx = multiprocessing.get_context("fork")
    for trial in range(5):
        url = f"sqla+sqlite:///{tmp_path / f'broker-{trial}.sqlite'}"
        barrier, results = ctx.Barrier(4), ctx.Queue()
        procs = [ctx.Process(target=_declare, args=(url, barrier, results)) for _ in range(4)]
        for p in procs:
            p.start()
        outcomes = [results.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(10)
        assert outcomes == ["ok"] * 4


@pytest.mark.slow
def test_plain_run_completes(make_cluster) -> None:
    cluster = make_cluster(tones=8)
    cluster.start(workers=2, rate=None)
    assert cluster.client.settings()["broker_url"].startswith("sqla+sqlite:///")
    progress = cluster.wait_completed()
    cluster.assert_no_loss(progress)
    assert progress["done"] == progress["total"] and progress["republished"] == 0


@pytest.mark.slow
def test_whole_worker_killed(make_cluster) -> None:
    cluster = make_cluster()
    cluster.start(workers=2)
    cluster.wait_outcomes()
    cluster.kill_worker()
    at_kill = cluster.progress()["finished"]
    progress = cluster.wait_completed()
    assert progress["finished"] > at_kill  # the other worker went on
    cluster.assert_no_loss(progress)
