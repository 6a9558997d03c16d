"""``labswarm run``: an experiment, end to end, on the embedded default or a running cluster.

With no manager URL it starts a manager inside this process (state in SQLite, broker: the embedded SQLite
broker unless ``--broker`` names RabbitMQ) and N local workers; it posts the experiment, starts a session,
follows it to the end, and returns the final progress with the failures.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labswarm.client import ManagerClient
from labswarm.config import ExperimentConfig
from labswarm.deploy.local import LocalLauncher
from labswarm.settings import Settings

#: Session statuses after which nothing more happens.
FINAL = ("completed", "cancelled", "failed")


@dataclass
class RunResult:
    """The final progress of a session (see ``GET /sessions/{id}``) and its failures."""

    progress: dict[str, Any]
    failures: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0


def run_experiment(
    config: ExperimentConfig,
    *,
    workers: int = 2,
    concurrency: int = 1,
    broker_url: str | None = None,
    manager_url: str | None = None,
    rate: float | None = None,
    settings: Settings | None = None,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    poll: float = 0.5,
    log_dir: Path | None = None,
) -> RunResult:
    """Run ``config`` as a session and wait for its end.

    Args:
        config: the experiment (paths absolute, as :func:`~labswarm.config.load_experiment` gives them).
        workers: local workers to start (0: rely on workers already running against the manager).
        concurrency: pool processes per worker.
        broker_url: broker of the embedded manager (ignored with ``manager_url``); default embedded SQLite.
        manager_url: submit to this running manager instead of starting one.
        rate: publish rate in tasks/s (default: the manager's).
        settings: settings of the embedded manager (default from the environment).
        on_progress: called with the progress every ``poll`` seconds.
        poll: seconds between progress requests.
        log_dir: where local workers write their logs.

    Raises:
        ManagerError: the manager refused the experiment or cannot be reached.
    """
    started = time.perf_counter()
    settings = settings or Settings()
    server = None
    if manager_url is None:
        from labswarm.manager.api import create_app
        from labswarm.manager.server import EmbeddedServer

        if broker_url:
            settings = settings.model_copy(update={"broker_url": broker_url})
        server = EmbeddedServer(create_app(settings)).start()
        manager_url = server.url
    launcher = None
    client = ManagerClient(manager_url, settings.api_token)
    try:
        client.post_experiment(config.model_dump(mode="json"))
        session = client.start_session(config.name, rate)
        if workers:
            launcher = LocalLauncher(config.name, manager_url, concurrency=concurrency, token=settings.api_token,
                                     log_dir=log_dir or settings.home / "logs")
            launcher.start(workers)
        while True:
            progress = client.session(session["id"])
            if on_progress is not None:
                on_progress(progress)
            if progress["status"] in FINAL:
                break
            time.sleep(poll)
        failures = client.failures(session["id"]) if progress["failed"] else []
        return RunResult(progress, failures, time.perf_counter() - started)
    finally:
        if launcher is not None:
            launcher.stop()
        client.close()
        if server is not None:
            server.stop()
