"""The helpers of the contract tests against a real Docker engine (tests/docker): the ``docker`` CLI, ports on the
loopback, waiting, and the containers of a test (always on the host network)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable

import pytest

from labswarm.ports import free_port as free_port  # re-exported: the docker tests pick ports here

#: The image the tests run (``.ci/docker`` builds it with the training extra).
IMAGE = os.environ.get("LABSWARM_TEST_IMAGE", "labswarm:ci")
#: Every container and service the tests make carries this label.
LABEL = "labswarm.test"
#: The host's RabbitMQ (.ci/rabbitmq); guest/guest is accepted on the loopback only, which the host network is.
BROKER = "amqp://guest:guest@127.0.0.1:5672//"
TOKEN = "docker-contract-" + uuid.uuid4().hex


def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    """``docker ARGS`` (the CLI first on PATH), its output as text."""
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} -> {done.returncode}: {done.stdout}{done.stderr}")
    return done


def wait_for(what: str, condition: Callable[[], object], timeout: float, interval: float = 0.5) -> object:
    """``condition()``'s first truthy value within ``timeout`` s, else a failure naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout:.0f} s")
        time.sleep(interval)


class Containers:
    """Containers of one test on the host network, removed afterwards (and checked gone)."""

    def __init__(self, image: str) -> None:
        self.image = image
        self.names: list[str] = []

    def run(self, *args: str, env: dict[str, str] | None = None, entrypoint: str | None = None,
            volumes: tuple[str, ...] = (), health_interval: str = "1s", init: bool = True) -> str:
        """Start a detached container of the image with ``args`` as its command; returns its name. The image's
        HEALTHCHECK runs every ``health_interval`` (its own 30 s would make the tests slow). ``init``: behind
        docker-init as compose (``init: true``) and the swarm launcher's services run it."""
        name = f"labswarm-test-{uuid.uuid4().hex[:10]}"
        options = ["--detach", "--name", name, "--network", "host", "--label", LABEL, *(["--init"] if init else []),
                   "--health-interval", health_interval, "--health-start-period", "1s"]
        for key, value in (env or {}).items():
            options += ["--env", f"{key}={value}"]
        for volume in volumes:
            options += ["--volume", volume]
        if entrypoint:
            options += ["--entrypoint", entrypoint]
        docker("run", *options, self.image, *args)
        self.names.append(name)
        return name

    def health(self, name: str) -> tuple[str, str]:
        """``(status, the last check's output)`` of the image's HEALTHCHECK in container ``name``."""
        state = json.loads(docker("inspect", "-f", "{{json .State}}", name).stdout)
        if state.get("Status") != "running":
            logs = docker("logs", "--tail", "30", name, check=False)
            pytest.fail(f"{name} is {state.get('Status')} (exit {state.get('ExitCode')}): "
                        f"{logs.stdout}{logs.stderr}")
        health = state.get("Health") or {}
        log = health.get("Log") or [{}]
        return health.get("Status", ""), (log[-1].get("Output") or "").strip()

    def wait_healthy(self, name: str, timeout: float = 120) -> str:
        """Waits until the HEALTHCHECK of ``name`` passes; returns its output."""
        wait_for(f"{name} healthy (last check: {self.health(name)[1]!r})",
                 lambda: self.health(name)[0] == "healthy", timeout)
        return self.health(name)[1]

    def remove(self) -> None:
        if self.names:
            docker("rm", "--force", "--volumes", *self.names, check=False)
            left = [n for n in self.names if docker("container", "inspect", n, check=False).returncode == 0]
            assert not left, f"containers left: {left}"
