"""Learners as docker swarm services without an engine: the service spec as data and through the docker SDK's own
conversion, start/poll/kill against a fake engine (the SDK's real types and errors), adoption after a manager
restart, foreign services left alone, and a job driven through the real job service over real HTTP with the fake
engine standing in for the Docker engine (the test plays the learner: it reports with the token it finds in the
service's docker secret, and flips the service's task state)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker.errors
import pytest
import requests
from deploy.deploy_tools import FakeClient, FakeEngine, FakeService

from jobs.manager import Manager, manager, read_events, statuses, wait_until
from jobs.tiny import tiny_manifest
from labswarm.deploy.learners import LearnerLaunch, LearnerStatus
from labswarm.deploy.platforms import SwarmPlatform
from labswarm.deploy.swarm_learners import (
    GPU_RESOURCE,
    LABEL_JOB,
    SPEC_TARGET,
    SwarmLearners,
    learner_service_name,
)
from labswarm.deploy.swarm_secrets import LABEL_MANAGED
from labswarm.errors import DeployError
from labswarm.jobs.records.models import LearnerRow
from labswarm.jobs.spec.errors import classify_exit
from labswarm.settings import Settings

TOKEN = "attempt-token-do-not-print"
AWS_SECRET = "aws-secret-do-not-print"


def _settings(**overrides: Any) -> Settings:
    return Settings(home=Path("/nonexistent"), swarm_image="registry:5000/labswarm:0.2",
                    swarm_manager_url="http://manager:8000", swarm_constraints=["node.labels.gpu==yes"], **overrides)


def _launch(tmp_path: Path, job: str = "abc123def456", attempt: int = 1, rank: int = 0,
            **resources: Any) -> LearnerLaunch:
    spec = {"job_id": job, "attempt": attempt, "rank": rank, "world_size": 1, "manifest": {"name": "tiny"},
            "manager_url": "http://127.0.0.1:1234", "results_store": {"name": "s3", "bucket": "b"},
            "checkpoint": None, "workdir": str(tmp_path / "work")}
    return LearnerLaunch(job, attempt, rank, spec, tmp_path / f"learner-{rank}.json", tmp_path / "out", TOKEN,
                         resources=resources or {"cpus": 2.0, "gpus": 1, "memory_mb": 4096})


def _row(job: str, attempt: int, rank: int, service_id: str | None) -> LearnerRow:
    return LearnerRow(job_id=job, attempt=attempt, rank=rank, host="h", workdir="/w", service_id=service_id)


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def swarm(engine: FakeEngine) -> SwarmLearners:
    return SwarmLearners(_settings(), client=FakeClient(engine))


def test_the_service_carries_what_a_learner_needs_and_no_secret(tmp_path: Path, swarm: SwarmLearners,
                                                                engine: FakeEngine,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
    monkeypatch.setenv("LABSWARM_BROKER_URL", "amqp://u:manager-password@rabbit//")
    handle = swarm.start(_launch(tmp_path))
    name = learner_service_name("abc123def456", 1, 0)
    service = engine.services[name]
    assert handle.service_id == service.id and handle.pid is None
    [create] = engine.created  # what POST /services/create would carry, converted by the SDK itself
    template, container = create["task_template"], create["task_template"]["ContainerSpec"]
    assert create["mode"] == {"replicated": {"Replicas": 1}}
    assert create["labels"] == {LABEL_MANAGED: "true", LABEL_JOB: "abc123def456", "labswarm.attempt": "1",
                                "labswarm.rank": "0"}
    assert container["Image"] == "registry:5000/labswarm:0.2"
    assert template["RestartPolicy"]["Condition"] == "none"  # the lifecycle's restart policy decides
    assert [(m["Source"], m["Target"]) for m in container["Mounts"]] == [("labswarm-data", "/data")]
    assert template["Placement"]["Constraints"] == ["node.labels.gpu==yes"]
    resources = template["Resources"]
    assert resources["Limits"] == {"NanoCPUs": 2 * 10**9, "MemoryBytes": 4096 * 2**20}
    assert resources["Reservations"]["GenericResources"] == [
        {"DiscreteResourceSpec": {"Kind": GPU_RESOURCE, "Value": 1}}]
    assert container["Command"][-1] == SPEC_TARGET and container["Command"][0] == "sh"
    assert [c["File"]["Name"] for c in container["Configs"]] == [SPEC_TARGET]
    # no secret anywhere in the service's spec: env, command line, labels
    visible = json.dumps(create)
    assert TOKEN not in visible and AWS_SECRET not in visible and "manager-password" not in visible
    secret = engine.secrets.items[f"{name}-env"].data.decode()
    assert f"LABSWARM_API_TOKEN={TOKEN}\n" in secret and f"AWS_SECRET_ACCESS_KEY={AWS_SECRET}\n" in secret
    assert "manager-password" not in secret  # the manager's own LABSWARM_* settings never reach a learner
    spec = json.loads(engine.configs.items[f"{name}-spec"].data)
    assert spec["manager_url"] == "http://manager:8000" and spec["workdir"].startswith("/tmp/")
    assert TOKEN not in json.dumps(spec)
    assert json.loads((tmp_path / "learner-0.json").read_text()) == spec  # the manager's copy, for a post-mortem


def test_a_learners_chunk_record_is_on_the_shared_volume_where_the_manager_finds_it(tmp_path: Path,
                                                                                   engine: FakeEngine) -> None:
    """Not in the container (it goes with it when killed): a replacement appends to it, the manager stores it."""
    host = tmp_path / "shared"
    swarm = SwarmLearners(_settings(swarm_data_volume=str(host), swarm_data_target="/data"), client=FakeClient(engine))
    swarm.start(_launch(tmp_path, rank=1))
    spec = json.loads(engine.configs.items[f"{learner_service_name('abc123def456', 1, 1)}-spec"].data)
    assert spec["chunk_log"] == "/data/.labswarm-jobs/abc123def456/chunks/attempt-1/rank-1.jsonl"
    assert spec["workdir"].startswith("/tmp/")  # the rest of its working folder stays the container's
    found = swarm.chunk_record(_row("abc123def456", 1, 1, None))  # the bind mount's host folder
    assert found == host / ".labswarm-jobs" / "abc123def456" / "chunks" / "attempt-1" / "rank-1.jsonl"
    found.parent.mkdir(parents=True)
    found.write_text("{}\n")
    swarm.collect("abc123def456")  # the job ended: its records were stored
    assert not (host / ".labswarm-jobs" / "abc123def456" / "chunks").exists() and host.is_dir()
    named = SwarmLearners(_settings(swarm_data_target="/data"), client=FakeClient(engine))  # a named volume
    assert named.chunk_record(_row("j", 2, 0, None)) == Path("/data/.labswarm-jobs/j/chunks/attempt-2/rank-0.jsonl")


@pytest.mark.parametrize(("state", "exit_code", "expected", "verdict"), [
    ("pending", None, LearnerStatus(True), None),
    ("preparing", None, LearnerStatus(True), None),
    ("running", None, LearnerStatus(True), None),
    ("complete", 0, LearnerStatus(False, 0), None),
    ("failed", 3, LearnerStatus(False, 3, reason="its task is failed: task: non-zero exit (3)"), "C101"),
    ("failed", 1, LearnerStatus(False, 1, reason="its task is failed: task: non-zero exit (1)"), "S101"),
    ("failed", 137, LearnerStatus(False, 137, reason="its task is failed: task: non-zero exit (137)"), "S102"),
    ("rejected", None, LearnerStatus(False, None, deploy_failed=True, reason="its task is rejected: no such image"),
     "S105"),
    ("orphaned", None, LearnerStatus(False, None, reason="its task is orphaned: node down"), "S104"),
])
def test_each_task_state_is_a_learner_status(tmp_path: Path, swarm: SwarmLearners, engine: FakeEngine, state: str,
                                             exit_code: int | None, expected: LearnerStatus,
                                             verdict: str | None) -> None:
    sid = swarm.start(_launch(tmp_path)).service_id
    service = next(iter(engine.services.values()))
    assert swarm.poll(_row("abc123def456", 1, 0, sid)) == LearnerStatus(True)  # no task yet: being created
    err = {"rejected": "no such image", "orphaned": "node down"}.get(state) or (
        f"task: non-zero exit ({exit_code})" if state == "failed" else None)
    service.set_task(state, exit_code, err)
    status = swarm.poll(_row("abc123def456", 1, 0, sid))
    assert status == expected
    if not status.alive:  # what the lifecycle makes of it (outcomes._verdict)
        found = ("S105" if status.deploy_failed else
                 getattr(classify_exit(status.exit_code, killed_by_platform=False, user_exit_codes=[3]), "code",
                         None))
        assert found == verdict


def test_kill_removes_the_service_its_secret_and_config_and_terminate_does_nothing(
        tmp_path: Path, swarm: SwarmLearners, engine: FakeEngine) -> None:
    row = _row("abc123def456", 1, 0, swarm.start(_launch(tmp_path)).service_id)
    swarm.terminate(row)  # a halt is the manager's answer to the learner's report
    assert len(engine.services) == len(engine.secrets.items) == len(engine.configs.items) == 1
    swarm.kill(row)
    assert engine.services == {} and engine.secrets.items == {} and engine.configs.items == {}
    status = swarm.poll(row)
    assert not status.alive and status.exit_code is None and "no longer exists" in (status.reason or "")
    swarm.kill(row)  # already gone: nothing to do, no error


def test_a_restarted_manager_adopts_its_learners_removes_its_strays_and_leaves_foreign_services(
        tmp_path: Path, engine: FakeEngine) -> None:
    first = SwarmLearners(_settings(), client=FakeClient(engine))
    live = first.start(_launch(tmp_path, job="ours00000001")).service_id
    first.start(_launch(tmp_path, job="ours00000001", rank=1))  # started, never recorded (the manager died)
    first.start(_launch(tmp_path, job="other0000001"))  # another manager's job (not in our database)
    foreign = engine.services_api.create("nginx", name="web", mode={"replicated": {"Replicas": 1}},
                                         labels={LABEL_JOB: "ours00000001"})  # not labswarm.managed
    restarted = SwarmLearners(_settings(), client=FakeClient(engine))
    restarted.sweep({live}, lambda job: job == "ours00000001")
    assert sorted(engine.services) == sorted([learner_service_name("ours00000001", 1, 0),
                                              learner_service_name("other0000001", 1, 0), "web"])
    assert foreign.name in engine.services
    assert sorted(engine.secrets.items) == sorted([learner_service_name("ours00000001", 1, 0) + "-env",
                                                   learner_service_name("other0000001", 1, 0) + "-env"])
    engine.services[learner_service_name("ours00000001", 1, 0)].set_task("running")
    assert restarted.poll(_row("ours00000001", 1, 0, live)).alive  # adopted: polled by its id


def test_start_replaces_a_stale_learner_of_its_job_and_refuses_a_foreign_name(tmp_path: Path, swarm: SwarmLearners,
                                                                              engine: FakeEngine) -> None:
    old = swarm.start(_launch(tmp_path)).service_id
    new = swarm.start(_launch(tmp_path)).service_id  # same job, attempt, rank: a deploy the database never saw
    assert old != new and [s.id for s in engine.services.values()] == [new]
    name = learner_service_name("abc123def456", 2, 0)
    engine.services_api.create("nginx", name=name, mode={"replicated": {"Replicas": 1}}, labels={})
    with pytest.raises(DeployError, match="not labswarm's"):
        swarm.start(_launch(tmp_path, attempt=2))
    assert engine.services[name].kwargs["labels"] == {}  # left alone
    assert f"{name}-env" not in engine.secrets.items


@pytest.mark.parametrize(("operation", "error", "message"), [
    ("create", docker.errors.APIError("500", explanation="no such image"), "refused to create learner service"),
    ("create_secret", docker.errors.APIError("503", explanation="This node is not a swarm manager."),
     "not a swarm manager"),
    ("create", requests.exceptions.ConnectionError("Connection refused"), "cannot reach the Docker engine"),
])
def test_engine_errors_become_deploy_errors_and_nothing_is_left(tmp_path: Path, swarm: SwarmLearners,
                                                                engine: FakeEngine, operation: str,
                                                                error: Exception, message: str) -> None:
    engine.errors[operation] = error
    with pytest.raises(DeployError, match=message) as info:
        swarm.start(_launch(tmp_path))
    assert info.value.__cause__ is error
    assert engine.services == {} and engine.secrets.items == {} and engine.configs.items == {}


def test_an_unreachable_engine_while_polling_is_not_a_dead_learner(tmp_path: Path, swarm: SwarmLearners,
                                                                    engine: FakeEngine) -> None:
    row = _row("abc123def456", 1, 0, swarm.start(_launch(tmp_path)).service_id)
    engine.errors["tasks"] = requests.exceptions.ConnectionError("Connection refused")
    assert swarm.poll(row) == LearnerStatus(True)  # the heartbeat watchdog still applies


# through the real job service over real HTTP, the fake engine standing in for the Docker engine
@pytest.fixture
def swarm_manager(tmp_path: Path, engine: FakeEngine, monkeypatch: pytest.MonkeyPatch) -> Iterator[Manager]:
    monkeypatch.setattr(SwarmPlatform, "learners",
                        classmethod(lambda _cls, settings: SwarmLearners(settings, client=FakeClient(engine))))
    with manager(tmp_path, job_launcher="swarm", job_start_timeout=60) as m:
        yield m


def _command_job(tmp_path: Path, **restart: Any) -> dict[str, Any]:
    return tiny_manifest(tmp_path, framework={"name": "command", "command": [sys.executable, "-c", "pass"]},
                         restart={"backoff_s": 0.1, "backoff_max_s": 0.2, "user_exit_codes": [3], **restart})


def _service(engine: FakeEngine, job_id: str, attempt: int) -> FakeService:
    name = learner_service_name(job_id, attempt, 0)
    return wait_until(lambda: engine.services.get(name), 30, f"service {name}")


def _report(m: Manager, engine: FakeEngine, job_id: str, attempt: int) -> None:
    """Report as the learner would, with the token the service's docker secret holds."""
    secret = engine.secrets.items[learner_service_name(job_id, attempt, 0) + "-env"].data.decode()
    token = next(line.split("=", 1)[1] for line in secret.splitlines() if line.startswith("LABSWARM_API_TOKEN="))
    response = m.http.post(f"/v1/jobs/{job_id}/attempts/{attempt}/reports",
                           headers={"Authorization": f"Bearer {token}"},
                           json={"rank": 0, "events": [{"n": 0, "kind": "log", "payload": {"line": "hello"}}]})
    assert response.status_code == 200, response.text


