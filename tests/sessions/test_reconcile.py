"""The streaming reconciliation (labswarm/sessions/reconcile.py) on a real SQLite ledger and a real feature store:
what has no outcome is found in the store (``done``), failed once out of attempts, or published again; a pause
while republishing publishes nothing more until resume; a session with more pending samples than one walk
chunk. The broker is the in-memory recorder of the broker client's interface (it must show each publish)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from helpers import experiment_dict, write_dataset

from labswarm.config.experiment import ExperimentConfig
from labswarm.pipeline.features import FeaturesBlock
from labswarm.sample import Sample, iter_samples
from labswarm.sessions import ledger, reconcile
from labswarm.sessions.models import SampleRow, SessionRow
from labswarm.sessions.runner import SessionRunner
from labswarm.sessions.service import SessionService
from labswarm.settings import Settings

MAX_ATTEMPTS = 3


class RecordingBroker:
    """The broker client's interface in memory: every published sample id, in order; ``on_publish`` is called
    after each ``publish_many`` (a test pauses the session there)."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.calls = 0
        self.on_publish: Callable[[], None] | None = None

    def declare_queue(self, experiment: str) -> None:
        pass

    def publish_many(self, session_id: str, experiment: str, samples: Sequence[Sample],
                     stop: threading.Event) -> int:
        self.calls += 1
        self.ids.extend(s.id for s in samples)
        if self.on_publish is not None:
            self.on_publish()
        return len(samples)

    def queue_depth(self, experiment: str) -> int:
        return 0

    def purge_queue(self, experiment: str) -> None:
        pass


class WatchedEvent(threading.Event):
    """A runner's ``running`` event that says when a thread blocks on it (the runner holds for a pause)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocked = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        if not self.is_set():
            self.blocked.set()
        return super().wait(timeout)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[SessionService]:
    svc = SessionService(Settings(home=tmp_path / "home", max_attempts=MAX_ATTEMPTS, reconcile_after=3600),
                         broker=RecordingBroker())
    yield svc
    svc.stop()


def idle_runner(service: SessionService, experiment: dict, ledger_rows: Sequence[tuple[str, str]]
                ) -> SessionRunner:
    """A session of ``experiment`` whose ledger holds ``ledger_rows`` ``(sample_id, status)``, and its runner
    stopped before publishing (the test drives its reconciliation)."""
    service.registry.register(experiment)
    sid = service.start_session(experiment["name"], rate=1e6).id
    runner = service._runners[sid]
    runner.stop()
    runner.join(30)
    with service.db() as db:
        db.query(SampleRow).filter_by(session_id=sid).delete()
        db.commit()
        ledger.add_samples(db, sid, [(s, "published", None) for s, _ in ledger_rows])
        for status in ("done", "failed"):
            ledger.set_status(db, sid, [s for s, st in ledger_rows if st == status], status, "given")
        db.commit()
    service.broker.ids.clear()
    runner.stop_event.clear()
    runner.running = WatchedEvent()
    runner.running.set()
    runner.set_rate(1e6)
    return runner


def statuses(service: SessionService, sid: str) -> dict[str, tuple[str, int]]:
    with service.db() as db:
        return {r.sample_id: (r.status, r.attempts) for r in db.query(SampleRow).filter_by(session_id=sid)}


def trivial_experiment(root: Path, clips: int, name: str) -> dict:
    """``clips`` x 3 samples whose audio files do not exist (never in the store: each is republished)."""
    root.mkdir(parents=True)
    (root / "labels.csv").write_text("path,label\n" + "".join(f"c{i:05d}.wav,x\n" for i in range(clips)))
    return {"name": name, "dataset": {"root": str(root), "segment": {"start": 0.0, "duration": 0.05}},
            "transformations": [{"name": "gain", "gain_db": g} for g in (-3, 0, 3)],
            "features": [{"name": "stft", "n_fft": 256, "hop_length": 128}],
            "store": {"root": str(root.parent / "store")}}


def test_found_in_the_store_done_exhausted_failed_the_rest_published_again(service: SessionService,
                                                                          tmp_path: Path) -> None:
    experiment = experiment_dict(write_dataset(tmp_path / "data", n_per_label=3), tmp_path / "store", name="rec")
    samples = list(iter_samples(ExperimentConfig.model_validate(experiment)))  # 6 clips x 2: 12
    ids = [s.id for s in samples]
    runner = idle_runner(service, experiment, [(ids[k], "done" if k in (4, 5) else "published")
                                               for k in range(len(ids))])
    sid = runner.session_id
    block = FeaturesBlock(runner.config)
    for sample in samples[:2]:  # computed by a worker whose reports were lost: in the store
        assert block.process(sample).status == "computed"
    with service.db() as db:  # two delivered as often as allowed
        for _ in range(MAX_ATTEMPTS - 1):
            ledger.add_attempt(db, sid, ids[2:4])
        db.commit()

    assert reconcile.republish_missing(runner, block) is True

    assert service.broker.ids == ids[6:]  # the missing ones, in stream order, each once
    after = statuses(service, sid)
    assert [after[i] for i in ids[:2]] == [("done", 1)] * 2
    assert [after[i] for i in ids[2:4]] == [("failed", MAX_ATTEMPTS)] * 2
    assert [after[i] for i in ids[4:6]] == [("done", 1)] * 2
    assert [after[i] for i in ids[6:]] == [("published", 2)] * 6
    with service.db() as db:
        row = db.get(SessionRow, sid)
        assert (row.republished, row.pending, row.done, row.failed) == (6, 6, 4, 2)
        assert "no outcome after 3 deliveries" in db.get(SampleRow, (sid, ids[2])).reason


def test_a_pause_while_republishing_holds_until_resume(service: SessionService, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reconcile, "BATCH", 10)  # several publish batches for 60 missing samples
    experiment = trivial_experiment(tmp_path / "data", 20, "pause")
    ids = [s.id for s in iter_samples(ExperimentConfig.model_validate(experiment))]
    runner = idle_runner(service, experiment, [(i, "published") for i in ids])
    broker: RecordingBroker = service.broker
    broker.on_publish = lambda: service.pause(runner.session_id) if broker.calls == 2 else None
    walk = threading.Thread(target=reconcile.republish_missing, args=(runner, FeaturesBlock(runner.config)))
    walk.start()
    assert runner.running.blocked.wait(30), "the walk never held for the pause"
    assert broker.ids == ids[:20]  # two batches, then nothing while paused: the walk is blocked on the pause
    assert walk.is_alive()
    service.resume(runner.session_id)
    walk.join(30)
    assert not walk.is_alive()
    assert broker.ids == ids  # carried on from where it held: each sample once, in order
    assert {st for st in statuses(service, runner.session_id).values()} == {("published", 2)}


def test_more_pending_samples_than_one_chunk(service: SessionService, tmp_path: Path) -> None:
    clips = (ledger.CHUNK + 400) // 3 + 1  # > CHUNK samples, all pending but the first 30
    experiment = trivial_experiment(tmp_path / "data", clips, "big")
    ids = [s.id for s in iter_samples(ExperimentConfig.model_validate(experiment))]
    assert len(ids) - 30 > ledger.CHUNK
    runner = idle_runner(service, experiment, [(i, "done" if k < 30 else "published") for k, i in enumerate(ids)])
    assert reconcile.republish_missing(runner, FeaturesBlock(runner.config)) is True
    assert service.broker.ids == ids[30:]
    with service.db() as db:
        assert ledger.pending_among(db, runner.session_id, ids[30:]) == dict.fromkeys(ids[30:], 2)
        assert db.get(SessionRow, runner.session_id).republished == len(ids) - 30
