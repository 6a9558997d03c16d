"""A one-node swarm (``.ci/docker``: advertised on 127.0.0.1) runs a real service of the image: the worker role with
2 replicas on the host network, each task's container healthy by the image's HEALTHCHECK; removing the service
leaves no container and no network behind."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from engine import BROKER, LABEL, TOKEN, Containers, docker, wait_for
from helpers import missing
from test_image import manager, tones_experiment


@pytest.fixture
def swarm(engine: None) -> None:
    state = docker("info", "-f", "{{.Swarm.LocalNodeState}}").stdout.strip()
    if state != "active":
        missing(f"the engine is not in a swarm ({state}): bash .ci/docker swarm")


def networks() -> dict[str, list[str]]:
    """The engine's networks and their subnets."""
    ids = docker("network", "ls", "-q").stdout.split()
    found = json.loads(docker("network", "inspect", *ids).stdout)
    return {n["Name"]: [c.get("Subnet", "") for c in (n.get("IPAM") or {}).get("Config") or []] for n in found}


def test_a_worker_service_with_2_replicas_runs_and_goes_without_leftovers(
        swarm: None, containers: Containers, shared: Path) -> None:
    url = manager(containers, shared)
    experiment = tones_experiment(url, shared)
    before = networks()
    service = f"labswarm-test-workers-{uuid.uuid4().hex[:8]}"
    docker("service", "create", "--detach", "--name", service, "--label", LABEL, "--container-label", LABEL,
           "--network", "host", "--replicas", "2", "--restart-condition", "none",
           "--health-interval", "1s", "--health-start-period", "0s",
           "--env", f"LABSWARM_API_TOKEN={TOKEN}", "--env", f"LABSWARM_BROKER_URL={BROKER}",
           "--mount", f"type=bind,source={shared},target={shared}",
           containers.image, "worker", "--experiment", experiment, "--manager", url)
    try:
        def running() -> list[str]:
            ps = docker("service", "ps", service, "--filter", "desired-state=running",
                        "--format", "{{.CurrentState}}").stdout.split("\n")
            return [s for s in ps if s.startswith("Running")]

        wait_for(f"2 tasks of {service} running", lambda: len(running()) == 2, 120)
        tasks = docker("ps", "-q", "--filter", f"label=com.docker.swarm.service.name={service}").stdout.split()
        assert len(tasks) == 2
        for task in tasks:  # the image's healthcheck in each task's container: pool forked, broker connected
            assert containers.wait_healthy(task, timeout=180) == "worker: healthy"
            assert docker("inspect", "-f", "{{.HostConfig.NetworkMode}}", task).stdout.strip() == "host"
        # on the host network: no network was made for the service
        assert networks() == before, (before, networks())
    finally:
        docker("service", "rm", service, check=False)
    tasks_filter = f"label=com.docker.swarm.service.name={service}"
    wait_for(f"{service}'s containers gone",
             lambda: not docker("ps", "-aq", "--filter", tasks_filter).stdout.strip(), 60)
    assert service not in docker("service", "ls", "--format", "{{.Name}}").stdout.split()
    assert networks() == before