def test_a_job_runs_on_the_swarm_and_completes(tmp_path: Path, swarm_manager: Manager, engine: FakeEngine) -> None:
    m = swarm_manager
    job = m.submit(_command_job(tmp_path))
    service = _service(engine, job["id"], 1)
    service.set_task("running")
    _report(m, engine, job["id"], 1)
    assert m.show(job["id"])["status"] == "running"
    service.set_task("complete", 0)
    stream = read_events(m.http, job["id"], timeout=60)
    assert statuses(stream)[-3:] == ["running", "storing", "completed"]
    assert any(e["event"] == "log" and e["data"]["line"] == "hello" for e in stream)
    shown = m.show(job["id"])
    assert shown["attempts"][0]["exit_code"] == 0
    with m.jobs.db() as db:
        assert db.get(LearnerRow, (job["id"], 1, 0)).service_id == service.id
    wait_until(lambda: not engine.services and not engine.secrets.items and not engine.configs.items, 30,
               "the learner's service, secret and config removed")


def test_failed_tasks_honour_the_user_and_platform_budgets(tmp_path: Path, swarm_manager: Manager,
                                                           engine: FakeEngine) -> None:
    m = swarm_manager
    user = m.submit(_command_job(tmp_path / "u"))  # exit 3: the user's fault, no user restart
    _service(engine, user["id"], 1).set_task("failed", 3, "task: non-zero exit (3)")
    assert statuses(read_events(m.http, user["id"], timeout=60))[-1] == "failed"
    shown = m.show(user["id"])
    assert shown["error_code"] == "C101" and len(shown["attempts"]) == 1

    platform = m.submit(_command_job(tmp_path / "p", max_restarts_platform=1))  # exit 1: the platform's, 1 restart
    _service(engine, platform["id"], 1).set_task("failed", 1, "task: non-zero exit (1)")
    _service(engine, platform["id"], 2).set_task("failed", 1, "task: non-zero exit (1)")
    assert statuses(read_events(m.http, platform["id"], timeout=60))[-1] == "failed"
    shown = m.show(platform["id"])
    assert shown["error_code"] == "S101" and [a["exit_code"] for a in shown["attempts"]] == [1, 1]
    assert shown["restarts"] == {"user": 0, "platform": 1}


