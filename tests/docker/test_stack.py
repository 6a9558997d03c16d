"""``docker stack deploy`` of docker/compose.host.yml on the engine of ``.ci/docker``: the manager and the health
controller as stack services on the host network (RabbitMQ is the host's, on 127.0.0.1), their secrets as docker
secrets; both turn healthy, the manager answers with the token only, and ``docker stack rm`` leaves no service,
secret or network of the stack. The seconds from the deploy to a healthy manager are printed (docs/benchmarks/
docker.md), not asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from engine import BROKER, TOKEN, docker, free_port, wait_for
from helpers import missing

ROOT = Path(__file__).resolve().parents[2]
STACK_FILE = ROOT / "docker" / "compose.host.yml"


class Stack:
    """A stack of docker/compose.host.yml named :attr:`name`, its secrets in ``shared``/secrets."""

    def __init__(self, shared: Path, image: str) -> None:
        self.name = f"lst{uuid.uuid4().hex[:8]}"
        self.port, self.metrics_port = free_port(), free_port()
        secrets = shared / "secrets"
        secrets.mkdir(mode=0o700)
        for name, value in {"api_token": TOKEN, "metrics_token": uuid.uuid4().hex, "broker_url": BROKER,
                            "rabbitmq_api": "http://guest:guest@127.0.0.1:15672"}.items():
            (secrets / name).write_text(value)
        self.env = {**os.environ, "LABSWARM_IMAGE": image, "LABSWARM_SECRETS": str(secrets),
                    "LABSWARM_API_TOKEN_FILE": str(secrets / "api_token"), "LABSWARM_DATA": str(shared),
                    "LABSWARM_PORT": str(self.port), "LABSWARM_METRICS_PORT": str(self.metrics_port),
                    "DOCKER_GID": str(os.stat("/var/run/docker.sock").st_gid), "LABSWARM_HEALTH_INTERVAL": "1s"}

    def deploy(self) -> None:
        done = subprocess.run(["docker", "stack", "deploy", "-c", str(STACK_FILE), self.name], env=self.env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr

    def health(self, service: str) -> str:
        """The health status of ``service``'s running container ('' while there is none)."""
        ids = docker("ps", "-q", "--filter", f"label=com.docker.swarm.service.name={self.name}_{service}",
                     "--filter", "status=running").stdout.split()
        if not ids:
            return ""
        state = json.loads(docker("inspect", "-f", "{{json .State}}", ids[0]).stdout)
        return (state.get("Health") or {}).get("Status", "")

    def leftovers(self) -> list[str]:
        """The stack's services, secrets and networks still known to the engine."""
        return [name for kind in ("service", "secret", "network")
                for name in docker(kind, "ls", "--filter", f"label=com.docker.stack.namespace={self.name}",
                                   "--format", "{{.Name}}").stdout.split()]

    def remove(self) -> None:
        docker("stack", "rm", self.name, check=False)
        wait_for(f"stack {self.name} gone: {self.leftovers()}", lambda: not self.leftovers(), 120, interval=1.0)
        wait_for(f"stack {self.name}'s containers gone", lambda: not docker(
            "ps", "-aq", "--filter", f"label=com.docker.stack.namespace={self.name}").stdout.strip(), 120)
        volumes = docker("volume", "ls", "-q", "--filter", f"label=com.docker.stack.namespace={self.name}").stdout
        if volumes.split():
            docker("volume", "rm", *volumes.split(), check=False)


@pytest.fixture
def stack(engine: None, image: str, shared: Path) -> Iterator[Stack]:
    state = docker("info", "-f", "{{.Swarm.LocalNodeState}}").stdout.strip()
    if state != "active":
        missing(f"the engine is not in a swarm ({state}): bash .ci/docker swarm")
    made = Stack(shared, image)
    try:
        yield made
    finally:
        made.remove()


def test_stack_deploy_on_the_host_network_brings_up_a_healthy_manager_and_health_controller(stack: Stack) -> None:
    start = time.monotonic()
    stack.deploy()
    wait_for("the stack's manager healthy", lambda: stack.health("manager") == "healthy", 300, interval=0.5)
    to_manager = time.monotonic() - start
    wait_for("the stack's health controller healthy", lambda: stack.health("health") == "healthy", 300, interval=0.5)
    print(f"\nstack deploy -> manager healthy {to_manager:.1f} s, health controller {time.monotonic() - start:.1f} s")

    url = f"http://127.0.0.1:{stack.port}"
    assert httpx.get(f"{url}/experiments", timeout=10).status_code == 401
    assert httpx.get(f"{url}/experiments", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10).status_code == 200
    assert httpx.get(f"http://127.0.0.1:{stack.metrics_port}/health", timeout=10).status_code == 200
    env = docker("service", "inspect", "-f", "{{json .Spec.TaskTemplate.ContainerSpec.Env}}",
                 f"{stack.name}_manager").stdout
    assert TOKEN not in env and "guest:guest" not in env, "secrets travel as docker secrets, never in the env"
    assert set(stack.leftovers()) >= {f"{stack.name}_manager", f"{stack.name}_health"}
