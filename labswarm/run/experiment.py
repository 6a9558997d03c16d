"""``labswarm run``: an experiment, end to end, on the embedded default or a running cluster.

With no manager URL it starts a manager inside this process (state in SQLite, broker: the embedded SQLite
broker unless ``--broker`` names RabbitMQ) and N local workers; it posts the experiment, starts a session,
follows it to the end, and returns the final progress with the failures.

Its dashboard (``/ui`` of the embedded manager) can be opened while the run lasts: the manager is closed even on
loopback with a token of this run only, which is written to ``<home>/dashboard-<port>.token``, readable by the
user only (mode 0600, created so), and removed when the run ends (the manager stops with it, and the token with
it); ``on_dashboard`` is given the URL and that file, never the token, so the token is on no command line and in
no output or log (``labswarm run`` prints ``dashboard: http://127.0.0.1:PORT/ui (token in PATH)``). A token of
the user's own (``LABSWARM_API_TOKEN``) is not written anywhere: they log in with it.

With ``train``, it then trains the experiment's model as a training job of that same manager (the one it started,
or the one ``manager_url`` names): it submits a manifest naming the registered experiment, with its results store
beside the experiment's feature store (``<store root>/../results``, see :func:`job_manifest`), follows the job's
event stream to its end (the renderer of ``labswarm jobs submit --follow``) and returns the job, its metrics and
where its results store keeps the model. So the README's first command goes through the jobs service, on the
code path of a cluster; ``labswarm train`` stays the plain in-process run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from labswarm.client import ManagerClient
from labswarm.config.experiment import ExperimentConfig
from labswarm.deploy.base import Host
from labswarm.deploy.local import LocalLauncher
from labswarm.settings import Settings

if TYPE_CHECKING:
    from rich.table import Table

#: Session statuses after which nothing more happens.
FINAL = ("completed", "cancelled", "failed")
#: The file, in the run's home, that holds the embedded manager's token while the run lasts (see the module).
DASHBOARD_TOKEN_FILE = "dashboard-{port}.token"


def dashboard_line(url: str, token_file: Path | None) -> str:
    """What ``labswarm run`` prints of its dashboard: ``dashboard: URL (token in PATH)``; with a token of the
    user's own, where it comes from (never the token itself)."""
    where = f"token in {token_file}" if token_file is not None else "log in with your LABSWARM_API_TOKEN"
    return f"dashboard: {url} ({where})"


def write_private(path: Path, text: str) -> Path:
    """Write ``text`` to a new file ``path`` that only the user may read or write (mode 0600 from its creation:
    an old file of that name is removed first, a symlink there is not followed).

    Raises:
        OSError: the file cannot be created or written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        os.write(fd, text.encode("utf-8"))
    finally:
        os.close(fd)
    return path


@dataclass
class JobTraining:
    """The training job of a run, at its end.

    Attributes:
        job: the job as ``GET /v1/jobs/{id}`` shows it (``status``, ``attempts``, ...).
        metrics: its metrics records, each epoch once (the last one is the held-out result).
        model: where its results store keeps the trained model (a path, or ``s3://...``).
    """

    job: dict[str, Any]
    metrics: list[dict[str, Any]]
    model: str

    @property
    def final(self) -> dict[str, Any]:
        """The last epoch's metrics record (``{}`` when none)."""
        return self.metrics[-1] if self.metrics else {}


@dataclass
class RunResult:
    """The final progress of a session (see ``GET /sessions/{id}``), its failures, the health figure, and the
    training job when the run trained."""

    progress: dict[str, Any]
    failures: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    figure: Path | None = None
    training: JobTraining | None = None


def job_manifest(config: ExperimentConfig) -> dict[str, Any]:
    """The training job ``labswarm run`` submits: the registered experiment ``config.name`` with its own training
    settings, one learner, results in ``<store root>/../results`` (beside the feature store the workers share,
    as in ``examples/jobs/music_speech_noise.job.yml``)."""
    results = config.store.root.resolve().parent / "results"
    return {"name": config.name, "description": f"labswarm run {config.name}", "experiment": config.name,
            "results_store": {"name": "local", "path": str(results)}}


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
    train: bool = False,
    follow: Callable[[Iterable[dict[str, Any]]], Any] | None = None,
    on_session_end: Callable[[RunResult], None] | None = None,
    on_dashboard: Callable[[str, Path | None], None] | None = None,
) -> RunResult:
    """Run ``config`` as a session and wait for its end; with ``train``, then train its model as a job of the
    same manager (see the module docstring).

    Args:
        config: the experiment (paths absolute, as :func:`~labswarm.config.experiment.load_experiment` gives them).
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
        train: after a completed session, train the experiment's model as a job (:func:`job_manifest`).
        follow: called with the job's event stream (an iterator of ``{id, event, data}`` that ends after its
            terminal status) and must read it to its end; default: read silently.
        on_session_end: called with the session's result (``training`` not yet set) once it ends, before the
            training job: ``labswarm run`` prints the session's summary there.
        on_dashboard: called once the manager serves, with its dashboard's URL (``http://127.0.0.1:PORT/ui``) and
            the file that holds the token to log in with (mode 0600, removed at the end of the run), or ``None``
            when the token is the user's own (``LABSWARM_API_TOKEN``, or the one of ``manager_url``'s manager).

    Raises:
        ManagerError: the manager refused the experiment or the job, or cannot be reached.
        ConfigError: the job's manifest is invalid (it names its field).
    """
    started = time.perf_counter()
    settings = settings or Settings()
    server = None
    if manager_url is None:
        from labswarm.config.roots import experiment_folders
        from labswarm.manager.api import create_app
        from labswarm.manager.server import EmbeddedServer

        if broker_url:
            settings = settings.model_copy(update={"broker_url": broker_url})
        # the user runs their own file: the folders it names are data roots of this manager, from any directory
        roots = [*(settings.data_roots or [Path.cwd()]), *experiment_folders(config)]
        if train:  # and the folder of its training job's results
            roots.append(Path(job_manifest(config)["results_store"]["path"]))
        settings = settings.model_copy(update={"data_roots": roots})
        own_token = not settings.api_token
        if own_token:
            # closed even on loopback: a token of this run only, for its client, controller and local workers
            # (they get it through their environment, never their command line), and for its dashboard's login
            # (a file of the user's only: see the module)
            from labswarm.auth.tokens import new_token

            settings = settings.model_copy(update={"api_token": new_token()})
        app = create_app(settings)
        # the manager runs the local workers itself (launcher "local"), as it runs a swarm service
        app.state.sessions.launchers.host = Host(concurrency=concurrency, log_dir=log_dir)
        server = EmbeddedServer(app).start()
        manager_url = server.url
    local = None
    controller = None
    token_file = None
    client = ManagerClient(manager_url, settings.api_token)
    try:
        if server is not None and own_token:
            token_file = write_private(settings.home / DASHBOARD_TOKEN_FILE.format(port=server.port),
                                       settings.api_token)
        if on_dashboard is not None:
            on_dashboard(f"{manager_url.rstrip('/')}/ui", token_file)
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
        result = RunResult(progress, failures, time.perf_counter() - started, figure)
        if on_session_end is not None:
            on_session_end(result)
        if local is not None:  # the workers this process ran are done
            local.stop()
            local = None
        if train and progress["status"] == "completed":
            result.training = train_job(manager_url, settings.api_token, config, follow)
            result.seconds = time.perf_counter() - started
        return result
    finally:
        if controller is not None:
            controller.stop()
        if local is not None:
            local.stop()
        client.close()
        if server is not None:
            server.stop()
        if token_file is not None:  # the token died with the manager
            token_file.unlink(missing_ok=True)