def test_an_engine_that_refuses_is_the_platforms_fault(tmp_path: Path, swarm_manager: Manager,
                                                       engine: FakeEngine) -> None:
    engine.errors["create"] = docker.errors.APIError("500", explanation="network labswarm not found")
    job = swarm_manager.submit(_command_job(tmp_path, max_restarts_platform=0))
    stream = read_events(swarm_manager.http, job["id"], timeout=60)
    assert statuses(stream)[-1] == "failed"
    shown = swarm_manager.show(job["id"])
    assert shown["error_code"] == "S105" and "network labswarm not found" in json.dumps(stream)
    assert engine.secrets.items == {} and engine.configs.items == {}


PS_SECRET = "ps-secret-do-not-print"


def test_a_distributed_learners_place_is_in_its_env_and_any_other_variable_in_its_secret(
        tmp_path: Path, swarm: SwarmLearners, engine: FakeEngine) -> None:
    place = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "manager", "MASTER_PORT": "41234",
             "LABSWARM_ATTEMPT": "1", "LABSWARM_PS_ADDRS": "labswarm-job-abc123def456-ps-0:29600",
             "LABSWARM_COLLECTIVE_TIMEOUT_S": "30.0"}
    launch = _launch(tmp_path, rank=1)
    swarm.start(LearnerLaunch(**{**launch.__dict__, "env": {**place, "LABSWARM_PS_SECRET": PS_SECRET}}))
    [create] = engine.created
    env = dict(item.split("=", 1) for item in create["task_template"]["ContainerSpec"]["Env"])
    assert env == {"PYTHONUNBUFFERED": "1", **place}
    assert PS_SECRET not in json.dumps(create)
    secret = engine.secrets.items[learner_service_name("abc123def456", 1, 1) + "-env"].data.decode()
    assert f"LABSWARM_PS_SECRET={PS_SECRET}\n" in secret and f"LABSWARM_API_TOKEN={TOKEN}\n" in secret


