"""A job given by its SINGA topology alone (issue 23) on the swarm launcher, through the real job service over real
HTTP with the fake Docker engine (tests/deploy/deploy_tools.py; the test plays the swarm, no learner runs): the
topology reaches every learner's service in its spec, and a member of one worker group that fails is replaced
alone, in the same attempt, while the other group's services are left."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deploy.deploy_tools import FakeClient, FakeEngine

from jobs.manager import Manager, manager, read_events, wait_until
from jobs.tiny import tiny_manifest
from labswarm.deploy.platforms import SwarmPlatform
from labswarm.deploy.swarm_learners import SwarmLearners, learner_service_name, ps_service_name

TOPOLOGY = {"worker_groups": 2, "workers_per_group": 2, "colocated": False}


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def swarm_manager(tmp_path: Path, engine: FakeEngine, monkeypatch: pytest.MonkeyPatch) -> Iterator[Manager]:
    monkeypatch.setattr(SwarmPlatform, "learners",
                        classmethod(lambda _cls, settings: SwarmLearners(settings, client=FakeClient(engine))))
    with manager(tmp_path, job_launcher="swarm", job_slots=4, job_start_timeout=60,
                 swarm_manager_url="http://manager.labswarm:8000", swarm_data_target=str(tmp_path / "volume")) as m:
        yield m


def _env(engine: FakeEngine, name: str) -> dict[str, str]:
    create = [c for c in list(engine.created) if c["name"] == name][-1]
    return dict(item.split("=", 1) for item in create["task_template"]["ContainerSpec"].get("Env") or [])


@pytest.mark.slow  # ~20 s at load ~20: a real manager and coordinator
def test_the_topology_reaches_every_learner_and_a_failed_group_member_is_replaced_alone(
        tmp_path: Path, swarm_manager: Manager, engine: FakeEngine) -> None:
    m = swarm_manager
    jid = m.submit(tiny_manifest(tmp_path, learners=4, ps_shards=1, framework={"topology": TOPOLOGY}))["id"]
    names = [ps_service_name(jid, 0), *(learner_service_name(jid, 1, r) for r in range(4))]
    found = wait_until(lambda: all(n in engine.services for n in names) and dict(engine.services), 30, "services")
    ids = {n: found[n].id for n in names}
    read_events(m.http, jid, timeout=30, until=lambda e: e["event"] == "attempt" and e["data"]["event"] == "started")
    for rank in range(4):  # each learner's spec (its docker config) carries the resolved framework and topology
        name = learner_service_name(jid, 1, rank)
        framework = json.loads(engine.configs.items[f"{name}-spec"].data)["manifest"]["framework"]
        assert framework["name"] == "downpour" and framework["group_size"] == 2, framework
        assert {k: framework["topology"][k] for k in TOPOLOGY} == TOPOLOGY
        assert framework["topology"]["server_groups"] == 1 and framework["topology"]["shards_per_group"] == 1
        env = _env(engine, name)
        assert (env["RANK"], env["WORLD_SIZE"], env["LABSWARM_ATTEMPT"]) == (str(rank), "4", "1")
    before: dict[str, Any] = _env(engine, names[4])
    engine.services[names[4]].set_task("failed", 137, "task: non-zero exit (137)")  # rank 3, worker group 1
    wait_until(lambda: (s := engine.services.get(names[4])) is not None and s.id != ids[names[4]], 30,
               "rank 3 replaced")
    assert all(engine.services[n].id == ids[n] for n in names[:4])  # the shard and ranks 0-2 left running
    assert learner_service_name(jid, 2, 0) not in engine.services  # no new attempt
    assert _env(engine, names[4]) == before  # the same place in the job: coordinator, shards, attempt, rank
    # the service is replaced before the manager's transaction that records the restart commits: wait on the record
    seen: list[Any] = []

    def restarted() -> bool:
        seen[:] = m.show(jid)["attempts"]
        return any(a["learner_restarts"] for a in seen)
    try:
        wait_until(restarted, 60, "learner 3's restart recorded")
    except TimeoutError as e:
        raise AssertionError(f"{e}; the attempts were {seen}") from e
    assert len(seen) == 1 and [r["rank"] for r in seen[0]["learner_restarts"]] == [3], seen
