"""Fixtures of the distributed-run contract tests: a real RabbitMQ, and a :class:`Cluster` of real parts (the
embedded manager over HTTP, ``labswarm worker`` subprocesses, a feature store on disk)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from helpers import SR, delete_queue, experiment_dict, write_dataset, write_tone, write_tone_set

from labswarm.client import ManagerClient
from labswarm.config.experiment import ExperimentConfig, parse_experiment
from labswarm.deploy.local import LocalLauncher
from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer, free_port
from labswarm.queue.app import queue_name
from labswarm.run import FINAL
from labswarm.settings import Settings
from labswarm.store import FeatureStore

__all__ = ["SR", "experiment_dict", "write_dataset", "write_tone"]

#: The local RabbitMQ of the runbook (``bash .ci/rabbitmq`` starts it).
RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672//"
#: Controls the local RabbitMQ node (the /usr/sbin wrapper, see RUNBOOK.md).
RABBITMQCTL = "/usr/sbin/rabbitmqctl"
#: Seconds a whole session may take in these tests before it counts as stuck.
SESSION_TIMEOUT = 120.0


def _missing_service(message: str) -> None:
    """Skip the test locally; fail it in CI (``CI=true``), where the service must be there."""
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    """The local RabbitMQ's URL; skips when it is unreachable, but fails when ``CI`` is ``"true"``."""
    from kombu import Connection

    try:
        with Connection(RABBITMQ_URL, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as exc:
        _missing_service(f"RabbitMQ is not reachable at {RABBITMQ_URL} ({type(exc).__name__}: {exc}); "
                         "run `bash .ci/rabbitmq`")
    return RABBITMQ_URL


@pytest.fixture(scope="session")
def rabbitmqctl(rabbitmq_url: str) -> str:
    """The path of ``rabbitmqctl``, to stop and start the local broker (same skip / fail rule)."""
    if not os.access(RABBITMQCTL, os.X_OK):
        _missing_service(f"{RABBITMQCTL} is missing: the broker-restart test needs the local RabbitMQ")
    return RABBITMQCTL


def cluster_config(data: Path, store: Path, name: str) -> ExperimentConfig:
    """Three transformations (one of them slow) and two features per clip: ~50 ms of work per sample."""
    return parse_experiment(experiment_dict(
        data, store, name=name,
        dataset={"root": str(data), "sample_rate": SR, "segment": {"start": 0.0, "duration": 10.0}},
        transformations=[{"name": "identity"}, {"name": "pitch_shift", "semitones": 2},
                         {"name": "time_stretch", "rate": 1.25}],
        features=[{"name": "mel"}, {"name": "mfcc"}],
    ))


class Cluster:
    """An experiment run by real parts: the embedded manager (FastAPI over HTTP on a fixed port, so it can be
    restarted on the same URL and database), ``labswarm worker`` subprocesses, a broker, a store on disk.

    Args:
        tmp_path: the test's folder (dataset, store, manager home, worker logs).
        broker_url: RabbitMQ's URL, or ``None`` for the embedded SQLite broker.
        tones: clips of 10 s in the dataset (three samples each).
    """

    def __init__(self, tmp_path: Path, broker_url: str | None = None, tones: int = 24) -> None:
        self.tmp_path = tmp_path
        self.broker_url = broker_url
        # a unique experiment (and queue) per test: no test sees another's messages
        self.name = f"t-{uuid.uuid4().hex[:10]}"
        self.data = write_tone_set(tmp_path / "data", tones)
        self.store_root = tmp_path / "store"
        self.config = cluster_config(self.data, self.store_root, self.name)
        self.settings = Settings(home=tmp_path / "home", broker_url=broker_url, reconcile_after=2.0)
        self.port = free_port()
        self.server: EmbeddedServer | None = None
        self.client: ManagerClient | None = None
        self.launcher: LocalLauncher | None = None
        self.session_id: str | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # the manager
    def start_manager(self) -> None:
        """Start a manager on :attr:`url`; a second one resumes the first one's active sessions."""
        self.server = EmbeddedServer(create_app(self.settings), port=self.port).start()
        if self.client is None:
            self.client = ManagerClient(self.url, timeout=30.0)

    def stop_manager(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    # the run
    def start(self, workers: int = 2, rate: float | None = 15.0) -> dict[str, Any]:
        """Start the manager, register the experiment, start the workers and, once they have started their pool
        processes (~3 s of imports), a session publishing at ``rate`` tasks/s (``None``: the manager's default)."""
        self.start_manager()
        self.client.post_experiment(self.config.model_dump(mode="json"))
        # not restarted: these tests kill workers on purpose and check what the others and the ledger do
        # the broker URL through the workers' environment: the manager does not hand out its password
        self.launcher = LocalLauncher(self.name, self.url, broker_url=self.broker_url, log_dir=self.tmp_path / "logs",
                                      restart=None)
        self.launcher.start(workers)
        for worker in self.launcher.processes:
            self.pool_processes(worker)
        session = self.client.start_session(self.name, rate)
        self.session_id = session["id"]
        return session

    def progress(self) -> dict[str, Any]:
        return self.client.session(self.session_id)

    def wait_for(self, predicate: Callable[[dict[str, Any]], bool], what: str,
                 timeout: float = SESSION_TIMEOUT) -> dict[str, Any]:
        """Poll the session's progress until ``predicate(progress)``; fails the test after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            progress = self.progress()
            if predicate(progress):
                return progress
            if progress["status"] in FINAL and progress["status"] != "completed":
                pytest.fail(f"session ended {progress['status']} while waiting for {what}: {progress}")
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}: {progress}\n{self.logs()}")
            time.sleep(0.1)

    def wait_outcomes(self, n: int = 6) -> dict[str, Any]:
        """Wait until ``n`` samples have an outcome (so a kill lands mid-session, with work done and to do)."""
        return self.wait_for(lambda p: p["finished"] >= n, f"{n} outcomes")

    def wait_completed(self, timeout: float = SESSION_TIMEOUT) -> dict[str, Any]:
        return self.wait_for(lambda p: p["status"] in FINAL, "the end of the session", timeout)

    # processes
    def worker_processes(self) -> list[subprocess.Popen]:
        """The workers' main processes that are alive."""
        return [p for p in self.launcher.processes if p.poll() is None]

    def pool_processes(self, worker: subprocess.Popen, timeout: float = 60.0) -> list[psutil.Process]:
        """The prefork pool processes of ``worker`` (its children), waiting until it has started them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            children = psutil.Process(worker.pid).children()
            if children:
                return children
            time.sleep(0.1)
        pytest.fail(f"worker {worker.pid} started no pool process in {timeout:.0f} s\n{self.logs()}")

    def kill_pool_process(self) -> int:
        """kill -9 one pool process of the first worker (its main process starts a new one); returns its pid."""
        child = self.pool_processes(self.worker_processes()[0])[0]
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        return child.pid

    def kill_worker(self) -> int:
        """kill -9 a whole worker (its process group: the main process and its pool); returns its pid."""
        worker = self.worker_processes()[0]
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(10)
        return worker.pid

    def logs(self) -> str:
        """The workers' logs (for failure messages)."""
        folder = self.tmp_path / "logs"
        if not folder.is_dir():
            return ""
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(folder.glob("*")))

    # checks
    def assert_no_loss(self, progress: dict[str, Any], failed: int = 0) -> None:
        """Completed, every sample accounted for once, and the store holds each one's features exactly once."""
        total = progress["total"]
        assert total == 3 * len(list(self.data.glob("*/*.wav")))
        assert progress["status"] == "completed", progress
        assert progress["done"] + progress["cached"] + progress["failed"] == total, progress
        assert progress["failed"] == failed, (progress, self.client.failures(self.session_id))
        assert progress["pending"] == 0
        outputs = len(self.config.features)
        assert FeatureStore(self.store_root).stats().entries == (total - failed) * outputs
        assert sorted(self.store_root.rglob("*.tmp")) == []

    def close(self) -> None:
        """Stop the workers and the manager, and delete the experiment's RabbitMQ queue."""
        try:
            if self.launcher is not None:
                self.launcher.stop(timeout=15.0)
        finally:
            self.stop_manager()
            if self.client is not None:
                self.client.close()
            if self.broker_url and self.broker_url.startswith("amqp"):
                delete_queue(self.broker_url, queue_name(self.name))


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    """A factory of :class:`Cluster` (``make_cluster(broker_url=..., tones=...)``), torn down after the test."""
    clusters: list[Cluster] = []

    def make(broker_url: str | None = None, tones: int = 24) -> Cluster:
        cluster = Cluster(tmp_path, broker_url, tones)
        clusters.append(cluster)
        return cluster

    yield make
    for cluster in clusters:
        cluster.close()
