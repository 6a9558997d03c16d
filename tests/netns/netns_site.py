"""The multi-host reliability tests' site: labswarm spread over the hosts of a
:class:`labswarm.netns.Cluster` (the manager a ``labswarm manager`` process on one host, ``labswarm worker``
processes on others, RabbitMQ the machine's own, reached through the gateway ``198.18.0.1``).

RabbitMQ lets its ``guest`` user in from loopback only; the hosts come from 198.18.0.x, so the tests make a user
of their own for the session (``rabbitmqctl add_user``) and delete it at the end. The broker is watched through
its management API (consumers by peer address), as an operator would; a queue's backlog by a passive declare.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import SR, delete_queue, experiment_dict, write_tone_set

from labswarm.client import ManagerClient
from labswarm.config.experiment import ExperimentConfig, parse_experiment
from labswarm.netns import GATEWAY, Cluster
from labswarm.queue.app import queue_name
from labswarm.run import FINAL
from labswarm.store import FeatureStore

RABBITMQCTL = "/usr/sbin/rabbitmqctl"
#: The machine's RabbitMQ as the test process (root namespace) reaches it, and its management API.
LOCAL_BROKER, MANAGEMENT = "127.0.0.1:5672", "http://127.0.0.1:15672/api"
#: The manager's port on its host (each host has its own ports: nothing else listens there).
MANAGER_PORT = 8000
#: Seconds a phase may take on the loaded shared machine before the test counts it as stuck (generous: the
#: conditions are waited on, these only bound a hang).
STARTUP_TIMEOUT, SESSION_TIMEOUT = 180.0, 420.0


def wait_until(predicate: Callable[[], Any], what: str, timeout: float, logs: Callable[[], str] = str) -> Any:
    """Poll ``predicate`` (every 0.2 s) until it returns something true, and return that; fails the test after
    ``timeout`` s naming ``what`` (with ``logs()``)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n{logs()}")
        time.sleep(0.2)


