"""The session runner's publish phase: the start window and the batches (a real SQLite ledger; the embedded
broker, or an in-memory broker where a test needs to see or cut the batches)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from helpers import experiment_dict, write_dataset

from labswarm.sample import Sample, iter_samples
from labswarm.sessions import ledger
from labswarm.sessions.models import SessionRow
from labswarm.sessions.runner import BATCH
from labswarm.sessions.service import SessionService
from labswarm.sessions.window import StartWindow
from labswarm.settings import Settings

WINDOW = 5


class MemoryBroker:
    """The broker client's interface, in memory: keeps every published sample id and each batch's size.

    Args:
        cut: ``(call, confirmed)``: on that ``publish_many`` call (1-based) confirm only the first ``confirmed``
            samples and set ``stop`` (the manager stops mid-batch).
        gate: when given, every ``publish_many`` waits until it is set (a test reads the ledger before anything
            more can be published).
    """

    def __init__(self, cut: tuple[int, int] | None = None, gate: threading.Event | None = None) -> None:
        self.ids: list[str] = []
        self.batches: list[int] = []
        self.cut = cut
        self.gate = gate
        self.lost = False  # the queue lost its messages: it reports an empty queue

    def declare_queue(self, experiment: str) -> None:
        pass

    def publish_many(self, session_id: str, experiment: str, samples: Sequence[Sample],
                     stop: threading.Event, per_message: int | None = None) -> int:
        if self.gate is not None:
            self.gate.wait(30)
        self.batches.append(len(samples))
        n = len(samples)
        if self.cut is not None and len(self.batches) == self.cut[0]:
            n = min(n, self.cut[1])
            stop.set()
        self.ids.extend(s.id for s in samples[:n])
        return n

    def publish(self, session_id: str, experiment: str, sample: Sample, stop: threading.Event) -> bool:
        return self.publish_many(session_id, experiment, [sample], stop) == 1

    def queue_depth(self, experiment: str) -> int:
        return 0 if self.lost else len(self.ids)

    def purge_queue(self, experiment: str) -> None:
        self.ids.clear()


@pytest.fixture
def experiment(tmp_path: Path) -> dict:
    """30 clips x 3 transformations: 90 samples, none in the store."""
    data = write_dataset(tmp_path / "data", n_per_label=15)
    return experiment_dict(data, tmp_path / "store", name="win",
                           transformations=[{"name": "identity"}, {"name": "gain", "gain_db": -6.0},
                                            {"name": "gain", "gain_db": -3.0}])


@pytest.fixture
def make_service(tmp_path: Path) -> Iterator[Callable[..., SessionService]]:
    services: list[SessionService] = []

    def make(broker: MemoryBroker | None = None, **settings) -> SessionService:
        service = SessionService(Settings(home=tmp_path / "home", start_window=WINDOW, **settings), broker=broker)
        services.append(service)
        return service

    yield make
    for service in services:
        service.stop()


def _wait(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def _row(service: SessionService, sid: str) -> SessionRow:
    with service.db() as db:
        return db.get(SessionRow, sid)


def _held(service: SessionService, sid: str, published: int) -> bool:
    """The runner waits on its window with ``published`` samples committed (it commits before waiting)."""
    runner = service._runners[sid]
    return runner.window.allowance() == 0 and _row(service, sid).published >= published


def _outcomes(ids: Sequence[str]) -> list[dict]:
    return [{"sample_id": i, "status": "computed", "seconds": 0.01} for i in ids]


def test_the_window_holds_the_publisher_until_outcomes_open_it_on_the_embedded_broker(
        make_service, experiment: dict) -> None:
    # the embedded SQLite broker: the queue really holds the messages, one sample each (its depth counts messages)
    service = make_service(samples_per_message=1)
    service.registry.register(experiment)
    sid = service.start_session("win", rate=1000.0).id  # far above anything: only the window holds it
    _wait(lambda: _held(service, sid, WINDOW), "the start window to fill")
    assert _row(service, sid).published == WINDOW
    assert service.broker.queue_depth("win") == WINDOW
    # two outcomes: two samples less outstanding and the window two wider (slow start): four more
    ids = [s.id for s in iter_samples(service.registry.config("win"))]
    service.record_outcomes(sid, _outcomes(ids[:2]))
    _wait(lambda: _held(service, sid, WINDOW + 4), "the window to open")
    assert _row(service, sid).published == WINDOW + 4
    assert service._runners[sid].window.window == WINDOW + 2
    # the first rate set (the controller's first decision) lifts the window: the rate alone governs
    service.set_rate(sid, 5000.0)
    _wait(lambda: _row(service, sid).published == 90, "every sample published")
    assert service.broker.queue_depth("win") == 90
    service.cancel(sid)


def test_samples_lost_from_the_queue_do_not_stall_the_window(make_service, experiment: dict) -> None:
    broker = MemoryBroker()
    service = make_service(broker, reconcile_after=0.5)
    service.registry.register(experiment)
    sid = service.start_session("win", rate=1000.0).id
    _wait(lambda: _held(service, sid, WINDOW), "the start window to fill")
    assert len(broker.ids) == WINDOW
    # the queue holds messages: no outcome, yet nothing is lost; the window stays shut past reconcile_after
    runner = service._runners[sid]
    _wait(lambda: time.monotonic() - runner.last_progress > 1.0, "reconcile_after to pass")
    assert len(broker.ids) == WINDOW
    # the queue says it is empty (its messages lost): the window stops counting them, the publisher goes on
    broker.lost = True
    _wait(lambda: len(broker.ids) >= 2 * WINDOW, "the window to stop counting the lost samples")
    service.cancel(sid)


def test_batches_are_bounded_and_the_ledger_has_every_sample_once(make_service, experiment: dict) -> None:
    broker = MemoryBroker()
    service = make_service(broker)
    service.registry.register(experiment)
    sid = service.start_session("win", rate=100_000.0).id
    service.set_rate(sid, 100_000.0)  # lifted: only the bucket (bursts of up to BATCH tokens) sizes the batches
    _wait(lambda: _row(service, sid).cursor == 90, "the cursor at the end")
    ids = [s.id for s in iter_samples(service.registry.config("win"))]
    assert broker.ids == ids  # in order, each once
    assert max(broker.batches) <= BATCH and sum(broker.batches) == 90
    assert max(broker.batches) > 1  # the tokens there were taken together: batched
    with service.db() as db:
        assert ledger.counts(db, sid)["published"] == 90
    service.cancel(sid)


def test_a_stop_mid_batch_resumes_at_the_first_unconfirmed_sample(make_service, experiment: dict) -> None:
    # the first batch (the start window's 5) is confirmed only in part when the manager stops
    first = MemoryBroker(cut=(1, 3))
    service = make_service(first)
    service.registry.register(experiment)
    sid = service.start_session("win", rate=100_000.0).id
    runner = service._runners[sid]
    runner.join(30)
    assert not runner.is_alive(), (first.batches, first.ids)
    sent = len(first.ids)
    assert len(first.batches) == 1 and sent == min(3, first.batches[0]) and first.batches[0] <= WINDOW
    assert _row(service, sid).cursor == sent and _row(service, sid).published == sent
    service.stop()
    # a new manager process on the same database resumes from the cursor: nothing skipped, nothing twice
    gate = threading.Event()  # the resumed runner may publish the window's rest at once: the ledger is read first
    second = MemoryBroker(gate=gate)
    service = make_service(second)
    service.start()
    with service.db() as db:
        counts = ledger.counts(db, sid)
    assert counts["published"] == sent  # outstanding from the previous process: they count against its window
    gate.set()
    service.set_rate(sid, 100_000.0)
    _wait(lambda: _row(service, sid).cursor == 90, "the resumed session to publish the rest")
    ids = [s.id for s in iter_samples(service.registry.config("win"))]
    assert first.ids + second.ids == ids
    service.cancel(sid)


def test_cached_samples_on_the_way_are_recorded_without_messages(make_service, experiment: dict) -> None:
    broker = MemoryBroker()
    service = make_service(broker)
    service.registry.register(experiment)
    ids = [s.id for s in iter_samples(service.registry.config("win"))]
    cached = set(ids[::3])

    class EveryThirdCached:
        def is_cached(self, sample: Sample) -> bool:
            return sample.id in cached

    sid = service.start_session("win", rate=100_000.0).id
    runner = service._runners[sid]
    runner.stop()
    runner.join(30)
    with service.db() as db:  # start over from an empty ledger, the runner's phase run by hand
        row = db.get(SessionRow, sid)
        row.cursor, row.published = 0, 0
        db.query(ledger.SampleRow).filter_by(session_id=sid).delete()
        db.commit()
    broker.ids.clear()
    runner.stop_event.clear()
    runner.window.lift()
    runner._publish_phase(EveryThirdCached())
    assert broker.ids == [i for i in ids if i not in cached]
    with service.db() as db:
        assert ledger.counts(db, sid) == {"published": 60, "cached": 30, "done": 0, "failed": 0}
        assert db.get(SessionRow, sid).cursor == 90


def test_start_window_opens_by_one_per_outcome_up_to_seconds_of_the_consume_rate() -> None:
    now = [0.0]
    window = StartWindow(4, seconds=5.0, clock=lambda: now[0])
    assert window.allowance() == 4
    window.sent(4)
    assert window.allowance() == 0
    window.outcomes(2, max_seconds=0.1)  # 2 fewer outstanding, window 6
    assert window.allowance() == 4
    # steady 10 outcomes/s: the window stops at 10/s x (0.1 s + 5 s) = 51, however many outcomes arrive
    for _ in range(100):
        now[0] += 0.1
        window.sent(1)
        window.outcomes(1, max_seconds=0.1)
    assert window.window == pytest.approx(10 * 5.1, rel=0.05)
    window.lift()
    assert window.allowance() is None and window.lifted
    with pytest.raises(ValueError, match="start_window"):
        StartWindow(0)


class AnsweringBroker(MemoryBroker):
    """A broker whose worker answers each sample while it is being published, before the publisher has
    committed its ledger rows (the fastest worker there can be): the outcomes go through the service."""

    def __init__(self) -> None:
        super().__init__()
        self.service: SessionService | None = None
        self.answers: list[tuple[int, list[dict]]] = []

    def publish_many(self, session_id: str, experiment: str, samples: Sequence[Sample],
                     stop: threading.Event, per_message: int | None = None) -> int:
        n = super().publish_many(session_id, experiment, samples, stop)
        self.answers.append(self.service.record_outcomes(session_id, _outcomes([s.id for s in samples[:n]])))
        return n


def test_outcomes_that_beat_the_ledger_commit_are_recorded_not_rejected(make_service, experiment: dict) -> None:
    """Issue 11, item 6: outcomes are only for the session's samples, and a sample the publisher has handed to the
    broker is one, though its ledger row is not yet committed: none of these outcomes is rejected, each counts
    once, and the session completes without reconciliation."""
    broker = AnsweringBroker()
    service = make_service(broker)
    broker.service = service
    service.registry.register(experiment)
    sid = service.start_session("win", rate=100_000.0).id
    service.set_rate(sid, 100_000.0)
    _wait(lambda: _row(service, sid).status == "completed", "the session completed")
    assert [rejected for _applied, rejected in broker.answers if rejected] == []
    assert sum(applied for applied, _rejected in broker.answers) == 90
    assert ledger.counters(_row(service, sid)) == {"published": 0, "done": 90, "cached": 0, "failed": 0}
    assert service._runners.get(sid) is None or not service._runners[sid].in_flight(broker.ids)


def test_a_rate_limited_publisher_commits_the_ledger_in_batches_not_per_token(make_service,
                                                                              experiment: dict) -> None:
    """At a limited rate the publisher waits for each token: it used to commit the ledger before every wait, a
    transaction per sample (the manager's main cost under the health controller). Rows are now committed every
    BATCH_SECONDS (or before a longer wait): at 30 samples/s, 90 samples take ~3 s and a handful of commits."""
    from sqlalchemy import event

    broker = MemoryBroker()
    service = make_service(broker)
    service.registry.register(experiment)
    commits: list[int] = []
    event.listen(service.engine, "commit", lambda _conn: commits.append(1))
    sid = service.start_session("win", rate=30.0).id
    service.set_rate(sid, 30.0)  # the start window lifted: the token bucket alone paces the publisher
    _wait(lambda: _row(service, sid).cursor == 90, "the cursor at the end")
    assert broker.ids == [s.id for s in iter_samples(service.registry.config("win"))]
    with service.db() as db:
        assert ledger.counts(db, sid)["published"] == 90  # every row committed, each once
    assert len(commits) < 90 / 4, len(commits)  # per token: ~90
    service.cancel(sid)
