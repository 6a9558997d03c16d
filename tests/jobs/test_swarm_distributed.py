"""Distributed jobs (``learners: N``) on the swarm launcher, through the real job service over real HTTP, with the
fake Docker engine (tests/deploy/deploy_tools.py: the SDK's real types, conversion and errors) standing in for the
engine, and the job's real coordinator (a ``TCPStore`` in the manager). The test plays the swarm: it reads the
services the manager created and flips their tasks' states; no learner or shard actually runs."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from deploy.deploy_tools import FakeClient, FakeEngine

from jobs.manager import Manager, manager, read_events, wait_until
from jobs.tiny import tiny_manifest
from labswarm.deploy.platforms import SwarmPlatform
from labswarm.deploy.swarm_learners import LABEL_JOB, LABEL_SHARD, SwarmLearners, learner_service_name, ps_service_name
from labswarm.deploy.swarm_shards import PS_PORT

MANAGER_HOST = "manager.labswarm"


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    """The shared data volume as the manager mounts it (``swarm_data_target``)."""
    return tmp_path / "volume"


@pytest.fixture
def swarm_manager(tmp_path: Path, engine: FakeEngine, volume: Path,
                  monkeypatch: pytest.MonkeyPatch) -> Iterator[Manager]:
    monkeypatch.setattr(SwarmPlatform, "learners",
                        classmethod(lambda _cls, settings: SwarmLearners(settings, client=FakeClient(engine))))
    with manager(tmp_path, job_launcher="swarm", job_slots=2, job_start_timeout=60,
                 swarm_manager_url=f"http://{MANAGER_HOST}:8000", swarm_data_target=str(volume)) as m:
        yield m


def _distributed(tmp_path: Path, framework: dict[str, Any]) -> dict[str, Any]:
    return tiny_manifest(tmp_path, learners=2, framework=framework)


def _create(engine: FakeEngine, name: str, nth: int = -1) -> dict[str, Any]:
    """The ``nth`` create request of service ``name``, as the SDK converted it for the engine."""
    return [c for c in list(engine.created) if c["name"] == name][nth]


def _env(create: dict[str, Any]) -> dict[str, str]:
    return dict(item.split("=", 1) for item in create["task_template"]["ContainerSpec"].get("Env") or [])


def _services(engine: FakeEngine, *names: str) -> list[str]:
    """The ids of these services once they all exist."""
    found = wait_until(lambda: all(n in engine.services for n in names) and dict(engine.services), 30,
                       f"services {names}")
    return [found[n].id for n in names]


def _started(m: Manager, job_id: str, attempt: int) -> dict[str, Any]:
    events = read_events(m.http, job_id, timeout=30, until=lambda e: e["event"] == "attempt" and
                         e["data"]["event"] == "started" and e["data"]["attempt"] == attempt)
    return events[-1]["data"]


def _listening_everywhere(port: int) -> bool:
    """Whether this process (the manager's) listens on ``port`` on every interface."""
    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port and c.laddr.ip in ("::", "0.0.0.0")
               for c in psutil.Process(os.getpid()).net_connections())


