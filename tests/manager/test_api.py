"""The manager's HTTP API over real HTTP: a uvicorn server in a thread, the embedded SQLite broker, no workers
(sessions publish at a low rate, so they stay running while the tests poke them)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi import FastAPI
from helpers import experiment_dict, promtool_check, write_dataset

from labswarm.client import ManagerClient
from labswarm.config.experiment import parse_experiment
from labswarm.errors import ManagerError
from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer
from labswarm.settings import Settings

#: Publish rate of the sessions here (tasks/s): 40 samples last ~8 s, longer than any test needs.
RATE = 5.0


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    return write_dataset(tmp_path / "data", n_per_label=10)  # 20 clips x 2 transformations = 40 samples


@pytest.fixture
def experiment(dataset: Path, tmp_path: Path) -> dict:
    return experiment_dict(dataset, tmp_path / "store", name="api")


def _serve_app(app: FastAPI) -> Iterator[httpx.Client]:
    server = EmbeddedServer(app).start()
    try:
        with httpx.Client(base_url=server.url, timeout=10.0) as http:
            yield http
    finally:
        server.stop()


def _serve(tmp_path: Path, **settings) -> Iterator[httpx.Client]:
    yield from _serve_app(create_app(Settings(home=tmp_path / "home", **settings)))


@pytest.fixture
def app(tmp_path: Path) -> FastAPI:
    """A fresh manager's app (``app.state.sessions``: its session service)."""
    return create_app(Settings(home=tmp_path / "home"))


@pytest.fixture
def http(app: FastAPI) -> Iterator[httpx.Client]:
    """An httpx client of the manager serving :func:`app`."""
    yield from _serve_app(app)


@pytest.fixture
def client(http: httpx.Client) -> Iterator[ManagerClient]:
    """The labswarm client of the same manager."""
    with ManagerClient(str(http.base_url)) as c:
        yield c


