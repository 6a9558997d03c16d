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
from labswarm.deploy.base import Host
from labswarm.deploy.local import LocalLauncher
from labswarm.settings import Settings

#: Session statuses after which nothing more happens.
FINAL = ("completed", "cancelled", "failed")


@dataclass
class RunResult:
    """The final progress of a session (see ``GET /sessions/{id}``), its failures, and the health figure."""

    progress: dict[str, Any]
    failures: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    figure: Path | None = None


class HealthThread:
    """The health controller's loop in a thread of this process (``labswarm run`` steers its own session).

    Args:
        manager_url: the manager.
        token: its API token.
        rabbitmq_api: the RabbitMQ management API, or ``None`` to take depth from the ledger.
        consumers: worker processes (ledger mode).
        log_dir: where decisions are logged.
    """

    def __init__(self, manager_url: str, token: str | None, rabbitmq_api: str | None, consumers: int,
                 log_dir: Path) -> None:
        import asyncio
        import threading

        self._asyncio = asyncio
        self.log_dir = log_dir
        self._args = (manager_url, token, rabbitmq_api, consumers)
        self._loop = asyncio.new_event_loop()
        self._stop: Any = None
        self._thread = threading.Thread(target=self._run, name="labswarm-health", daemon=True)

    def _run(self) -> None:
        from labswarm.health.loop import HealthLoop
        from labswarm.health.monitors import ManagerMonitor, RabbitMQMonitor

        manager_url, token, rabbitmq_api, consumers = self._args
        asyncio = self._asyncio
        asyncio.set_event_loop(self._loop)

        async def main() -> None:
            self._stop = asyncio.Event()
            loop = HealthLoop(ManagerMonitor(manager_url, token),
                              RabbitMQMonitor(rabbitmq_api) if rabbitmq_api else None,
                              consumers=consumers, log_dir=self.log_dir)
            try:
                await loop.run(self._stop)
            finally:
                await loop.manager.aclose()
                if loop.rabbitmq is not None:
                    await loop.rabbitmq.aclose()

        self._loop.run_until_complete(main())
        self._loop.close()

    def start(self) -> HealthThread:
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


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
    health: bool = True,
    rabbitmq_api: str | None = None,
    launcher: str = "local",
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
        health: run the health controller on the session (rate steered from its first outcome on) and draw
            its figure at the end.
        rabbitmq_api: the RabbitMQ management API for the controller; ``None`` takes depth from the ledger.
        launcher: ``local`` runs ``workers`` supervised worker processes on this machine: the embedded manager
            runs them as the session's launcher (``PUT /sessions/{id}/workers`` scales them), and with
            ``manager_url`` this process does; ``swarm`` asks the manager to run them as a docker swarm service
            (see docs/deployment.md); ``none`` starts none.

    Raises:
        ManagerError: the manager refused the experiment or cannot be reached.
    """
    started = time.perf_counter()
    settings = settings or Settings()
    server = None
    if manager_url is None:
        from labswarm.manager.api import create_app
        from labswarm.manager.server import EmbeddedServer
        from labswarm.paths import experiment_folders

        if broker_url:
            settings = settings.model_copy(update={"broker_url": broker_url})
        # the user runs their own file: the folders it names are data roots of this manager, from any directory
        roots = [*(settings.data_roots or [Path.cwd()]), *experiment_folders(config)]
        settings = settings.model_copy(update={"data_roots": roots})
        if not settings.api_token:
            # closed even on loopback: a token of this run only, for its client, controller and local workers
            # (they get it through their environment, never their command line)
            from labswarm.manager.tokens import new_token

            settings = settings.model_copy(update={"api_token": new_token()})
        app = create_app(settings)
        # the manager runs the local workers itself (launcher "local"), as it runs a swarm service
        app.state.sessions.launchers.host = Host(concurrency=concurrency, log_dir=log_dir)
        server = EmbeddedServer(app).start()
        manager_url = server.url
    local = None
    controller = None
    client = ManagerClient(manager_url, settings.api_token)
    try:
        client.post_experiment(config.model_dump(mode="json"))
        if launcher == "local" and server is None:
            # a remote manager cannot start processes here: this process runs and supervises them
            session = client.start_session(config.name, rate)
            if workers:
                local = LocalLauncher(config.name, manager_url, concurrency=concurrency, token=settings.api_token,
                                      log_dir=log_dir or settings.home / "logs")
                local.start(workers)
        else:
            session = client.start_session(config.name, rate, launcher=launcher, workers=workers)
        if health:
            controller = HealthThread(manager_url, settings.api_token, rabbitmq_api, max(1, workers * concurrency),
                                      settings.home / "health").start()
        while True:
            progress = client.session(session["id"])
            if on_progress is not None:
                on_progress(progress)
            if progress["status"] in FINAL:
                break
            time.sleep(poll)
        failures = client.failures(session["id"]) if progress["failed"] else []
        figure = None
        if controller is not None:
            controller.stop()
            controller = None
            figure = _figure(settings.home / "health", session["id"])
        return RunResult(progress, failures, time.perf_counter() - started, figure)
    finally:
        if controller is not None:
            controller.stop()
        if local is not None:
            local.stop()
        client.close()
        if server is not None:
            server.stop()


def _figure(log_dir: Path, session_id: str) -> Path | None:
    """The session's health figure, when the controller logged decisions (a run all cached logs none)."""
    from labswarm.errors import LabswarmError
    from labswarm.health.plot import plot_session

    log = log_dir / f"health-{session_id}.jsonl"
    if not log.is_file():
        return None
    try:
        return plot_session(log, log.with_suffix(".png"), title=f"session {session_id}")
    except LabswarmError:
        return None
