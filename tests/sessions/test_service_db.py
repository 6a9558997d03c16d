"""The session service's contract over real HTTP on both databases (SQLite and PostgreSQL, the
``database_url`` fixture): a manager (uvicorn in a thread, the embedded broker) with the test playing the workers'
part (their outcome reports and redeliveries), and a manager that restarts on a database holding a stored
configuration that no longer validates."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from helpers import experiment_dict

from labswarm.config.experiment import parse_experiment
from labswarm.db import make_engine, make_sessionmaker
from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer
from labswarm.sample import iter_samples
from labswarm.sessions.models import ExperimentRow
from labswarm.settings import Settings


@contextmanager
def _manager(tmp_path: Path, database_url: str) -> Iterator[httpx.Client]:
    settings = Settings(home=tmp_path / "home", database_url=database_url, data_roots=[tmp_path])
    server = EmbeddedServer(create_app(settings)).start()
    try:
        with httpx.Client(base_url=server.url, timeout=20.0) as http:
            yield http
    finally:
        server.stop()


def _wait(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _ok(response: httpx.Response, status: int = 200) -> dict:
    assert response.status_code == status, response.text
    return response.json()


def test_session_lifecycle(database_url: str, tone_dataset: Path, tmp_path: Path) -> None:
    """Register, start (a second start is 409), pause, resume, every sample published, outcomes of each kind,
    a redelivery of a done sample skipped, completion with the right counts and failures; then a second session
    cancelled, and no control of an ended session."""
    experiment = experiment_dict(tone_dataset, tmp_path / "store", name="db")
    ids = [s.id for s in iter_samples(parse_experiment(experiment))]  # 4 clips x 2 transformations
    with _manager(tmp_path, database_url) as http:
        assert _ok(http.post("/experiments", json=experiment), 201)["name"] == "db"
        assert [e["name"] for e in _ok(http.get("/experiments"))] == ["db"]

        session = _ok(http.post("/experiments/db/sessions", json={"rate": 50}), 201)
        sid = session["id"]
        assert (session["status"], session["total"]) == ("running", len(ids))
        assert http.post("/experiments/db/sessions", json={}).status_code == 409
        assert _ok(http.post(f"/sessions/{sid}/pause"))["status"] == "paused"
        assert _ok(http.post(f"/sessions/{sid}/resume"))["status"] == "running"
        assert _ok(http.put(f"/sessions/{sid}/rate", json={"rate": 80}))["rate"] == 80
        _wait(lambda: _ok(http.get(f"/sessions/{sid}"))["published"] == len(ids))

        outcomes = [{"sample_id": i, "status": "computed", "seconds": 0.01} for i in ids[:-2]]
        outcomes += [{"sample_id": ids[-2], "status": "failed", "reason": "AudioError: unreadable"},
                     {"sample_id": ids[-1], "status": "cached"}]
        assert _ok(http.post(f"/sessions/{sid}/outcomes", json={"outcomes": outcomes}))["applied"] == len(ids)
        # a redelivered message of a done sample is not run again
        assert _ok(http.post(f"/sessions/{sid}/redeliveries", json={"sample_id": ids[0]}))["run"] is False
        _wait(lambda: _ok(http.get(f"/sessions/{sid}"))["status"] == "completed")
        done = _ok(http.get(f"/sessions/{sid}"))
        assert (done["done"], done["failed"], done["cached"], done["pending"]) == (len(ids) - 2, 1, 1, 0)
        assert _ok(http.get(f"/sessions/{sid}/failures")) == [
            {"sample_id": ids[-2], "reason": "AudioError: unreadable", "attempts": 1}]
        assert http.post(f"/sessions/{sid}/pause").status_code == 409

        second = _ok(http.post("/experiments/db/sessions", json={"rate": 0.5}), 201)["id"]
        assert _ok(http.post(f"/sessions/{second}/cancel"))["status"] == "cancelled"
        assert http.post(f"/sessions/{second}/resume").status_code == 409
        assert {s["id"]: s["status"] for s in _ok(http.get("/sessions"))} == {sid: "completed", second: "cancelled"}
        assert http.post("/sessions/nope/outcomes", json={"outcomes": []}).status_code == 404


def test_a_stored_configuration_that_no_longer_validates_fails_only_its_sessions(
        database_url: str, tone_dataset: Path, tmp_path: Path) -> None:
    """A manager restarts on a database where one experiment's stored configuration no longer validates (a
    feature the code no longer has): it starts, that experiment's session is failed with the reason, the other
    session resumes, both experiments are still listed, and registering the experiment again makes it usable."""
    good = experiment_dict(tone_dataset, tmp_path / "store", name="good")
    bad = experiment_dict(tone_dataset, tmp_path / "store", name="bad")
    with _manager(tmp_path, database_url) as http:
        sessions = {}
        for experiment in (good, bad):
            _ok(http.post("/experiments", json=experiment), 201)
            sessions[experiment["name"]] = _ok(http.post(f"/experiments/{experiment['name']}/sessions",
                                                         json={"rate": 0.5}), 201)["id"]

    engine = make_engine(database_url)
    try:
        with make_sessionmaker(engine)() as db:
            row = db.get(ExperimentRow, "bad")
            row.config = {**row.config, "features": [{"name": "retired_feature"}]}
            db.commit()
    finally:
        engine.dispose()

    with _manager(tmp_path, database_url) as http:
        failed = _ok(http.get(f"/sessions/{sessions['bad']}"))
        assert failed["status"] == "failed" and failed["finished_at"] is not None
        assert "stored configuration of experiment 'bad' no longer validates" in failed["error"]
        assert "features.0" in failed["error"]
        resumed = _ok(http.get(f"/sessions/{sessions['good']}"))
        assert resumed["status"] == "running" and resumed["phase"] is not None
        assert [e["name"] for e in _ok(http.get("/experiments"))] == ["bad", "good"]
        refused = http.post("/experiments/bad/sessions", json={"rate": 0.5})
        assert refused.status_code == 422 and refused.json()["detail"][0]["path"].startswith("features.0")

        _ok(http.post("/experiments", json=bad), 201)
        again = _ok(http.post("/experiments/bad/sessions", json={"rate": 0.5}), 201)
        assert again["status"] == "running"
        for sid in (sessions["good"], again["id"]):
            _ok(http.post(f"/sessions/{sid}/cancel"))