class Site:
    """One experiment run by labswarm's real processes spread over a cluster's hosts.

    Args:
        cluster: a started cluster with ``gateway=True`` (the hosts reach RabbitMQ at :data:`GATEWAY`).
        tmp_path: the test's folder (dataset, store, the manager's home and database, logs): one filesystem
            for every host, as NFS would give.
        user: the RabbitMQ user and password (:func:`broker_user`).
        heartbeat: every process's AMQP heartbeat timeout (``LABSWARM_BROKER_HEARTBEAT``), in s.
        tones: 10-s clips in the dataset (three samples each).
        env: more environment for every process of the site (e.g. ``LABSWARM_SAMPLES_PER_MESSAGE``).
    """

    def __init__(self, cluster: Cluster, tmp_path: Path, user: tuple[str, str], heartbeat: float = 4.0,
                 tones: int = 24, env: dict[str, str] | None = None) -> None:
        self.cluster, self.tmp_path = cluster, tmp_path
        self.name = f"n-{uuid.uuid4().hex[:10]}"
        self.queue = queue_name(self.name)
        self.data = write_tone_set(tmp_path / "data", tones)
        self.store_root = tmp_path / "store"
        self.config = _config(self.data, self.store_root, self.name)
        self.token = uuid.uuid4().hex
        self.home = tmp_path / "home"
        self.logs_dir = tmp_path / "logs"
        self.logs_dir.mkdir()
        self.broker_url = f"amqp://{user[0]}:{user[1]}@{GATEWAY}:5672//"
        self.env = {**os.environ, "LABSWARM_API_TOKEN": self.token, "LABSWARM_BROKER_URL": self.broker_url,
                    "LABSWARM_BROKER_HEARTBEAT": str(heartbeat), "LABSWARM_HOME": str(self.home),
                    "LABSWARM_RECONCILE_AFTER": "2", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                    "MKL_NUM_THREADS": "1", **(env or {})}
        self.manager_url: str | None = None
        self.client: ManagerClient | None = None
        self.session_id: str | None = None
        self.processes: dict[str, subprocess.Popen[Any]] = {}

    # processes on the hosts
    def _popen(self, host: str, role: str, argv: list[str]) -> subprocess.Popen[Any]:
        with open(self.logs_dir / f"{role}-{host}.log", "ab") as out:
            proc = self.cluster.popen(host, argv, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        self.processes[f"{role}-{host}"] = proc
        return proc

    def start_manager(self, host: str) -> ManagerClient:
        """``labswarm manager`` on ``host``; returns a client of it once it answers, the experiment posted."""
        address = self.cluster.address(host)
        self._popen(host, "manager", [sys.executable, "-m", "labswarm.cli", "manager", "--host", address,
                                      "--port", str(MANAGER_PORT)])
        self.manager_url = f"http://{address}:{MANAGER_PORT}"
        self.client = ManagerClient(self.manager_url, self.token, timeout=60.0)
        wait_until(self._manager_answers, f"the manager on {host}", STARTUP_TIMEOUT, self.logs)
        self.client.post_experiment(self.config.model_dump(mode="json"))
        return self.client

    def _manager_answers(self) -> bool:
        try:
            return httpx.get(f"{self.manager_url}/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def start_worker(self, host: str) -> None:
        """``labswarm worker`` (one pool process) on ``host``, consuming the experiment's queue."""
        assert self.manager_url is not None, "start the manager first"
        self._popen(host, "worker", [sys.executable, "-m", "labswarm.cli", "worker", "--experiment", self.name,
                                     "--manager", self.manager_url, "--concurrency", "1"])

    def logs(self) -> str:
        """The processes' logs, their last 3,000 characters each (for failure messages)."""
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(self.logs_dir.glob("*.log")))

    # the session
    def start_session(self, rate: float | None = None) -> dict[str, Any]:
        assert self.client is not None
        session = self.client.start_session(self.name, rate)
        self.session_id = session["id"]
        return session

    def progress(self) -> dict[str, Any]:
        assert self.client is not None and self.session_id is not None
        return self.client.session(self.session_id)

    def wait_for(self, predicate: Callable[[dict[str, Any]], bool], what: str,
                 timeout: float = SESSION_TIMEOUT) -> dict[str, Any]:
        """Poll the session's progress until ``predicate(progress)``; fails after ``timeout`` s, or when the
        session ends otherwise than completed."""
        def check() -> dict[str, Any] | None:
            progress = self.progress()
            if progress["status"] in FINAL and progress["status"] != "completed":
                pytest.fail(f"session ended {progress['status']} waiting for {what}: {progress}\n{self.logs()}")
            return progress if predicate(progress) else None

        return wait_until(check, what, timeout, self.logs)

    def wait_completed(self) -> dict[str, Any]:
        return self.wait_for(lambda p: p["status"] in FINAL, "the end of the session")

    # the broker, as its management API sees it
    def _api(self, path: str) -> Any:
        response = httpx.get(f"{MANAGEMENT}{path}", auth=("guest", "guest"), timeout=30)
        response.raise_for_status()
        return response.json()

    def consumers(self) -> set[str]:
        """The addresses of the hosts consuming the experiment's queue now."""
        # a consumer whose channel is closing has its channel_details as an empty list: not counted
        return {c["channel_details"]["peer_host"] for c in self._api("/consumers/%2F")
                if c["queue"]["name"] == self.queue and isinstance(c.get("channel_details"), dict)}

    def unacknowledged(self, address: str) -> int | None:
        """Messages the broker has delivered to the consumers of the host at ``address`` and not yet had
        acknowledged, counted now by the broker itself (``rabbitmqctl list_channels``: the channel processes'
        own counts, where the management API's lag by its statistics interval); ``None`` when that host has no
        consuming channel open at the broker (it was dropped already: nothing can be said of what it held)."""
        out = subprocess.run([RABBITMQCTL, "list_channels", "name", "consumer_count", "messages_unacknowledged",
                              "--formatter", "json", "-q"], check=True, capture_output=True, text=True,
                             timeout=120).stdout
        # a channel's name is "PEER:PORT -> BROKER:PORT (N)"
        mine = [c for c in json.loads(out) if c["name"].startswith(f"{address}:") and c["consumer_count"] > 0]
        return sum(int(c["messages_unacknowledged"]) for c in mine) if mine else None

    def backlog(self) -> int:
        """Messages waiting in the queue now, none of them delivered (a passive declare: the broker's count at
        this instant, where the management API's lags by its statistics interval)."""
        from kombu import Connection

        with Connection(f"amqp://guest:guest@{LOCAL_BROKER}//", connect_timeout=10) as conn:
            return int(conn.default_channel.queue_declare(self.queue, passive=True).message_count)

    # checks
    def ledger(self) -> list[tuple[str, str, int]]:
        """The session's ledger rows, read from the manager's database: (sample id, status, attempts)."""
        with sqlite3.connect(self.home / "manager.sqlite") as db:
            return db.execute("SELECT sample_id, status, attempts FROM samples WHERE session_id = ?",
                              (self.session_id,)).fetchall()

    def assert_each_sample_done_once(self, progress: dict[str, Any]) -> None:
        """Completed; the ledger holds each sample once, done (``cached``: a second delivery found the first one's
        features in the store, e.g. a cut worker's, computed before its link went); the store each sample's
        features once."""
        total = 3 * len(list(self.data.glob("*/*.wav")))
        assert progress["status"] == "completed", progress
        assert progress["total"] == total and progress["done"] + progress["cached"] == total, progress
        assert progress["failed"] == progress["pending"] == 0, progress
        rows = self.ledger()
        assert len(rows) == len({r[0] for r in rows}) == total
        assert {r[1] for r in rows} <= {"done", "cached"}
        assert FeatureStore(self.store_root).stats().entries == total * len(self.config.features)
        assert sorted(self.store_root.rglob("*.tmp")) == []

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        delete_queue(f"amqp://guest:guest@{LOCAL_BROKER}//", self.queue)


def _config(data: Path, store: Path, name: str) -> ExperimentConfig:
    """Three transformations (one of them slow) and two features per 10-s clip (tests/queue's experiment)."""
    return parse_experiment(experiment_dict(
        data, store, name=name,
        dataset={"root": str(data), "sample_rate": SR, "segment": {"start": 0.0, "duration": 10.0}},
        transformations=[{"name": "identity"}, {"name": "pitch_shift", "semitones": 2},
                         {"name": "time_stretch", "rate": 1.25}],
        features=[{"name": "mel"}, {"name": "mfcc"}],
    ))