def _wait(predicate, what: str, timeout: float = 10.0) -> None:
    """Poll ``predicate`` until it holds; fail the test, naming ``what`` was awaited, after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.05)


def _parked(runner: Any) -> threading.Event:
    """An event set when the session's publisher thread blocks because it is paused: it calls ``wait_running``
    while its ``running`` event is clear, after committing what it had published (``_publish_phase``); from then
    on it publishes nothing until resumed."""
    parked, wait_running = threading.Event(), runner.wait_running

    def watched() -> bool:
        if not runner.running.is_set():
            parked.set()
        return wait_running()

    runner.wait_running = watched
    return parked


def test_post_experiment_as_yaml_and_as_json(http: httpx.Client, experiment: dict) -> None:
    response = http.post("/experiments", content=yaml.safe_dump(experiment),
                         headers={"Content-Type": "application/yaml"})
    assert response.status_code == 201, response.text
    body = response.json()
    expected = parse_experiment(experiment)
    assert body["name"] == "api" and body["queue"] == "labswarm.api"
    assert body["fingerprint"] == expected.fingerprint()

    as_json = dict(experiment, name="api-json")
    response = http.post("/experiments", content=json.dumps(as_json), headers={"Content-Type": "application/json"})
    assert response.status_code == 201, response.text
    assert response.json()["name"] == "api-json"

    assert [e["name"] for e in http.get("/experiments").json()] == ["api", "api-json"]
    one = http.get("/experiments/api").json()
    assert one["config"] == expected.model_dump(mode="json")
    assert http.get("/experiments/api/config").json() == expected.model_dump(mode="json")
    # posting the same configuration again is idempotent
    assert http.post("/experiments", json=experiment).status_code == 201
    assert len(http.get("/experiments").json()) == 2


def test_invalid_config_is_422_with_path_and_reason(http: httpx.Client, experiment: dict) -> None:
    bad = dict(experiment, transformations=[{"name": "pitch_shift", "semitones": "high"}])
    response = http.post("/experiments", json=bad)
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert [d["path"] for d in detail] == ["transformations.0.semitones"]
    assert "number" in detail[0]["reason"]

    response = http.post("/experiments", content="name: [unclosed", headers={"Content-Type": "application/yaml"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["path"] == "" and "YAML" in response.json()["detail"][0]["reason"]

    response = http.post("/experiments", content="{not json", headers={"Content-Type": "application/json"})
    assert response.status_code == 422 and "JSON" in response.json()["detail"][0]["reason"]
    assert http.get("/experiments").json() == []


def test_unknown_names_are_404(http: httpx.Client) -> None:
    assert http.get("/experiments/nope").status_code == 404
    assert http.get("/experiments/nope/config").status_code == 404
    assert http.post("/experiments/nope/sessions", json={}).status_code == 404
    assert http.get("/sessions/nope").status_code == 404
    assert http.get("/sessions/nope/failures").status_code == 404
    assert http.put("/sessions/nope/rate", json={"rate": 3}).status_code == 404
    assert http.post("/sessions/nope/pause").status_code == 404
    assert http.post("/sessions/nope/cancel").status_code == 404


def test_session_control(app: FastAPI, client: ManagerClient, experiment: dict) -> None:
    client.post_experiment(experiment)
    session = client.start_session("api", RATE)
    sid = session["id"]
    parked = _parked(app.state.sessions._runners[sid])  # its publisher thread (no public handle on it)
    assert session["status"] == "running" and session["total"] == 40 and session["rate"] == RATE

    # one active session per experiment
    with pytest.raises(ManagerError) as info:
        client.start_session("api", RATE)
    assert info.value.status == 409

    # live rate change
    assert client.set_rate(sid, 7.5)["rate"] == 7.5
    assert client.session(sid)["rate"] == 7.5
    with pytest.raises(ManagerError) as info:
        client.set_rate(sid, 0)
    assert info.value.status == 422

    # pause: publishing stops; resume: it goes on
    _wait(lambda: client.session(sid)["published"] > 0, "a first publish")
    assert client.pause(sid)["status"] == "paused"
    # a publish under way when the pause came, and its ledger commit, land before the publisher blocks
    assert parked.wait(10), "the publisher did not stop within 10 s of the pause"
    held = client.session(sid)["published"]
    time.sleep(1.0)  # the scenario: at 7.5/s, a publisher that went on would publish ~7 samples meanwhile
    paused = client.session(sid)
    assert paused["published"] == held and paused["status"] == "paused"
    assert client.resume(sid)["status"] == "running"
    _wait(lambda: client.session(sid)["published"] > held, "a publish after the resume")

    # cancel: final; the experiment may then start a new session
    cancelled = client.cancel(sid)
    assert cancelled["status"] == "cancelled" and cancelled["published"] < cancelled["total"]
    assert client.session(sid)["status"] == "cancelled"
    with pytest.raises(ManagerError) as info:
        client.pause(sid)
    assert info.value.status == 409
    second = client.start_session("api", RATE)
    assert second["id"] != sid and second["status"] == "running"
    assert {s["id"] for s in client.sessions()} == {sid, second["id"]}
    client.cancel(second["id"])


def test_api_token_guards_every_call(tmp_path: Path, experiment: dict) -> None:
    for http in _serve(tmp_path, api_token="t"):
        assert http.post("/experiments", json=experiment).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert http.post("/experiments", json=experiment, headers=wrong).status_code == 401
        good = {"Authorization": "Bearer t"}
        assert http.post("/experiments", json=experiment, headers=good).status_code == 201
        assert http.post("/experiments/api/sessions", json={"rate": RATE}).status_code == 401
        response = http.post("/experiments/api/sessions", json={"rate": RATE}, headers=good)
        assert response.status_code == 201
        sid = response.json()["id"]
        # reads need the token too (tests/manager/test_auth.py checks every route); /health does not
        for path in ("/experiments", "/experiments/api/config", f"/sessions/{sid}", "/settings", "/metrics"):
            assert http.get(path).status_code == 401, path
            assert http.get(path, headers=good).status_code == 200, path
        assert http.get("/health").json() == {"status": "ok"}
        calls = [("PUT", f"/sessions/{sid}/rate", {"rate": 2.0}), ("POST", f"/sessions/{sid}/pause", None),
                 ("POST", f"/sessions/{sid}/outcomes", {"outcomes": []}), ("POST", f"/sessions/{sid}/cancel", None)]
        for method, path, body in calls:
            assert http.request(method, path, json=body).status_code == 401, path
            assert http.request(method, path, json=body, headers=good).status_code == 200, path
        with ManagerClient(str(http.base_url), token="t") as client:
            assert client.session(sid)["status"] == "cancelled"


def test_openapi_docs_are_served(http: httpx.Client) -> None:
    docs = http.get("/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()
    schema = http.get("/openapi.json").json()
    assert schema["info"]["title"] == "labswarm manager"
    assert {"/experiments", "/sessions/{session_id}", "/sessions/{session_id}/rate"} <= set(schema["paths"])


def test_prometheus_metrics(http: httpx.Client, client: ManagerClient, experiment: dict) -> None:
    client.post_experiment(experiment)
    sid = client.start_session("api", RATE)["id"]
    _wait(lambda: client.session(sid)["pending"] > 0, "a sample published")
    client.set_rate(sid, 3.5)
    response = http.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    text = response.text
    labels = f'experiment="api",session="{sid}"'
    promtool_check(text)  # Prometheus' naming and typing conventions (issue 28)
    assert f"labswarm_session_samples{{{labels}}} 40.0" in text
    assert f"labswarm_session_publish_rate_tasks_per_second{{{labels}}} 3.5" in text
    assert f"labswarm_session_active{{{labels}}} 1.0" in text
    assert "# TYPE labswarm_session_outcomes_total counter" in text
    assert f'labswarm_session_outcomes_total{{experiment="api",outcome="done",session="{sid}"}}' in text
    assert "# TYPE labswarm_session_messages_published_total counter" in text
    pending = client.session(sid)["pending"]
    assert f"labswarm_session_pending_samples{{{labels}}}" in text and pending > 0
    assert 'labswarm_build_info{python_version="' in text and "process_resident_memory_bytes" in text
    assert 'labswarm_jobs{status="running"} 0.0' in text
    client.cancel(sid)
    text = http.get("/metrics").text
    assert f"labswarm_session_active{{{labels}}} 0.0" in text
    assert f"labswarm_session_publish_rate_tasks_per_second{{{labels}}} 0.0" in text  # ended: no rate in force


def test_bad_request_bodies_name_the_field_and_finished_sessions_keep_their_rate(
    http: httpx.Client, client: ManagerClient, experiment: dict
) -> None:
    client.post_experiment(experiment)
    sid = client.start_session("api", RATE)["id"]
    response = http.put(f"/sessions/{sid}/rate", json={"rate": 0})
    assert response.status_code == 422
    assert response.json()["detail"][0]["path"] == "rate" and "greater than" in response.json()["detail"][0]["reason"]
    client.cancel(sid)
    response = http.put(f"/sessions/{sid}/rate", json={"rate": 5})
    assert response.status_code == 409 and "cancelled" in response.json()["detail"]


def test_session_weight(http: httpx.Client, client: ManagerClient, experiment: dict) -> None:
    client.post_experiment(experiment)
    session = client.start_session("api", RATE, weight=3.0)
    sid = session["id"]
    assert session["weight"] == 3.0 and client.session(sid)["weight"] == 3.0
    assert client.set_weight(sid, 0.5)["weight"] == 0.5
    assert [s["weight"] for s in client.sessions()] == [0.5]
    response = http.put(f"/sessions/{sid}/weight", json={"weight": 0})
    assert response.status_code == 422 and response.json()["detail"][0]["path"] == "weight"
    client.cancel(sid)
    assert http.put(f"/sessions/{sid}/weight", json={"weight": 2}).status_code == 409
    # the default weight is 1; a weight <= 0 is refused at the start too
    assert http.post("/experiments/api/sessions", json={"rate": RATE, "weight": -1}).status_code == 422
    second = client.start_session("api", RATE)
    assert second["weight"] == 1.0
    client.cancel(second["id"])