def test_a_shard_service_gets_its_environment_as_a_secret_and_is_removed_with_it(
        tmp_path: Path, swarm: SwarmLearners, engine: FakeEngine) -> None:
    from labswarm.deploy.swarm_learners import ps_service_name
    from labswarm.deploy.swarm_shards import PS_PORT

    shards = swarm.shard_runner("abc123def456")
    assert shards.master_host == "manager" and shards.address(0) == (ps_service_name("abc123def456", 0), PS_PORT)
    argv = [sys.executable, "-m", "labswarm.train.distributed.ps", "--shard", "0", "--learners", "2",
            "--checkpoint-dir",
            str(shards.checkpoint_dir), "--host", ps_service_name("abc123def456", 0), "--port", str(PS_PORT)]
    shards.start(0, argv, {"LABSWARM_PS_SECRET": PS_SECRET})  # the fake's task runs at once
    [create] = engine.created
    assert PS_SECRET not in json.dumps(create)
    assert engine.secrets.items[ps_service_name("abc123def456", 0) + "-env"].data.decode() == \
        f"LABSWARM_PS_SECRET={PS_SECRET}\n"
    assert shards.running(0) and shards.dead() == []
    engine.services[ps_service_name("abc123def456", 0)].set_task("failed", 137, "task: non-zero exit (137)")
    assert shards.dead() == [0] and shards.exit_code(0) == 137
    shards.stop()
    assert engine.services == {} and engine.secrets.items == {}