def train_job(manager_url: str, token: str | None, config: ExperimentConfig,
              follow: Callable[[Iterable[dict[str, Any]]], Any] | None = None) -> JobTraining:
    """Submit the training job of ``config`` (registered on the manager) and follow it to its end.

    Args:
        manager_url: the manager.
        token: its API token.
        config: the experiment.
        follow: reads the job's event stream to its end (see :func:`run_experiment`); default: read silently.

    Returns:
        The job at its end (completed or failed), its metrics and where its model is (or would be).

    Raises:
        ManagerError: the manager refused the job or cannot be reached.
    """
    from labswarm.jobs.client.client import JobsClient
    from labswarm.jobs.spec.layout import MODEL_KEY, job_storage

    manifest = job_manifest(config)
    with JobsClient(manager_url, token) as jobs:
        job = jobs.submit(manifest)
        events = jobs.events(job["id"])
        if follow is not None:
            follow(events)
        for _ in events:  # to the terminal status, whatever ``follow`` left
            pass
        shown = jobs.show(job["id"])
        metrics = jobs.metrics(job["id"])
    return JobTraining(shown, metrics, job_storage(manifest["results_store"], job["id"]).describe(MODEL_KEY))


def training_table(experiment: str, final: dict[str, Any], model: str | Path, *, resumed_from: int = 0,
                   job: str | None = None) -> Table:
    """The held-out result of a training (``labswarm train``'s, or ``labswarm run``'s job's) as a table: accuracy,
    F1 per class, validation samples, epochs, and where the model is.

    Args:
        experiment: the experiment's name (the title).
        final: the last epoch's metrics record.
        model: where the trained model is.
        resumed_from: the epochs a resumed training started after (0: from scratch).
        job: the training job's id, when a job trained it.
    """
    from rich.table import Table

    table = Table(title=f"{experiment}: held-out accuracy (validation sources unseen in training)",
                  show_header=False)
    table.add_row("accuracy", f"{final.get('val_accuracy', float('nan')):.3f}")
    for name, f1 in (final.get("val_f1") or {}).items():
        table.add_row(f"F1 {name}", "n/a (no validation sample)" if f1 is None else f"{f1:.3f}")
    table.add_row("validation samples", str(final.get("val_samples", 0)))
    table.add_row("epochs", f"{final.get('epoch')} (resumed after {resumed_from})" if resumed_from
                  else str(final.get("epoch")))
    if job is not None:
        table.add_row("job", job)
    table.add_row("model", str(model))
    return table


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
