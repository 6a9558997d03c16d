"""``labswarm run``: an experiment, end to end, on the embedded default or a running cluster.

With no manager URL it starts a manager inside this process (state in SQLite, broker: the embedded SQLite
broker unless ``--broker`` names RabbitMQ) and N local workers; it posts the experiment, starts a session,
follows it to the end, and returns the final progress with the failures. A session that a killed run of the
experiment left running in that manager is taken over instead of a new one (:mod:`labswarm.run.adopt`). What the
run does is a :class:`RunOptions`; what a caller sees of it goes through :class:`RunHooks` (no-op ``on_*`` methods
to override).

Its dashboard (``/ui`` of the embedded manager) can be opened while the run lasts: the manager is closed even on
loopback with a token of this run only, which is written to ``<home>/dashboard-<port>.token``, readable by the
user only (mode 0600, created so), and removed when the run ends (the manager stops with it, and the token with
it); :meth:`RunHooks.on_dashboard` is given the URL and that file, never the token, so the token is on no command
line and in no output or log (``labswarm run`` prints ``dashboard: http://127.0.0.1:PORT/ui (token in PATH)``).
A token of the user's own (``LABSWARM_API_TOKEN``) is not written anywhere: they log in with it.

With ``train``, it then trains the experiment's model as a training job of that same manager (the one it started,
or the one ``manager_url`` names): it submits a manifest naming the registered experiment, with its results store
beside the experiment's feature store (``<store root>/../results``, see
:func:`~labswarm.run.training.job_manifest`), follows the job's event stream to its end (the renderer of
``labswarm jobs submit --follow``) and returns the job, its metrics and where its results store keeps the model.
So the README's first command goes through the jobs service, on the code path of a cluster; ``labswarm train``
stays the plain in-process run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from labswarm.client import ManagerClient
from labswarm.config.experiment import ExperimentConfig
from labswarm.deploy.base import Host
from labswarm.deploy.local import LocalLauncher
from labswarm.deploy.standby import StandbyWorkers
from labswarm.gcpause import collector_paused
from labswarm.run.adopt import RunLock, left_running
from labswarm.run.health import HealthThread, health_figure
from labswarm.run.manager_stop import ManagerStop
from labswarm.run.training import JobTraining, job_manifest, train_job
from labswarm.settings import Settings

if TYPE_CHECKING:
    from labswarm.manager.server import EmbeddedServer

log = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class RunOptions:
    """What a run does (``labswarm run``'s options).

    Attributes:
        workers: local workers to start (0: rely on workers already running against the manager).
        concurrency: pool processes per worker.
        broker_url: broker of the embedded manager (ignored with ``manager_url``); default embedded SQLite.
        manager_url: submit to this running manager instead of starting one.
        rate: publish rate in tasks/s (default: the manager's).
        poll: seconds between progress requests (:meth:`RunHooks.on_progress`).
        log_dir: where local workers write their logs.
        health: run the health controller on the session (rate steered from its first outcome on) and draw
            its figure at the end.
        rabbitmq_api: the RabbitMQ management API for the controller; ``None`` takes depth from the ledger.
        launcher: ``local`` runs ``workers`` supervised worker processes on this machine: the embedded manager
            runs them as the session's launcher (``PUT /sessions/{id}/workers`` scales them), and with
            ``manager_url`` this process does; ``swarm`` asks the manager to run them as a docker swarm service
            (see docs/deployment.md); ``none`` starts none.
        train: after a completed session, train the experiment's model as a job
            (:func:`~labswarm.run.training.job_manifest`).
        retrain: train even when a completed job of the same configuration, data and code exists (by default
            that job, its model and metrics, are reused: :func:`~labswarm.run.training.train_job`).
        follow: the session follows the labels CSV (rows appended are computed as they appear) and runs until
            cancelled: a KeyboardInterrupt (Ctrl-C) during the wait cancels it, then goes on up.
    """

    workers: int = 2
    concurrency: int = 1
    broker_url: str | None = None
    manager_url: str | None = None
    rate: float | None = None
    poll: float = 0.5
    log_dir: Path | None = None
    health: bool = True
    rabbitmq_api: str | None = None
    launcher: str = "local"
    train: bool = False
    retrain: bool = False
    follow: bool = False


class RunHooks:
    """What a caller sees of a run: override the ``on_*`` methods wanted; each does nothing here."""

    def on_dashboard(self, url: str, token_file: Path | None) -> None:
        """Once the manager serves: its dashboard's URL (``http://127.0.0.1:PORT/ui``) and the file that holds
        the token to log in with (mode 0600, removed at the end of the run), or ``None`` when the token is the
        user's own (``LABSWARM_API_TOKEN``, or the one of ``manager_url``'s manager)."""

    def on_resume(self, progress: dict[str, Any]) -> None:
        """A session that a killed run of this experiment left running is taken over instead of a new one
        (:mod:`labswarm.run.adopt`): its progress then."""

    def on_progress(self, progress: dict[str, Any]) -> None:
        """The session's progress (``GET /sessions/{id}``), every :attr:`RunOptions.poll` seconds."""

    def on_session_end(self, result: RunResult) -> None:
        """The session's result (``training`` not yet set) once it ends, before the training job: ``labswarm
        run`` prints the session's summary there. A run that trains no model is already stopping its own manager
        (and its workers) by then: ask that manager nothing here."""

    def on_job_events(self, events: Iterable[dict[str, Any]]) -> None:
        """The training job's event stream (an iterator of ``{id, event, data}`` that ends after its terminal
        status); what this leaves unread is read silently."""


@dataclass
class RunResult:
    """The final progress of a session (see ``GET /sessions/{id}``), its failures, the health figure, and the
    training job when the run trained."""

    progress: dict[str, Any]
    failures: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    figure: Path | None = None
    training: JobTraining | None = None


def run_experiment(config: ExperimentConfig, options: RunOptions | None = None, *, settings: Settings | None = None,
                   hooks: RunHooks | None = None) -> RunResult:
    """Run ``config`` as a session and wait for its end; with ``options.train``, then train its model as a job of
    the same manager (see the module docstring).

    Args:
        config: the experiment (paths absolute, as :func:`~labswarm.config.experiment.load_experiment` gives them).
        options: what the run does; default :class:`RunOptions`.
        settings: settings of the embedded manager (default from the environment).
        hooks: what the caller sees of the run; default none.

    Raises:
        ManagerError: the manager refused the experiment or the job, or cannot be reached.
        ConfigError: the job's manifest is invalid (it names its field).
    """
    options = options or RunOptions()
    settings = settings or Settings()
    # a manager of its own: the experiment's runs on this home one at a time (a session a killed run left
    # running is then this run's to take over, see labswarm.run.adopt), locked before that manager resumes it
    lock = RunLock(settings.home, config.name) if options.manager_url is None else contextlib.nullcontext()
    with contextlib.ExitStack() as stack:
        stack.enter_context(lock)  # first: a run the lock refuses starts nothing
        # the local workers' warm parent imports and warms up while the manager starts, then forks each worker
        # (labswarm.deploy.standby); it ends with the run, once its workers are stopped
        standby = (StandbyWorkers(options.workers, config.model_dump(mode="json"),
                                  log_dir=options.log_dir or settings.home / "logs")
                   if options.launcher == "local" and options.workers > 0 else None)
        if standby is not None:
            stack.callback(standby.close)
        return _run(config, options, settings, hooks or RunHooks(), standby)


def _run(config: ExperimentConfig, options: RunOptions, settings: Settings, hooks: RunHooks,
         standby: StandbyWorkers | None) -> RunResult:
    """:func:`run_experiment`'s run, under its lock, with its ``standby`` workers."""
    started = time.perf_counter()

    def mark(what: str) -> None:  # the run's timeline, in the debug log (issue 27: where a short run's time goes)
        log.debug("run %s: %s at +%.2f s", config.name, what, time.perf_counter() - started)

    server, own_token, manager_url = None, False, options.manager_url
    ended = threading.Event()  # the session ended (embedded manager: told at once; else seen by polling)
    if manager_url is None:
        server, settings, own_token = _embedded_manager(config, options, settings, standby, ended)
        manager_url = server.url
        mark("manager serving")
    local = controller = token_file = None
    manager = ManagerStop(server)  # the run's own manager, stopped once, on every path
    client = ManagerClient(manager_url, settings.api_token)
    primary: BaseException | None = None  # the run's own exception: the manager stop's error never replaces it
    try:
        if server is not None and own_token:
            assert settings.api_token is not None, "_embedded_manager made the manager's own token"
            token_file = write_private(settings.home / DASHBOARD_TOKEN_FILE.format(port=server.port),
                                       settings.api_token)
        hooks.on_dashboard(f"{manager_url.rstrip('/')}/ui", token_file)
        client.post_experiment(config.model_dump(mode="json"))
        session, local = _start_session(client, config.name, options, settings, manager_url, server is None,
                                        hooks, standby=standby)
        mark(f"session {session['id']} started")
        # the run's own loops read its own manager in-process, not over HTTP (labswarm.run.direct, issue 27)
        service = server.app.state.sessions if server is not None else None
        if options.health:
            controller = HealthThread(manager_url, settings.api_token, options.rabbitmq_api,
                                      max(1, options.workers * options.concurrency), settings.home / "health",
                                      service).start()
        # the figure's import: started by the health loop when it first logs (labswarm.run.health.figure_loop)
        progress = _wait(client, session["id"], options.poll, hooks, session.get("follow", options.follow), ended,
                         read=_progress_reader(service) if service is not None else client.session)
        mark(f"session {session['id']} seen {progress['status']}")
        failures = client.failures(session["id"]) if progress["failed"] else []
        drawn, controller = controller, None
        figure = _after_session(drawn, None if options.train else manager, settings.home / "health", session["id"])
        mark("health controller stopped, figure drawn")
        result = RunResult(progress, failures, time.perf_counter() - started, figure)
        hooks.on_session_end(result)
        if local is not None:  # the workers this process ran are done
            local.stop()
            local = None
        if options.train and progress["status"] == "completed":
            result.training = train_job(manager_url, settings.api_token, config, hooks.on_job_events,
                                        retrain=options.retrain)
            result.seconds = time.perf_counter() - started
        return result
    except BaseException as exc:
        primary = exc
        raise
    finally:
        _end_run(controller, local, client, manager, token_file)
        mark("manager and workers stopped")
        manager.raise_error(primary)  # only where the run raised nothing; else a note on the run's own exception


def _end_run(controller: HealthThread | None, local: LocalLauncher | None, client: ManagerClient,
             manager: ManagerStop, token_file: Path | None) -> None:
    """:func:`_run`'s ``finally``: what is still running stopped (the health ``controller``, the ``local`` workers,
    the run's own ``manager``, waited for on every path; its error kept for :meth:`ManagerStop.raise_error`) and
    the dashboard's ``token_file`` removed (the token died with the manager)."""
    if controller is not None:
        controller.stop()
    if local is not None:
        local.stop()
    client.close()
    manager.finish()
    if token_file is not None:
        token_file.unlink(missing_ok=True)


def _after_session(controller: HealthThread | None, manager: ManagerStop | None, health_dir: Path,
                   session_id: str) -> Path | None:
    """Once the session has ended: its health ``controller`` stopped, the run's own ``manager`` (its local workers
    with it) stopping in a thread when the run asks nothing more of it (``None``: its training job needs it), and
    the health figure drawn meanwhile rather than before that stop (issue 27: the end of a short run).

    Returns:
        The figure; ``None`` with no controller, or nothing logged.

    Raises:
        Exception: drawing the figure failed (a truncated log line, a file not written): the stop goes on, the
            run's ``finally`` waits for it.
    """
    if controller is not None:
        controller.stop()
    if manager is not None:
        manager.start()
    return health_figure(health_dir, session_id) if controller is not None else None


def _embedded_manager(config: ExperimentConfig, options: RunOptions, settings: Settings,
                      standby: StandbyWorkers | None = None,
                      ended: threading.Event | None = None) -> tuple[EmbeddedServer, Settings, bool]:
    """Start a manager in this process for ``config``'s run; its local launcher takes the ``standby`` workers
    first, and ``ended`` is set as soon as a session of it completes or fails (its publisher ends it).

    Returns:
        The serving manager, its settings (data roots, broker and token of this run), and whether its token is
        this run's own (generated: no ``LABSWARM_API_TOKEN``).
    """
    from labswarm.auth.tokens import new_token
    from labswarm.config.roots import experiment_folders
    from labswarm.manager.server import EmbeddedServer

    if options.broker_url:
        settings = settings.model_copy(update={"broker_url": options.broker_url})
    # the user runs their own file: the folders it names are data roots of this manager, from any directory
    roots = [*(settings.data_roots or [Path.cwd()]), *experiment_folders(config)]
    if options.train:  # and the folder of its training job's results
        roots.append(Path(job_manifest(config)["results_store"]["path"]))
    settings = settings.model_copy(update={"data_roots": roots})
    own_token = not settings.api_token
    if own_token:
        # closed even on loopback: a token of this run only, for its client, controller and local workers
        # (they get it through their environment, never their command line), and for its dashboard's login
        # (a file of the user's only: see the module)
        settings = settings.model_copy(update={"api_token": new_token()})
    with collector_paused():  # the imports and the app the manager keeps (issue 27: ~0.2 of its ~1 s of CPU)
        from labswarm.manager.api import create_app

        app = create_app(settings)
    # the manager runs the local workers itself (launcher "local"), as it runs a swarm service
    app.state.sessions.launchers.host = Host(concurrency=options.concurrency, log_dir=options.log_dir,
                                             standby=standby)
    if ended is not None:
        app.state.sessions.context.on_end.append(lambda _session_id: ended.set())
    return EmbeddedServer(app).start(), settings, own_token


def _start_session(client: ManagerClient, experiment: str, options: RunOptions, settings: Settings,
                   manager_url: str, remote: bool, hooks: RunHooks, *, standby: StandbyWorkers | None = None
                   ) -> tuple[dict[str, Any], LocalLauncher | None]:
    """Start the experiment's session; a ``remote`` manager cannot start processes here, so with the ``local``
    launcher this process runs and supervises the workers. The manager this run started may hold a session
    that a killed run left running: it is taken over instead (:mod:`labswarm.run.adopt`).

    Returns:
        The session, and the workers this process runs (``None``: the manager runs them, or none).
    """
    if not remote and (left := left_running(client, experiment)) is not None:
        if options.rate is not None:
            client.set_rate(left["id"], options.rate)
        if left["launcher"] == "local" and options.launcher == "local" and options.workers:
            left = client.set_workers(left["id"], options.workers)
        hooks.on_resume(left)
        return left, None
    if options.launcher == "local" and remote:
        session = client.start_session(experiment, options.rate, follow=options.follow)
        if not options.workers:
            return session, None
        local = LocalLauncher(experiment, manager_url, concurrency=options.concurrency, token=settings.api_token,
                              log_dir=options.log_dir or settings.home / "logs", standby=standby)
        try:
            local.start(options.workers)
        except BaseException:  # the ones started stop: the caller never sees this launcher
            local.stop()
            raise
        return session, local
    return client.start_session(experiment, options.rate, launcher=options.launcher, workers=options.workers,
                                follow=options.follow), None


def _progress_reader(service: Any) -> Callable[[str], dict[str, Any]]:
    """A session's progress from the run's own manager's sessions in-process (:mod:`labswarm.run.direct`)."""
    from labswarm.run.direct import ServiceProgress  # with the manager: imported once it runs

    return ServiceProgress(service).session


def _wait(client: ManagerClient, session_id: str, poll: float, hooks: RunHooks, follow: bool = False,
          ended: threading.Event | None = None, started: Callable[[], None] | None = None, *,
          read: Callable[[str], dict[str, Any]] | None = None) -> dict[str, Any]:
    """The session's progress once its status is final, polled every ``poll`` seconds (each given to
    :meth:`RunHooks.on_progress`) or as soon as ``ended`` is set (the embedded manager's publisher ended a
    session: the end is seen at once, not at the next poll); ``started`` is called once, when the first outcomes
    are in (the run's start is over); ``read`` reads the progress (default ``client.session``). A followed
    session ends only when cancelled: a KeyboardInterrupt cancels it (not left active in the manager's
    database), then goes on up."""
    ended, read = ended or threading.Event(), read or client.session
    try:
        while True:
            progress = read(session_id)
            hooks.on_progress(progress)
            if progress["status"] in FINAL:
                return progress
            if started is not None and any(progress.get(k) for k in ("done", "failed", "cached")):
                started()
                started = None
            if ended.wait(poll):
                ended.clear()  # another session's end (none in a run of one experiment) is looked at once
    except KeyboardInterrupt:
        if follow:
            client.cancel(session_id)
        raise
