"""A manager on the host whose sessions get their workers from the swarm launcher (``launcher: swarm``), for the
contract tests against a real engine (tests/docker/test_swarm_sessions.py).

The manager runs in the test's process (the embedded server on 127.0.0.1), with the host's RabbitMQ and a SQLite
ledger; the worker services it asks the engine for run the image on the host network, reach it and RabbitMQ on
the loopback, and mount the test's shared folder (dataset and store) at the same path (``swarm_data_volume``
an absolute path: a bind mount). The API token and the broker URL (guest's password) reach them as docker
secrets, as in a real deployment.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from engine import BROKER, TOKEN, docker, free_port, wait_for
from helpers import delete_queue, experiment_dict, write_tone_set
from sqlalchemy import create_engine, select

from labswarm.client import ManagerClient
from labswarm.deploy.swarm_secrets import LABEL_MANAGED
from labswarm.deploy.swarm_spec import service_name
from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer
from labswarm.queue.names import queue_name
from labswarm.run.experiment import FINAL
from labswarm.sessions.models import SampleRow
from labswarm.settings import Settings
from labswarm.store import FeatureStore

#: RabbitMQ's management API on the host (.ci/rabbitmq enables the plugin); guest is accepted on the loopback.
MANAGEMENT = "http://127.0.0.1:15672/api"
#: Seconds a whole session may take here (worker containers start in 20-60 s on a loaded machine).
SESSION_TIMEOUT = 600.0
FEATURES = 2


def secrets() -> set[str]:
    """Names of the engine's secrets that labswarm created (label ``labswarm.managed``)."""
    return set(docker("secret", "ls", "--filter", f"label={LABEL_MANAGED}", "--format", "{{.Name}}").stdout.split())


