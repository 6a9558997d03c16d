"""The swarm launcher without an engine: its service specification as data, what it asks a (fake) docker client
for, the docker SDK's real errors translated into DeployError, and the manager's hooks over real HTTP.

Only the docker client is faked (there is no Docker engine here or in CI); the SDK's types and error classes are
the real ones, so ``to_docker()`` goes through the SDK's own validation and serialization.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker.errors
import docker.models.services
import httpx
import pytest
import requests
from deploy_tools import FakeClient, FakeEngine, FakeServices
from helpers import experiment_dict, write_dataset

from labswarm.deploy import sessions
from labswarm.deploy.platforms import SwarmPlatform
from labswarm.deploy.swarm import (
    LABEL_MANAGED,
    LABEL_SESSION,
    MAX_NAME,
    ServiceSpec,
    SwarmLauncher,
    service_name,
    service_spec,
)
from labswarm.errors import DeployError
from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer
from labswarm.settings import Settings

SWARM_NAME = "labswarm-tones"


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


def _settings(**overrides: Any) -> Settings:
    return Settings(home=Path("/nonexistent"), **overrides)


# the service specification, as data
def test_service_name_is_the_experiment_and_always_a_valid_distinct_service_name() -> None:
    assert service_name("music_speech_noise") == "labswarm-music_speech_noise"
    names = [service_name(n) for n in ("a.b", "a-b", "a_b", "x_", "x-", "m" * 80, "m" * 81, "A")]
    assert len(set(names)) == len(names)
    for name in names:
        assert len(name) <= MAX_NAME
        assert name[0].isalnum() and name[-1].isalnum()
        assert set(name) <= set("abcdefghijklmnopqrstuvwxyz0123456789-_")
    assert service_name("a-b") == "labswarm-a-b"  # a valid name is kept as it is, without a hash


def test_service_spec_carries_what_the_issue_asks_for() -> None:
    settings = _settings(swarm_image="registry:5000/labswarm:0.1", swarm_network="labnet",
                         swarm_manager_url="http://manager:8000", swarm_concurrency=2, api_token="s3cret",
                         swarm_constraints=["node.labels.labswarm==worker"], swarm_stop_grace=45)
    spec = service_spec("tones", "sess1", settings, replicas=3)
    assert spec.name == SWARM_NAME
    assert spec.image == "registry:5000/labswarm:0.1"
    assert spec.command == ("labswarm", "worker", "--experiment", "tones", "--manager", "http://manager:8000",
                            "--concurrency", "2")
    assert spec.network == "labnet"
    assert spec.replicas == 3
    assert [(m.source, m.target, m.type) for m in spec.mounts] == [("labswarm-data", "/data", "volume")]
    # the token is a docker secret, never in Env (tests/deploy/test_swarm_secrets.py)
    assert spec.env["LABSWARM_API_TOKEN_FILE"] == "/run/secrets/labswarm_api_token"
    assert spec.env["OMP_NUM_THREADS"] == "1" and "s3cret" not in repr(spec)
    assert spec.restart.condition == "on-failure"
    assert spec.labels == {LABEL_MANAGED: "true", "labswarm.experiment": "tones", LABEL_SESSION: "sess1"}
    assert spec.constraints == ("node.labels.labswarm==worker",)
    assert spec.stop_grace_s == 45
    with pytest.raises(ValueError, match="workers must be >= 0"):
        spec.with_replicas(-1)


def test_broker_override_and_no_token() -> None:
    spec = service_spec("tones", "s", _settings(swarm_broker_url="amqp://u:p@rabbitmq:5672//"))
    assert "--broker" not in spec.command  # a docker secret: its password is never in the spec
    assert [s.variable for s in spec.secrets] == ["LABSWARM_BROKER_URL"]
    assert "LABSWARM_API_TOKEN_FILE" not in spec.env and "LABSWARM_API_TOKEN" not in spec.env


def test_data_mount_volume_nfs_and_bind() -> None:
    nfs = service_spec("tones", "s", _settings(swarm_data_nfs="10.0.0.5:/exports/labswarm")).mounts[0]
    assert nfs.type == "volume" and nfs.source == "labswarm-data"
    assert nfs.driver_options == {"type": "nfs", "o": "addr=10.0.0.5,rw,nfsvers=4", "device": ":/exports/labswarm"}
    bind = service_spec("tones", "s", _settings(swarm_data_volume="/mnt/labswarm")).mounts[0]
    assert (bind.type, bind.source, bind.target) == ("bind", "/mnt/labswarm", "/data")
    with pytest.raises(ValueError, match="HOST:/export/path"):
        service_spec("tones", "s", _settings(swarm_data_nfs="no-export-path"))


def test_to_docker_is_what_the_sdk_sends_to_the_engine() -> None:
    spec = service_spec("tones", "sess1", _settings(swarm_data_nfs="nfs:/x"), replicas=2)
    kwargs = spec.to_docker()
    # the SDK's own conversion into the engine's service spec (what POST /services/create would carry)
    create = docker.models.services._get_create_service_kwargs("create", dict(kwargs))
    template = create["task_template"]
    container = template["ContainerSpec"]
    assert create["name"] == SWARM_NAME
    assert create["mode"] == {"replicated": {"Replicas": 2}}
    assert create["labels"][LABEL_SESSION] == "sess1"
    assert container["Image"] == "labswarm:latest"
    assert container["Command"] == list(spec.command)
    assert "OMP_NUM_THREADS=1" in container["Env"]
    assert container["Mounts"][0]["VolumeOptions"]["DriverConfig"]["Options"]["type"] == "nfs"
    assert container["StopGracePeriod"] == 60 * 10**9
    assert container["Init"] is True
    assert template["RestartPolicy"]["Condition"] == "on-failure"
    assert template["Networks"] == [{"Target": "labswarm"}]


# the launcher against a fake client
def _launcher(engine: FakeEngine, session: str = "sess1") -> SwarmLauncher:
    return SwarmLauncher(service_spec("tones", session, _settings()), client=FakeClient(engine))


def test_start_scale_stop(engine: FakeEngine) -> None:
    launcher = _launcher(engine)
    launcher.start(3)
    service = engine.services[SWARM_NAME]
    assert service.replicas == 3 and service.kwargs["networks"] == ["labswarm"]
    assert launcher.workers == 3
    launcher.scale(5)
    service.running = 4
    assert service.replicas == 5 and launcher.workers == 4
    launcher.stop()
    assert SWARM_NAME not in engine.services and launcher.workers == 0
    launcher.stop()  # already gone: nothing to do
    assert engine.calls == [("create", SWARM_NAME), ("scale", SWARM_NAME, 5), ("remove", SWARM_NAME)]


def test_start_replaces_a_stale_service_and_adopts_its_own(engine: FakeEngine) -> None:
    _launcher(engine, "old").start(2)
    _launcher(engine, "new").start(1)  # a service left by an earlier session of the experiment: replaced
    assert engine.services[SWARM_NAME].attrs["Spec"]["Labels"][LABEL_SESSION] == "new"
    _launcher(engine, "new").start(4)  # this session's own (a restarted manager): scaled, not recreated
    assert engine.services[SWARM_NAME].replicas == 4
    assert [c[0] for c in engine.calls] == ["create", "remove", "create", "scale"]


def test_foreign_services_are_never_touched(engine: FakeEngine) -> None:
    FakeServices(engine).create("nginx", name=SWARM_NAME, mode={"replicated": {"Replicas": 1}}, labels={})
    with pytest.raises(DeployError, match="not created by labswarm"):
        _launcher(engine).start(1)
    _launcher(engine).stop()  # not its session: left alone
    with pytest.raises(DeployError, match="does not exist"):
        _launcher(engine).scale(2)
    assert SWARM_NAME in engine.services


@pytest.mark.parametrize(("operation", "error", "message"), [
    ("create", docker.errors.APIError("500 Server Error", explanation="network labswarm not found"),
     "refused to create service labswarm-tones: network labswarm not found"),
    ("get", docker.errors.APIError("503", explanation="This node is not a swarm manager."),
     "not a swarm manager"),
    ("get", requests.exceptions.ConnectionError("Connection refused"), "cannot reach the Docker engine"),
    ("get", docker.errors.DockerException("Error while fetching server API version"), "cannot create service"),
])
def test_engine_errors_become_deploy_errors(engine: FakeEngine, operation: str, error: Exception,
                                            message: str) -> None:
    engine.errors[operation] = error
    with pytest.raises(DeployError, match=message) as info:
        _launcher(engine).start(2)
    assert info.value.__cause__ is error


def test_scale_and_remove_errors(engine: FakeEngine) -> None:
    launcher = _launcher(engine)
    launcher.start(1)
    engine.errors["scale"] = docker.errors.APIError("409", explanation="update out of sequence")
    with pytest.raises(DeployError, match="scale service labswarm-tones to 3: update out of sequence"):
        launcher.scale(3)
    engine.errors["remove"] = docker.errors.APIError("500", explanation="rpc error")
    with pytest.raises(DeployError, match="remove service labswarm-tones: rpc error"):
        launcher.stop()


def test_missing_sdk_gives_the_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "docker", None)  # `import docker` now raises ImportError
    monkeypatch.setitem(sys.modules, "docker.errors", None)
    with pytest.raises(DeployError, match=r"pip install 'labswarm\[swarm\]'"):
        SwarmLauncher(service_spec("tones", "s", _settings())).start(1)


def test_unknown_launcher_names_the_known_ones() -> None:
    from labswarm.errors import ConfigError

    with pytest.raises(ConfigError, match="known: none, local, swarm"):
        sessions.session_launcher("kubernetes", "tones", "s", _settings())
    assert sessions.session_launcher("none", "tones", "s", _settings()) is None
    assert isinstance(sessions.session_launcher("swarm", "tones", "s", _settings()), SwarmLauncher)


# the manager's hooks, over real HTTP (embedded manager and broker), the docker client faked
@pytest.fixture
def manager_http(tmp_path: Path, engine: FakeEngine, monkeypatch: pytest.MonkeyPatch) -> Iterator[httpx.Client]:
    def factory(experiment: str, session_id: str, settings: Settings) -> SwarmLauncher:
        return SwarmLauncher(service_spec(experiment, session_id, settings), client=FakeClient(engine))

    monkeypatch.setattr(SwarmPlatform, "workers", classmethod(lambda _cls, *args: factory(*args)))
    dataset = write_dataset(tmp_path / "data", n_per_label=10)
    server = EmbeddedServer(create_app(Settings(home=tmp_path / "home"))).start()
    try:
        with httpx.Client(base_url=server.url, timeout=10.0) as http:
            assert http.post("/experiments", json=experiment_dict(dataset, tmp_path / "store")).status_code == 201
            yield http
    finally:
        server.stop()


def test_session_with_swarm_launcher_creates_scales_and_removes_the_service(manager_http: httpx.Client,
                                                                            engine: FakeEngine) -> None:
    body = manager_http.post("/experiments/tones/sessions", json={"rate": 1, "launcher": "swarm", "workers": 2})
    assert body.status_code == 201, body.text
    session = body.json()
    assert session["launcher"] == "swarm"
    service = engine.services[SWARM_NAME]
    assert service.replicas == 2 and service.attrs["Spec"]["Labels"][LABEL_SESSION] == session["id"]

    response = manager_http.put(f"/sessions/{session['id']}/workers", json={"workers": 5})
    assert response.status_code == 200, response.text
    assert response.json()["workers"] == 5 and service.replicas == 5
    assert manager_http.put(f"/sessions/{session['id']}/workers", json={"workers": -1}).status_code == 422

    assert manager_http.post(f"/sessions/{session['id']}/cancel").status_code == 200
    assert SWARM_NAME not in engine.services
    assert manager_http.put(f"/sessions/{session['id']}/workers", json={"workers": 1}).status_code == 409


def test_session_end_removes_the_service(manager_http: httpx.Client, engine: FakeEngine) -> None:
    session = manager_http.post("/experiments/tones/sessions",
                                json={"rate": 1000, "launcher": "swarm", "workers": 1}).json()
    assert SWARM_NAME in engine.services
    _complete_session(manager_http, session["id"])  # no real workers: every sample reported done, as they would
    deadline = time.monotonic() + 20
    while SWARM_NAME in engine.services:
        assert time.monotonic() < deadline, "the service of a completed session was not removed"
        time.sleep(0.05)


def _complete_session(http: httpx.Client, session_id: str, timeout: float = 20.0) -> None:
    """Report every sample of a session done, as workers would, and wait until it is completed."""
    from labswarm.config.experiment import parse_experiment
    from labswarm.sample import iter_samples

    deadline = time.monotonic() + timeout
    # no controller runs here: a rate set by hand lifts the session's start window, so it publishes everything
    assert http.put(f"/sessions/{session_id}/rate", json={"rate": 1000}).status_code in (200, 409)
    progress = http.get(f"/sessions/{session_id}").json()
    while progress["published"] + progress["cached"] < progress["total"]:
        assert time.monotonic() < deadline, progress
        time.sleep(0.05)
        progress = http.get(f"/sessions/{session_id}").json()
    config = parse_experiment(http.get("/experiments/tones/config").json())
    outcomes = [{"sample_id": s.id, "status": "done"} for s in iter_samples(config)]
    assert http.post(f"/sessions/{session_id}/outcomes", json={"outcomes": outcomes}).status_code == 200
    while http.get(f"/sessions/{session_id}").json()["status"] != "completed":
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_session_that_ends_while_its_service_starts_has_it_removed(tmp_path: Path, engine: FakeEngine,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def factory(experiment: str, session_id: str, settings: Settings) -> SwarmLauncher:
        return SwarmLauncher(service_spec(experiment, session_id, settings), client=FakeClient(engine))

    monkeypatch.setattr(SwarmPlatform, "workers", classmethod(lambda _cls, *args: factory(*args)))
    dataset = write_dataset(tmp_path / "data", n_per_label=10)
    app = create_app(Settings(home=tmp_path / "home"))
    with EmbeddedServer(app) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.post("/experiments", json=experiment_dict(dataset, tmp_path / "store")).status_code == 201

        def session_ends_meanwhile(kwargs: dict[str, Any]) -> None:
            # the Docker round trip is slow; the session completes (its runner finishes) before it returns
            with httpx.Client(base_url=server.url, timeout=10) as other:
                _complete_session(other, kwargs["labels"][LABEL_SESSION])

        engine.on_create = session_ends_meanwhile
        response = http.post("/experiments/tones/sessions", json={"rate": 1000, "launcher": "swarm", "workers": 2})
        assert response.status_code == 201, response.text
        assert response.json()["status"] == "completed"
        assert SWARM_NAME not in engine.services, "the service of a session that ended during its start was kept"
        assert [c[0] for c in engine.calls] == ["create", "remove"]

        # a session that ended before its launcher starts: nothing to run, no error, nothing created
        app.state.sessions.launchers.launch(response.json()["id"], "swarm", 2)
        assert [c[0] for c in engine.calls] == ["create", "remove"]


def test_engine_refusal_fails_the_session_with_the_reason(manager_http: httpx.Client, engine: FakeEngine) -> None:
    engine.errors["create"] = docker.errors.APIError("500", explanation="network labswarm not found")
    response = manager_http.post("/experiments/tones/sessions", json={"rate": 1, "launcher": "swarm", "workers": 2})
    assert response.status_code == 502
    assert "network labswarm not found" in response.json()["detail"]
    session = manager_http.get("/sessions").json()[0]
    assert session["status"] == "failed" and "network labswarm not found" in session["error"]
    # the experiment is free for a new session
    engine.errors.clear()
    assert manager_http.post("/experiments/tones/sessions", json={"rate": 1}).status_code == 201


def test_workers_of_a_session_without_launcher_are_not_the_managers(manager_http: httpx.Client,
                                                                    engine: FakeEngine) -> None:
    session = manager_http.post("/experiments/tones/sessions", json={"rate": 1}).json()
    assert session["launcher"] == "none"
    response = manager_http.put(f"/sessions/{session['id']}/workers", json={"workers": 2})
    assert response.status_code == 409 and "no launcher" in response.json()["detail"]
    assert engine.calls == []


def test_restarted_manager_finds_its_swarm_sessions(tmp_path: Path, engine: FakeEngine,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    def factory(experiment: str, session_id: str, settings: Settings) -> SwarmLauncher:
        return SwarmLauncher(service_spec(experiment, session_id, settings), client=FakeClient(engine))

    monkeypatch.setattr(SwarmPlatform, "workers", classmethod(lambda _cls, *args: factory(*args)))
    dataset = write_dataset(tmp_path / "data", n_per_label=10)
    settings = Settings(home=tmp_path / "home")
    with EmbeddedServer(create_app(settings)) as server, httpx.Client(base_url=server.url, timeout=10) as http:
        http.post("/experiments", json=experiment_dict(dataset, tmp_path / "store"))
        session = http.post("/experiments/tones/sessions", json={"rate": 1, "launcher": "swarm", "workers": 2}).json()
    assert engine.services[SWARM_NAME].replicas == 2  # a manager stop leaves the workers running
    with EmbeddedServer(create_app(settings)) as server, httpx.Client(base_url=server.url, timeout=10) as http:
        assert http.put(f"/sessions/{session['id']}/workers", json={"workers": 3}).status_code == 200
        assert engine.services[SWARM_NAME].replicas == 3
        assert http.post(f"/sessions/{session['id']}/cancel").status_code == 200
    assert SWARM_NAME not in engine.services


def test_spec_is_frozen_data() -> None:
    spec = ServiceSpec(name="n", image="i", command=("c",), network="net", replicas=1)
    with pytest.raises(AttributeError):
        spec.replicas = 2  # type: ignore[misc]


def test_client_starts_and_scales_a_swarm_session(manager_http: httpx.Client, engine: FakeEngine) -> None:
    from labswarm.client import ManagerClient
    from labswarm.errors import ManagerError

    with ManagerClient(str(manager_http.base_url)) as client:
        session = client.start_session("tones", 1.0, launcher="swarm", workers=2)
        assert session["launcher"] == "swarm" and engine.services[SWARM_NAME].replicas == 2
        assert client.set_workers(session["id"], 3)["workers"] == 3
        assert engine.services[SWARM_NAME].replicas == 3
        client.cancel(session["id"])
        with pytest.raises(ManagerError, match="409"):
            client.set_workers(session["id"], 1)


def test_two_overview_refreshes_within_the_ttl_ask_the_engine_once(manager_http: httpx.Client, engine: FakeEngine,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The dashboard's overview asks every session's workers every 2 s: the swarm launcher keeps its count for
    WORKERS_TTL seconds (set long here: "within the TTL" whatever the machine's load), and forgets it on a scale."""
    from deploy_tools import FakeService

    from labswarm.deploy import swarm

    listed: list[str] = []
    tasks = FakeService.tasks

    def counted(self: FakeService, filters: dict | None = None) -> list[dict]:
        listed.append(self.name)
        return tasks(self, filters)

    monkeypatch.setattr(FakeService, "tasks", counted)
    monkeypatch.setattr(swarm, "WORKERS_TTL", 600.0)
    session = manager_http.post("/experiments/tones/sessions", json={"rate": 1, "launcher": "swarm", "workers": 2})
    assert session.status_code == 201, session.text
    for _ in range(2):
        page = manager_http.get("/ui/partials/overview")
        assert page.status_code == 200 and SWARM_NAME.removeprefix("labswarm-") in page.text, page.text[:300]
    assert listed == [SWARM_NAME]  # one engine call for two refreshes
    assert manager_http.put(f"/sessions/{session.json()['id']}/workers", json={"workers": 3}).status_code == 200
    assert manager_http.get("/ui/partials/overview").status_code == 200
    assert listed == [SWARM_NAME] * 2  # a scale forgets the count
    monkeypatch.setattr(swarm, "WORKERS_TTL", 0.0)
    assert manager_http.get("/ui/partials/overview").status_code == 200
    assert listed == [SWARM_NAME] * 3  # past the TTL: asked again