def test_shards_first_then_learners_with_their_place_and_delete_removes_all(
        tmp_path: Path, swarm_manager: Manager, engine: FakeEngine, volume: Path) -> None:
    m = swarm_manager
    job = m.submit(_distributed(tmp_path, {"name": "sandblaster"}))  # ps_shards: 1 (the default)
    jid = job["id"]
    shard, rank0, rank1 = ps_service_name(jid, 0), learner_service_name(jid, 1, 0), learner_service_name(jid, 1, 1)
    ids = _services(engine, shard, rank0, rank1)
    # the DLaaS order: the parameter server's service first, then the learners'
    assert [c[1] for c in list(engine.calls) if c[0] == "create"] == [shard, rank0, rank1]
    started = _started(m, jid, 1)
    port = started["coordinator_port"]
    assert started["ps"] == [f"{shard}:{PS_PORT}"] and started["ps_services"] == [ids[0]]
    assert started["services"] == ids[1:] and started["coordinator"] == f"{MANAGER_HOST}:{port}"
    assert _listening_everywhere(port)  # the coordinator's store, reachable from the learners' containers
    for rank, name in enumerate((rank0, rank1)):
        env = _env(_create(engine, name))
        assert {k: env.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LABSWARM_ATTEMPT",
                                        "LABSWARM_PS_ADDRS")} == {
            "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": MANAGER_HOST, "MASTER_PORT": str(port),
            "LABSWARM_ATTEMPT": "1", "LABSWARM_PS_ADDRS": f"{shard}:{PS_PORT}"}
        assert not any(k.startswith("LABSWARM_PS_SECRET") or k == "LABSWARM_API_TOKEN" for k in env)
    spec = _create(engine, shard)
    container = spec["task_template"]["ContainerSpec"]
    script = container["Command"][-1]
    assert "exec python -m labswarm.train.distributed.ps " in script and f"--port {PS_PORT}" in script
    assert "--host 0.0.0.0" in script and "--learners 2" in script  # on every interface of its container
    assert f"--checkpoint-dir {volume}/.labswarm-jobs/{jid}/ps" in script  # the shared volume: any node resumes
    assert [m_["Target"] for m_ in container["Mounts"]] == [str(volume)]
    assert spec["task_template"]["RestartPolicy"]["Condition"] == "none"  # the lifecycle revives it, counted
    assert spec["labels"][LABEL_JOB] == jid and spec["labels"][LABEL_SHARD] == "0"
    # what the plan gives a shard (the job's parameter-server secret, when there is one) is in its docker secret
    shard_env = engine.secrets.items[f"{shard}-env"].data.decode()
    secret = next(line for line in shard_env.splitlines() if line.startswith("LABSWARM_PS_SECRET="))
    for name in (rank0, rank1):  # the learners prove the same per-job secret, from their docker secrets
        assert secret in engine.secrets.items[f"{name}-env"].data.decode().splitlines()
    for line in shard_env.splitlines():
        value = line.split("=", 1)[1].strip("'")
        assert value not in json.dumps(list(engine.created)), line
    # a delete removes every service of the job, their secrets and configs, the shards' checkpoints; the
    # coordinator closes
    (volume / ".labswarm-jobs" / jid / "ps").mkdir(parents=True)
    (volume / ".labswarm-jobs" / jid / "ps" / "shard-0.pt").write_bytes(b"checkpoint")
    assert m.http.delete(f"/v1/jobs/{jid}").status_code == 204
    assert engine.services == {} and engine.secrets.items == {} and engine.configs.items == {}
    assert not (volume / ".labswarm-jobs" / jid).exists() and volume.exists()
    wait_until(lambda: not _listening_everywhere(port), 60, "the coordinator closed")


def test_an_async_learner_that_fails_is_replaced_alone(tmp_path: Path, swarm_manager: Manager,
                                                       engine: FakeEngine) -> None:
    m = swarm_manager
    jid = m.submit(_distributed(tmp_path, {"name": "downpour"}))["id"]
    shard, rank0, rank1 = ps_service_name(jid, 0), learner_service_name(jid, 1, 0), learner_service_name(jid, 1, 1)
    ids = _services(engine, shard, rank0, rank1)
    before = _env(_create(engine, rank1))
    engine.services[rank1].set_task("failed", 137, "task: non-zero exit (137)")  # a platform fault
    wait_until(lambda: (s := engine.services.get(rank1)) is not None and s.id != ids[2], 30, "rank 1 replaced")
    assert engine.services[rank0].id == ids[1] and engine.services[shard].id == ids[0]  # left running
    assert learner_service_name(jid, 2, 0) not in engine.services  # no new attempt
    assert _env(_create(engine, rank1)) == before  # the same place in the job: coordinator, shards, attempt
    assert len([c for c in list(engine.calls) if c[0] == "create"]) == 4
    shown = m.show(jid)
    assert len(shown["attempts"]) == 1 and [r["rank"] for r in shown["attempts"][0]["learner_restarts"]] == [1]
    assert shown["restarts"]["platform"] == 1 and shown["status"] in ("pending", "running")