class HostManager:
    """A manager on the host, an experiment of ``tones`` tones (three transformations: 3 samples each, two
    features), and the worker service of its sessions.

    Args:
        shared: a folder readable by the image's user (``shared`` fixture): dataset, store, manager home.
        image: the image of the worker services.
        tones: clips of 10 s in the dataset.
    """

    def __init__(self, shared: Path, image: str, tones: int = 16) -> None:
        self.name = f"dk-{uuid.uuid4().hex[:10]}"
        self.service = service_name(self.name)
        self.data = write_tone_set(shared / "data", tones)
        self.store = shared / "store"
        self.store.mkdir()
        self.store.chmod(0o777)  # the workers run as the image's user (uid 1000)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.settings = Settings(
            home=shared / "home", broker_url=BROKER, api_token=TOKEN, reconcile_after=5.0,
            swarm_image=image, swarm_network="host", swarm_manager_url=self.url,
            swarm_data_volume=str(shared), swarm_data_target=str(shared), swarm_stop_grace=15.0)
        self.secrets_before = secrets()
        self.serve()
        self.client = ManagerClient(self.url, TOKEN, timeout=60.0)
        self.client.post_experiment(experiment_dict(
            self.data, self.store, name=self.name,
            dataset={"root": str(self.data), "sample_rate": 22050, "segment": {"start": 0.0, "duration": 10.0}},
            transformations=[{"name": "identity"}, {"name": "pitch_shift", "semitones": 2},
                             {"name": "time_stretch", "rate": 1.25}],
            features=[{"name": "mel"}, {"name": "mfcc"}]))
        self.total = 3 * tones
        self.session_id: str | None = None

    def serve(self) -> None:
        """Start the manager: here the embedded server in this process (a subclass may run it elsewhere)."""
        self.server = EmbeddedServer(create_app(self.settings), port=self.port).start()

    def stop_serving(self) -> None:
        self.server.stop()

    # the session
    def start(self, workers: int) -> dict[str, Any]:
        """A session with the swarm launcher and ``workers`` replicas (no rate set: the start window clocks it)."""
        session = self.client.start_session(self.name, launcher="swarm", workers=workers)
        assert session["launcher"] == "swarm", session
        self.session_id = session["id"]
        return session

    def progress(self) -> dict[str, Any]:
        return self.client.session(self.session_id)

    def wait_progress(self, what: str, predicate: Callable[[dict[str, Any]], bool],
                      timeout: float = SESSION_TIMEOUT) -> dict[str, Any]:
        """The session's progress once ``predicate`` holds; fails early when it ends otherwise."""
        def check() -> dict[str, Any] | None:
            progress = self.progress()
            if predicate(progress):
                return progress
            if progress["status"] in FINAL:
                pytest.fail(f"the session ended {progress['status']} while waiting for {what}: {progress}\n"
                            f"{self.logs()}")
            return None
        return wait_for(what, check, timeout, interval=0.5)  # type: ignore[return-value]

    # the service
    def replicas(self) -> int | None:
        """The service's replicas as specified (``None``: no such service)."""
        done = docker("service", "inspect", "-f", "{{.Spec.Mode.Replicated.Replicas}}", self.service, check=False)
        return int(done.stdout) if done.returncode == 0 else None

    def containers(self) -> list[str]:
        """Ids of the service's running containers."""
        return docker("ps", "-q", "--filter", f"label=com.docker.swarm.service.name={self.service}",
                      "--filter", "status=running").stdout.split()

    def consumers(self) -> int:
        """Consumers of the experiment's queue, from RabbitMQ's management API (refreshed every ~5 s)."""
        queue = urllib.parse.quote(queue_name(self.name), safe="")
        answer = httpx.get(f"{MANAGEMENT}/queues/%2F/{queue}", auth=("guest", "guest"), timeout=10)
        return int(answer.json().get("consumers", 0)) if answer.status_code == 200 else 0

    def wait_workers(self, n: int, timeout: float = 300.0) -> None:
        """``n`` containers running and ``n`` consumers on the queue (each container: one worker, 1 process)."""
        wait_for(f"{n} containers of {self.service} running (now {len(self.containers())})",
                 lambda: len(self.containers()) == n, timeout, interval=1.0)
        try:
            wait_for(f"{n} consumers on {queue_name(self.name)}", lambda: self.consumers() == n, timeout, interval=1.0)
        except pytest.fail.Exception as exc:  # what the workers said, and each task's state
            pytest.fail(f"{exc} (now {self.consumers()})\n{self.logs()}\n{task_states(self.service)}")

    def service_gone(self) -> bool:
        return docker("service", "inspect", self.service, check=False).returncode != 0

    def logs(self) -> str:
        """The service's last log lines (for failure messages)."""
        done = docker("service", "logs", "--tail", "60", self.service, check=False, timeout=60)
        return f"--- docker service logs {self.service}\n{done.stdout[-6000:]}{done.stderr[-2000:]}"

    # the checks
    def ledger(self) -> list[tuple[str, str, int]]:
        """``(sample id, status, attempts)`` of each row of the session's ledger."""
        engine = create_engine(self.settings.resolved_database_url())
        try:
            with engine.connect() as db:
                rows = db.execute(select(SampleRow.sample_id, SampleRow.status, SampleRow.attempts)
                                  .where(SampleRow.session_id == self.session_id))
                return [tuple(row) for row in rows]  # type: ignore[misc]
        finally:
            engine.dispose()

    def assert_every_sample_done_once(self, progress: dict[str, Any], resumed: bool = False) -> None:
        """Completed; each sample one ledger row, done; each array once in the store, no partial file.

        ``resumed``: the manager restarted mid-session and went on from its persisted cursor: a sample a worker
        computed (arrays stored) whose outcome the dead manager never recorded is found in the store when
        published again and counted ``cached`` (computed once, not twice)."""
        assert progress["status"] == "completed", progress
        assert progress["total"] == self.total and progress["failed"] == 0 and progress["pending"] == 0, progress
        rows = self.ledger()
        assert len(rows) == len({sample for sample, _, _ in rows}) == self.total
        if resumed:
            assert progress["done"] + progress["cached"] == self.total, progress
            assert {status for _, status, _ in rows} <= {"done", "cached"}, rows
        else:
            assert progress["done"] == self.total, progress  # a fresh store: nothing cached
            assert {status for _, status, _ in rows} == {"done"}, rows
        assert FeatureStore(self.store).stats().entries == self.total * FEATURES
        assert sorted(self.store.rglob("*.tmp")) == []

    def close(self) -> None:
        """Cancel a session still active, remove its service (by hand if the manager did not), stop the manager,
        delete the queue and the secrets the test made."""
        try:
            if self.session_id is not None and self.progress()["status"] not in FINAL:
                self.client.cancel(self.session_id)
        except Exception:  # the manager may be the thing that failed: the service is removed below anyway
            pass
        try:
            deadline = time.monotonic() + 60
            while not self.service_gone() and time.monotonic() < deadline:
                time.sleep(1)
            if not self.service_gone():
                docker("service", "rm", self.service, check=False)
            # its containers stop after the service is gone: one still connected would declare the queue again
            wait_for(f"{self.service}'s containers gone", lambda: not docker(
                "ps", "-aq", "--filter", f"label=com.docker.swarm.service.name={self.service}").stdout.strip(), 120)
        finally:
            self.client.close()
            self.stop_serving()
            delete_queue(BROKER, queue_name(self.name))
            for _ in range(60):  # a secret in use by a task being removed is refused for a while
                made = secrets() - self.secrets_before
                if not made or docker("secret", "rm", *made, check=False).returncode == 0:
                    break
                time.sleep(1)


def task_states(service: str) -> list[dict[str, str]]:
    """Every task of ``service`` (current and past): its desired state, state and error."""
    done = docker("service", "ps", service, "--no-trunc", "--format", "{{json .}}", check=False)
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
