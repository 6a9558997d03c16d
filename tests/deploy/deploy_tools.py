"""Paths and tools of the deployment checks (static: there is no Docker engine here or in CI), and the fake
Docker engine that the swarm tests share (tests/deploy/test_swarm.py, tests/jobs/test_swarm_learners.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker.errors
import docker.models.services
import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"


def tool(name: str) -> str:
    """The path of a console script of the dev extra, next to this interpreter (the venv's ``bin``)."""
    path = Path(sys.executable).parent / name
    found = str(path) if path.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is missing: pip install -e '.[dev]' (bash .ci/setup installs it)")
    return found


def run(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=120, cwd=ROOT)


# A tiny fake of docker.DockerClient: only what the launchers call (the sessions' SwarmLauncher, the jobs'
# SwarmLearners). The SDK's types and error classes are the real ones: create() runs the SDK's own conversion of its
# keyword arguments into the engine's service spec, and missing objects raise docker.errors.NotFound.
class FakeService:
    def __init__(self, engine: FakeEngine, kwargs: dict[str, Any]) -> None:
        self.engine = engine
        self.kwargs = kwargs
        self.id = uuid.uuid4().hex[:25]
        self.name = kwargs["name"]
        self.replicas = kwargs["mode"]["replicated"]["Replicas"]
        self.attrs = {"ID": self.id, "Spec": {"Name": kwargs["name"], "Labels": dict(kwargs.get("labels") or {})}}
        self.running = self.replicas
        #: a learner's one task (``Status``: ``State``, ``ContainerStatus.ExitCode``, ``Err``); ``None``: the replicas
        self.task: dict[str, Any] | None = None
        self.log_lines: list[str] = []

    def scale(self, replicas: int) -> bool:
        self.engine.calls.append(("scale", self.kwargs["name"], replicas))
        self.engine.fail("scale")
        self.replicas = replicas
        return True

    def remove(self) -> bool:
        self.engine.calls.append(("remove", self.kwargs["name"]))
        self.engine.fail("remove")
        del self.engine.services[self.kwargs["name"]]
        return True

    def tasks(self, filters: dict | None = None) -> list[dict]:
        self.engine.fail("tasks")
        if self.task is not None:
            return [self.task]
        states = ["running"] * self.running + ["preparing"] * (self.replicas - self.running)
        return [{"Status": {"State": s}} for s in states]

    def set_task(self, state: str, exit_code: int | None = None, err: str | None = None) -> None:
        """Put the learner's task in ``state`` (docker's task states), with the container's exit code."""
        status: dict[str, Any] = {"State": state}
        if exit_code is not None:
            status["ContainerStatus"] = {"ExitCode": exit_code}
        if err:
            status["Err"] = err
        self.task = {"ID": "t-" + self.id, "CreatedAt": "2026-01-01T00:00:00Z", "Status": status}

    def logs(self, **kwargs: Any) -> Iterator[bytes]:
        self.engine.fail("logs")
        return iter([(line + "\n").encode() for line in self.log_lines[-kwargs.get("tail", 10**9):]])


class FakeServices:
    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine

    def get(self, name: str) -> FakeService:
        self.engine.fail("get")
        found = self.engine.services.get(name) or next((s for s in self.engine.services.values() if s.id == name),
                                                       None)
        if found is None:
            raise docker.errors.NotFound(f"service {name} not found", explanation=f"service {name} not found")
        return found

    def list(self, filters: dict | None = None) -> list[FakeService]:
        self.engine.fail("list")
        return [s for s in self.engine.services.values() if _matches(s.attrs, filters)]

    def create(self, image: str, command: list[str] | None = None, **kwargs: Any) -> FakeService:
        self.engine.calls.append(("create", kwargs["name"]))
        self.engine.fail("create")
        if self.engine.on_create is not None:  # e.g. something that happens during the engine's round trip
            self.engine.on_create(kwargs)
        # the real SDK turns these keyword arguments into the engine's ContainerSpec / TaskTemplate: any argument
        # it does not know raises TypeError here, as it would against an engine
        self.engine.created.append(docker.models.services._get_create_service_kwargs(
            "create", dict(kwargs, image=image, command=command)))
        service = self.engine.services[kwargs["name"]] = FakeService(self.engine, dict(kwargs, command=command))
        return service


class FakeObject:
    """A docker secret or config: its name, labels and data (the engine never gives a secret's data back)."""

    def __init__(self, collection: FakeObjects, name: str, data: bytes, labels: dict[str, str]) -> None:
        self.collection = collection
        self.id = uuid.uuid4().hex[:25]
        self.name = name
        self.data = data
        self.attrs = {"ID": self.id, "Spec": {"Name": name, "Labels": dict(labels)}}

    def remove(self) -> bool:
        users = [s.name for s in self.collection.engine.services.values()
                 if any(ref["SecretID" if self.collection.kind == "secret" else "ConfigID"] == self.id
                        for ref in s.kwargs.get(self.collection.kind + "s") or ())]
        if users:  # as swarmkit: an object a service references cannot be removed
            raise docker.errors.APIError("400", explanation=f"{self.collection.kind} '{self.name}' is in use by "
                                                            f"the following service: {', '.join(users)}")
        del self.collection.items[self.name]
        return True


class FakeObjects:
    """The engine's secrets or configs."""

    def __init__(self, engine: FakeEngine, kind: str) -> None:
        self.engine = engine
        self.kind = kind
        self.items: dict[str, FakeObject] = {}

    def create(self, name: str, data: bytes, labels: dict[str, str] | None = None) -> FakeObject:
        self.engine.fail(f"create_{self.kind}")
        if name in self.items:
            raise docker.errors.APIError("409", explanation=f"{self.kind} {name} already exists")
        self.items[name] = FakeObject(self, name, data, labels or {})
        return self.items[name]

    def get(self, key: str) -> FakeObject:
        found = self.items.get(key) or next((o for o in self.items.values() if o.id == key), None)
        if found is None:
            raise docker.errors.NotFound(f"{self.kind} {key} not found", explanation=f"{self.kind} {key} not found")
        return found

    def list(self, filters: dict | None = None) -> list[FakeObject]:
        return [o for o in self.items.values() if _matches(o.attrs, filters)]


def _matches(attrs: dict[str, Any], filters: dict | None) -> bool:
    filters = filters or {}
    spec = attrs["Spec"]
    if "name" in filters and filters["name"] not in spec["Name"]:
        return False
    if "label" in filters:
        key, _, value = filters["label"].partition("=")
        if key not in spec["Labels"] or (value and spec["Labels"][key] != value):
            return False
    return True


#: The swarm node id the fake engine answers with (``FakeClient.info``).
FAKE_NODE_ID = "fakenode0123456789abcdefg"


class FakeEngine:
    """The fake engine: services, secrets and configs, a record of calls and of the SDK's converted create
    requests, and errors to raise on chosen operations."""

    def __init__(self) -> None:
        self.services: dict[str, FakeService] = {}
        self.calls: list[tuple] = []
        self.created: list[dict[str, Any]] = []
        self.errors: dict[str, Exception] = {}
        self.on_create: Callable[[dict[str, Any]], None] | None = None
        self.services_api = FakeServices(self)
        self.secrets = FakeObjects(self, "secret")
        self.configs = FakeObjects(self, "config")

    def fail(self, operation: str) -> None:
        if operation in self.errors:
            raise self.errors[operation]


class FakeClient:
    def __init__(self, engine: FakeEngine) -> None:
        self.services = engine.services_api
        self.secrets = engine.secrets
        self.configs = engine.configs
        self.engine = engine

    def info(self) -> dict[str, Any]:
        """What ``docker info`` says of the swarm: the node this engine is (the engine's answer has more)."""
        self.engine.fail("info")
        return {"Swarm": {"NodeID": FAKE_NODE_ID, "LocalNodeState": "active"}}
