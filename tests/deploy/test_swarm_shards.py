"""The parameter-server shards' services (labswarm.deploy.swarm_shards) on both networks, as the docker SDK converts
them for the engine (the fake engine of deploy_tools records the converted create requests): on an overlay network
a shard is reached by its service name on the fixed port; on the host network each shard has a port of its own on
the manager's node, is pinned to that node, and keeps node, address and port when it is started again."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import docker.errors
import pytest
from deploy_tools import FAKE_NODE_ID, FakeClient, FakeEngine

from labswarm.deploy.swarm_jobs import JobServices, ps_service_name
from labswarm.deploy.swarm_shards import HOST_NETWORK, PS_PORT, SwarmShards, manager_view, shard_service_spec
from labswarm.errors import DeployError
from labswarm.settings import Settings
from labswarm.train.distributed.launch import plan_attempt

JOB = "0123456789ab"


def _settings(tmp_path: Path, network: str, manager: str) -> Settings:
    return Settings(home=tmp_path / "home", swarm_image="labswarm:test", swarm_network=network,
                    swarm_manager_url=f"http://{manager}:8000", swarm_data_volume="labswarm-data",
                    swarm_data_target="/data", swarm_constraints=["node.labels.ps==yes"])


def _runner(tmp_path: Path, engine: FakeEngine, network: str, manager: str) -> SwarmShards:
    return SwarmShards(JobServices(_settings(tmp_path, network, manager), client=FakeClient(engine)), JOB)


def _shard_plans(runner: SwarmShards, shards: int) -> list[Any]:
    """The plan's shard command lines for the runner's addresses (what JobCluster starts)."""
    plans = plan_attempt({"name": "downpour"}, 2, 1, (runner.master_host, 29500),
                         [runner.address(k) for k in range(shards)], runner.checkpoint_dir, ps_secret="s" * 32)
    return [p for p in plans if p.kind == "ps"]


def _script(create: dict[str, Any]) -> str:
    return create["task_template"]["ContainerSpec"]["Command"][-1]


def _constraints(create: dict[str, Any]) -> list[str]:
    return create["task_template"]["Placement"]["Constraints"]


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_overlay_shards_listen_everywhere_on_the_fixed_port_and_are_reached_by_name(tmp_path: Path) -> None:
    engine = FakeEngine()
    runner = _runner(tmp_path, engine, "labswarm", "manager")
    assert [runner.address(k) for k in (0, 1)] == [(ps_service_name(JOB, k), PS_PORT) for k in (0, 1)]
    for plan in _shard_plans(runner, 2):
        runner.start(plan.index, plan.argv, plan.env, wait=False)
    for k, create in enumerate(engine.created):
        assert create["name"] == ps_service_name(JOB, k)
        assert f"--host 0.0.0.0 --port {PS_PORT}" in _script(create)  # every interface of its own container
        assert _constraints(create) == ["node.labels.ps==yes"]  # any node: its name follows it
        assert [n["Target"] for n in create["task_template"]["Networks"]] == ["labswarm"]


def test_host_network_shards_get_a_port_each_on_the_managers_node_kept_when_started_again(tmp_path: Path) -> None:
    engine = FakeEngine()
    runner = _runner(tmp_path, engine, HOST_NETWORK, "127.0.0.1")
    addresses = [runner.address(k) for k in (0, 1)]
    assert [host for host, _ in addresses] == ["127.0.0.1", "127.0.0.1"]  # the manager's, as the learners see it
    ports = [port for _, port in addresses]
    assert len(set(ports)) == 2 and PS_PORT not in ports and all(_free(p) for p in ports)
    assert [runner.address(k) for k in (0, 1)] == addresses  # chosen once for the job
    plans = _shard_plans(runner, 2)
    for plan in plans:
        runner.start(plan.index, plan.argv, plan.env, wait=False)
    for k, create in enumerate(engine.created):
        script = _script(create)
        assert f"--host 127.0.0.1 --port {ports[k]}" in script and "0.0.0.0" not in script, script
        assert _constraints(create) == ["node.labels.ps==yes", f"node.id=={FAKE_NODE_ID}"]
        assert [n["Target"] for n in create["task_template"]["Networks"]] == [HOST_NETWORK]
    # shard 1 dies and is started again (JobCluster.revive: the same plan): same node, address and port
    engine.services[ps_service_name(JOB, 1)].set_task("failed", 137, "task: non-zero exit (137)")
    assert runner.dead() == [1] and runner.exit_code(1) == 137
    runner.start(1, plans[1].argv, plans[1].env, wait=False)
    assert _script(engine.created[-1]) == _script(engine.created[1])
    assert _constraints(engine.created[-1]) == _constraints(engine.created[1])
    assert runner.address(1) == addresses[1] and runner.dead() == []


def test_host_network_shard_on_a_node_name_and_an_engine_outside_a_swarm(tmp_path: Path) -> None:
    """A cluster's manager reached by its node's name: the shards listen there; an engine that cannot say its
    swarm node refuses the shard with the reason, and leaves nothing behind."""
    engine = FakeEngine()
    runner = _runner(tmp_path, engine, HOST_NETWORK, "node-a.lab")
    host, port = runner.address(0)
    [plan] = _shard_plans(runner, 1)
    spec = shard_service_spec(JOB, 0, plan.argv, runner.settings, node_id="n1")
    assert host == "node-a.lab" and f"--host node-a.lab --port {port}" in spec.command[-1]
    assert spec.constraints == ("node.labels.ps==yes", "node.id==n1")
    engine.errors["info"] = docker.errors.APIError("This node is not a swarm manager.")
    with pytest.raises(DeployError, match="swarm node"):
        runner.start(0, plan.argv, plan.env, wait=False)
    assert engine.services == {} and engine.secrets.items == {}


def test_discard_removes_the_jobs_folder_where_the_manager_sees_the_volume(tmp_path: Path) -> None:
    """A bind mount: the shards checkpoint under the target in their containers, the manager removes the host
    folder's copy (only this job's); a named volume is mounted by the manager at the target itself."""
    host = tmp_path / "shared"
    settings = Settings(home=tmp_path / "home", swarm_manager_url="http://127.0.0.1:8000",
                        swarm_data_volume=str(host), swarm_data_target="/data")
    runner = SwarmShards(JobServices(settings, client=FakeClient(FakeEngine())), JOB)
    assert runner.checkpoint_dir == Path("/data/.labswarm-jobs") / JOB / "ps"  # the containers' path
    ours, other = host / ".labswarm-jobs" / JOB / "ps", host / ".labswarm-jobs" / "another0job" / "ps"
    for folder in (ours, other):
        folder.mkdir(parents=True)
        (folder / "shard-0.pt").write_bytes(b"checkpoint")
    runner.discard()
    assert not ours.parent.exists() and (other / "shard-0.pt").is_file()
    named = settings.model_copy(update={"swarm_data_volume": "labswarm-data"})
    assert manager_view(named, runner.checkpoint_dir) == runner.checkpoint_dir