def test_a_sync_learner_that_fails_replaces_all_as_a_new_attempt(tmp_path: Path, swarm_manager: Manager,
                                                                 engine: FakeEngine) -> None:
    m = swarm_manager
    jid = m.submit(_distributed(tmp_path, {"name": "sandblaster"}))["id"]
    first = _services(engine, ps_service_name(jid, 0), learner_service_name(jid, 1, 0),
                      learner_service_name(jid, 1, 1))
    _started(m, jid, 1)
    engine.services[learner_service_name(jid, 1, 1)].set_task("failed", 137, "task: non-zero exit (137)")
    second = _services(engine, learner_service_name(jid, 2, 0), learner_service_name(jid, 2, 1))
    started = _started(m, jid, 2)
    # the whole attempt went: both learners' services (rank 0 killed as a peer) and the shard, which came back
    # (its checkpoint on the volume) before the new learners
    assert learner_service_name(jid, 1, 0) not in engine.services and learner_service_name(jid, 1, 1) not in \
        engine.services
    assert engine.services[ps_service_name(jid, 0)].id not in first and started["ps_services"] != first[:1]
    creates = [c[1] for c in list(engine.calls) if c[0] == "create"]
    assert creates[3:] == [ps_service_name(jid, 0), learner_service_name(jid, 2, 0), learner_service_name(jid, 2, 1)]
    for rank in (0, 1):
        env = _env(_create(engine, learner_service_name(jid, 2, rank)))
        assert env["LABSWARM_ATTEMPT"] == "2" and env["RANK"] == str(rank)
        assert env["MASTER_PORT"] == str(started["coordinator_port"])  # a fresh coordinator
    shown = m.show(jid)
    assert [a["number"] for a in shown["attempts"]] == [1, 2] and shown["restarts"]["platform"] == 1
    assert shown["attempts"][0]["learner_restarts"] == [] and second[0] not in first


def test_a_shard_that_fails_is_recreated_under_its_name_and_the_learners_are_left(
        tmp_path: Path, swarm_manager: Manager, engine: FakeEngine) -> None:
    m = swarm_manager
    jid = m.submit(_distributed(tmp_path, {"name": "downpour"}))["id"]
    shard = ps_service_name(jid, 0)
    ids = _services(engine, shard, learner_service_name(jid, 1, 0), learner_service_name(jid, 1, 1))
    engine.services[shard].set_task("failed", 137, "task: non-zero exit (137)")
    wait_until(lambda: (s := engine.services.get(shard)) is not None and s.id != ids[0], 30, "the shard recreated")
    assert [engine.services[learner_service_name(jid, 1, r)].id for r in (0, 1)] == ids[1:]
    before, after = (_create(engine, shard, n)["task_template"]["ContainerSpec"] for n in (0, 1))
    assert after["Command"] == before["Command"] and after["Env"] == before["Env"]  # same port, same checkpoint
    events = read_events(m.http, jid, timeout=30, until=lambda e: e["event"] == "log" and "shard 0 exited" in
                         e["data"]["line"])
    assert "parameter-server shard 0 exited 137: restarted from its checkpoint" in events[-1]["data"]["line"]
    assert m.show(jid)["restarts"]["platform"] == 1


def test_halt_removes_every_service_and_resume_deploys_shards_then_learners_again(
        tmp_path: Path, swarm_manager: Manager, engine: FakeEngine) -> None:
    m = swarm_manager
    jid = m.submit(_distributed(tmp_path, {"name": "sandblaster"}))["id"]
    _services(engine, ps_service_name(jid, 0), learner_service_name(jid, 1, 0), learner_service_name(jid, 1, 1))
    assert m.http.patch(f"/v1/jobs/{jid}", json={"status": "halt"}).status_code == 200
    for rank in (0, 1):  # the learners halt at an epoch boundary (the answer to their report) and exit as halted
        engine.services[learner_service_name(jid, 1, rank)].set_task("complete", 75)
    wait_until(lambda: m.show(jid)["status"] == "halted", 30, "halted")
    wait_until(lambda: not engine.services and not engine.secrets.items and not engine.configs.items, 30,
               "every service, secret and config of the job removed")
    assert m.http.patch(f"/v1/jobs/{jid}", json={"status": "resume"}).status_code == 200
    _services(engine, ps_service_name(jid, 0), learner_service_name(jid, 2, 0), learner_service_name(jid, 2, 1))
    creates = [c[1] for c in list(engine.calls) if c[0] == "create"]
    assert creates[3:] == [ps_service_name(jid, 0), learner_service_name(jid, 2, 0), learner_service_name(jid, 2, 1)]