def test_a_shard_whose_task_is_rejected_fails_the_deploy_and_leaves_nothing(
        tmp_path: Path, swarm: SwarmLearners, engine: FakeEngine) -> None:
    shards = swarm.shard_runner("abc123def456")
    argv = [sys.executable, "-m", "labswarm.train.distributed.ps", "--shard", "0", "--learners", "2",
            "--checkpoint-dir",
            "/data/x", "--host", "h", "--port", "29600"]
    original = engine.services_api.create

    def create(*args: Any, **kwargs: Any) -> FakeService:  # created, then its task rejected by the swarm
        service = original(*args, **kwargs)
        service.set_task("rejected", None, "no suitable node")
        return service

    engine.services_api.create = create  # type: ignore[method-assign]
    with pytest.raises(DeployError, match="did not start: its task is rejected"):
        shards.start(0, argv, {})
    assert engine.services == {} and engine.secrets.items == {}


def test_a_restarted_manager_removes_the_shards_of_its_jobs_and_keeps_its_live_learners(
        tmp_path: Path, engine: FakeEngine) -> None:
    from labswarm.deploy.swarm_learners import ps_service_name

    first = SwarmLearners(_settings(), client=FakeClient(engine))
    live = first.start(_launch(tmp_path, job="ours00000001")).service_id
    argv = [sys.executable, "-m", "labswarm.train.distributed.ps", "--shard", "0", "--learners", "2",
            "--checkpoint-dir",
            "/data/x", "--host", "h", "--port", "29600"]
    first.shard_runner("ours00000001").start(0, argv, {"LABSWARM_PS_SECRET": PS_SECRET})
    first.shard_runner("other0000001").start(0, argv, {})  # another manager's job
    SwarmLearners(_settings(), client=FakeClient(engine)).sweep({live}, lambda job: job == "ours00000001")
    # the coordinator lived in the dead manager's memory: its shards go (the job restarts as a new attempt)
    assert sorted(engine.services) == sorted([learner_service_name("ours00000001", 1, 0),
                                              ps_service_name("other0000001", 0)])
    assert sorted(engine.secrets.items) == sorted([learner_service_name("ours00000001", 1, 0) + "-env",
                                                   ps_service_name("other0000001", 0) + "-env"])
