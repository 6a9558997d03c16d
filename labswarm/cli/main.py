"""The ``labswarm`` command line (typer + rich)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from labswarm.cli.compare import compare_command
from labswarm.cli.jobs import jobs_app
from labswarm.cli.output import console, err, print_session
from labswarm.cli.output import fail as _fail
from labswarm.cli.predict import predict_command
from labswarm.cli.sessions import sessions_app
from labswarm.cli.tokens import tokens_app
from labswarm.errors import ConfigError, LabswarmError

app = typer.Typer(help="Distribute the feature computation of audio deep-learning experiments.", no_args_is_help=True)
app.add_typer(sessions_app, name="sessions")
app.add_typer(jobs_app, name="jobs")
app.add_typer(tokens_app, name="tokens")
app.command("predict")(predict_command)
app.command("compare")(compare_command)


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]:>7.1f} samples/s"),
        TextColumn("[red]{task.fields[failed]} failed"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )


@app.command("demo-data")
def demo_data(
    out_dir: Annotated[Path, typer.Argument(help="Folder to write <label>/*.wav and labels.csv into.")],
    per_class: Annotated[int, typer.Option(min=1, help="Clips per class (music, speech, noise).")] = 100,
    seed: Annotated[int, typer.Option(help="Seed: the same seed builds the same set.")] = 0,
    jobs: Annotated[int, typer.Option(min=1, help="Worker processes.")] = 2,
    force: Annotated[bool, typer.Option(help="Rebuild even if DIR already holds this exact set.")] = False,
) -> None:
    """Build the music / speech / noise demo set of 10-s clips from audio that Debian packages carry.

    An existing identical set (same --per-class and --seed) is kept as it is, so its features stay cached.
    """
    from labswarm.datasets.demo import build_demo_set

    with _progress() as progress:
        task = progress.add_task("demo set", total=3 * per_class, rate=0.0, failed=0)

        def update(done: int, total: int) -> None:
            elapsed = progress.tasks[task].elapsed or 1e-9
            progress.update(task, completed=done, total=total, rate=done / elapsed)

        try:
            summary = build_demo_set(out_dir, per_class=per_class, seed=seed, jobs=jobs, progress=update,
                                     force=force)
        except LabswarmError as exc:
            raise _fail(exc) from None
    counts = ", ".join(f"{label} {n} ({summary.n_sources[label]} sources)" for label, n in summary.counts.items())
    how = "already built, kept" if summary.reused else f"built in {summary.seconds:.1f} s"
    console.print(f"demo set in [bold]{summary.out_dir}[/]: {counts}; {how}")


@app.command()
def features(
    experiment: Annotated[Path, typer.Argument(help="Experiment YAML file.")],
    jobs: Annotated[int | None, typer.Option(min=1, help="Worker processes (default: all cores).")] = None,
) -> None:
    """Compute every sample × transformation of an experiment on this machine (skips what the store has)."""
    from labswarm.config.experiment import load_experiment
    from labswarm.local import run_local
    from labswarm.sample import count_samples

    try:
        config = load_experiment(experiment)
        total = count_samples(config)
    except ConfigError as exc:
        raise _fail(exc, 2) from None
    except LabswarmError as exc:
        raise _fail(exc) from None
    with _progress() as progress:
        task = progress.add_task(config.name, total=total, rate=0.0, failed=0)
        state = {"done": 0, "failed": 0}

        def update(result) -> None:
            state["done"] += 1
            state["failed"] += result.status == "failed"
            elapsed = progress.tasks[task].elapsed or 1e-9
            progress.update(task, completed=state["done"], rate=state["done"] / elapsed, failed=state["failed"])

        try:
            summary = run_local(config, jobs, on_result=update)
        except LabswarmError as exc:
            raise _fail(exc) from None
    print_summary(summary)
    if summary.failed == summary.total and summary.total:
        raise typer.Exit(1)


@app.command()
def run(
    experiment: Annotated[Path, typer.Argument(help="Experiment YAML file.")],
    workers: Annotated[int, typer.Option(min=0, help="Local workers to start (0: use running ones).")] = 2,
    concurrency: Annotated[int, typer.Option(min=1, help="Pool processes per worker.")] = 1,
    broker: Annotated[str | None, typer.Option(help="Broker URL (amqp://...); default: embedded SQLite.")] = None,
    manager: Annotated[str | None, typer.Option(help="Submit to this running manager instead.")] = None,
    rate: Annotated[float | None, typer.Option(min=0.001, help="Initial publish rate in tasks/s.")] = None,
    health: Annotated[bool, typer.Option(help="Steer the publish rate with the health controller.")] = True,
    rabbitmq_api: Annotated[str | None, typer.Option(envvar="LABSWARM_RABBITMQ_API", help="RabbitMQ management API "
                                                     "for the controller (default: queue depth from the session "
                                                     "ledger).")] = None,
    launcher: Annotated[str, typer.Option(help="Who runs the workers: local (supervised processes on this machine), "
                                          "swarm (a docker swarm service the manager creates; needs --manager), "
                                          "none.")] = "local",
    train: Annotated[bool, typer.Option("--train/--no-train", help="Train after computing, when the experiment "
                                        "has a `training` section.")] = True,
) -> None:
    """Run an experiment distributed over workers (embedded manager and broker unless URLs are given); then,
    when the experiment has a `training` section, train its model on the features."""
    config = _load(experiment)
    if launcher not in ("local", "swarm", "none"):
        raise _fail(ConfigError([("--launcher", f"unknown launcher {launcher!r}; known: local, none, swarm")]), 2)
    _compute(config, workers=workers, concurrency=concurrency, broker=broker, manager=manager, rate=rate,
             health=health, rabbitmq_api=rabbitmq_api, launcher=launcher,
             train=train and config.training is not None)  # as a job of the same manager (labswarm.run)


@app.command()
def train(
    experiment: Annotated[Path, typer.Argument(help="Experiment YAML file with `model` and `training` sections.")],
    resume: Annotated[bool, typer.Option(help="Continue after the last checkpoint of this configuration.")] = False,
    compute: Annotated[bool, typer.Option(help="First compute the features missing from the store, through the "
                                          "distributed run (embedded default).")] = True,
    workers: Annotated[int, typer.Option(min=0, help="Local workers for the missing features.")] = 2,
) -> None:
    """Train the experiment's model on its features: per-epoch metrics as JSON lines, a checkpoint every epoch
    (resume with --resume), the trained model saved under the experiment's name and configuration hash."""
    config = _load(experiment)
    if config.training is None:
        raise _fail(ConfigError([("training", "missing: add `model` and `training` sections to train")]), 2)
    if compute:
        _compute(config, workers=workers)
    _train(config, resume=resume)


def _load(path: Path):
    from labswarm.config.experiment import load_experiment

    try:
        return load_experiment(path)
    except ConfigError as exc:
        raise _fail(exc, 2) from None


def _compute(config, *, workers: int = 2, concurrency: int = 1, broker: str | None = None,
             manager: str | None = None, rate: float | None = None, health: bool = True,
             rabbitmq_api: str | None = None, launcher: str = "local", train: bool = False) -> None:
    """The features of every sample into the store, as a session (exits non-zero unless it completes); with
    ``train``, then the model as a training job of the same manager, followed live (exits 1 unless it completes)."""
    from labswarm.jobs.client.follow import follow
    from labswarm.run import RunHooks, RunOptions, dashboard_line, run_experiment, training_table
    from labswarm.settings import load_settings

    _warn_password("--broker", broker, "LABSWARM_BROKER_URL")
    _warn_password("--rabbitmq-api", rabbitmq_api, "LABSWARM_RABBITMQ_API")
    settings = load_settings()
    options = RunOptions(workers=workers, concurrency=concurrency, broker_url=broker, manager_url=manager, rate=rate,
                         health=health, rabbitmq_api=rabbitmq_api, launcher=launcher, train=train)
    with _progress() as progress:
        task = progress.add_task(config.name, total=None, rate=0.0, failed=0)

        class Shown(RunHooks):  # what the console shows of the run
            def on_dashboard(self, url, token_file) -> None:
                console.print(dashboard_line(url, token_file))

            def on_progress(self, p: dict) -> None:
                progress.update(task, total=p["total"], completed=p["finished"], rate=p["samples_per_s"],
                                failed=p["failed"])

            def on_session_end(self, result) -> None:
                progress.stop()
                print_session(result.progress, result.failures, result.seconds)
                if result.figure is not None:
                    console.print(f"health figure (queue depth; publish vs consume rate): {result.figure}")

            def on_job_events(self, events) -> None:
                follow(events, console)

        try:
            result = run_experiment(config, options, settings=settings, hooks=Shown())
        except LabswarmError as exc:
            raise _fail(exc) from None
    if result.progress["status"] != "completed":
        raise typer.Exit(1)
    if result.training is not None:
        job = result.training.job
        console.print(training_table(config.name, result.training.final, result.training.model, job=job["id"]))
        if job["status"] != "completed":
            raise _fail(LabswarmError(f"training job {job['id']} {job['status']}: {job.get('reason') or ''}"))


def _train(config, *, resume: bool) -> None:
    """Train the experiment's model, printing one line per epoch and the held-out result."""
    from labswarm.jobs.client.follow import epoch_line
    from labswarm.run import training_table
    from labswarm.settings import load_settings
    from labswarm.train.trainer import Trainer

    def show(r: dict) -> None:
        console.print(epoch_line(r), highlight=False)

    try:
        trainer = Trainer(config, load_settings().home, on_epoch=show)
        console.print(f"training {config.model.name} on {config.model.input} for {config.training.epochs} epochs; "
                      f"metrics: {trainer.metrics_path}")
        result = trainer.fit(resume=resume)
    except (LabswarmError, ImportError) as exc:
        raise _fail(exc if isinstance(exc, LabswarmError) else LabswarmError(str(exc))) from None
    console.print(training_table(config.name, result.final, result.model_path, resumed_from=result.resumed_from))


@app.command()
def worker(
    experiment: Annotated[list[str], typer.Option(help="Experiment whose queue to consume (repeat for several).")],
    manager: Annotated[str, typer.Option(help="Manager URL.")],
    broker: Annotated[str | None, typer.Option(help="Broker URL without a password (default: LABSWARM_BROKER_URL, "
                                               "else the manager's embedded broker).")] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Pool processes.")] = 1,
    loglevel: Annotated[str, typer.Option(help="Celery log level.")] = "WARNING",
) -> None:
    """Run a Celery worker on experiments' queues (fetches their configurations from the manager). The broker URL
    and the API token come from the environment (LABSWARM_BROKER_URL, LABSWARM_API_TOKEN, or their *_FILE)."""
    from labswarm.queue.worker import run_worker
    from labswarm.settings import load_settings

    _warn_password("--broker", broker, "LABSWARM_BROKER_URL")
    try:
        run_worker(experiment, manager, broker_url=broker, concurrency=concurrency,
                   token=load_settings().api_token, loglevel=loglevel)
    except LabswarmError as exc:
        raise _fail(exc) from None


@app.command("manager")
def manager_cmd(
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    broker: Annotated[str | None, typer.Option(help="Broker URL (default: LABSWARM_BROKER_URL or embedded).")] = None,
    database: Annotated[str | None, typer.Option(help="SQLAlchemy URL of the state database.")] = None,
) -> None:
    """Serve the manager API (OpenAPI docs at /docs). Sessions started with `launcher: local` run their workers
    on this machine; they stop with the manager. Every endpoint but /health needs LABSWARM_API_TOKEN (or a token
    of LABSWARM_TOKENS_FILE): without one, a manager on a non-loopback --host generates one and prints it once."""
    from labswarm.auth.authenticator import ensure_token
    from labswarm.manager.api import create_app
    from labswarm.manager.server import serve
    from labswarm.settings import load_settings

    _warn_password("--broker", broker, "LABSWARM_BROKER_URL")
    _warn_password("--database", database, "LABSWARM_DATABASE_URL")
    try:
        # no token on a non-loopback address: one is generated and printed once (on stderr)
        settings = ensure_token(load_settings(broker_url=broker, database_url=database), host)
        app = create_app(settings)
        if app.state.auth.open:
            err.print("note: no API token (LABSWARM_API_TOKEN, LABSWARM_TOKENS_FILE): this manager answers clients "
                      "on this machine only, every local user included", highlight=False)
        serve(app, host, port)
    except LabswarmError as exc:
        raise _fail(exc) from None


def _warn_password(option: str, url: str | None, variable: str) -> None:
    """Warn that a URL given on the command line shows its password to every user (``ps``)."""
    from labswarm.redact import has_password, redact_url

    if has_password(url):
        err.print(f"[bold yellow]warning:[/] {option} {redact_url(url)} carries a password, which `ps` shows to "
                  f"every user of this machine: set {variable} (or {variable}_FILE) instead", highlight=False)


HEALTH_LOGS = Path(".labswarm/health")
health_app = typer.Typer(help="The health controller: steer every session's publish rate.")
app.add_typer(health_app, name="health")


@health_app.callback(invoke_without_command=True)
def health(
    ctx: typer.Context,
    manager: Annotated[str | None, typer.Option(help="Manager URL.")] = None,
    rabbitmq_api: Annotated[str | None, typer.Option(envvar="LABSWARM_RABBITMQ_API", help="RabbitMQ management "
                                                     "API, e.g. http://guest:guest@localhost:15672 (its password: "
                                                     "better in LABSWARM_RABBITMQ_API than here, where ps shows "
                                                     "it); none: ledger only.")] = None,
    rabbitmq_api_file: Annotated[Path | None, typer.Option(envvar="LABSWARM_RABBITMQ_API_FILE", help="A file "
                                                           "holding the --rabbitmq-api URL (a docker secret).")
                                 ] = None,
    controller: Annotated[str, typer.Option(help="Controller name (pi, aimd).")] = "pi",
    period: Annotated[float, typer.Option(min=0.1, help="Seconds between decisions.")] = 1.0,
    log_dir: Annotated[Path, typer.Option(help="Where each session's decisions are logged.")] = HEALTH_LOGS,
    metrics_port: Annotated[int | None, typer.Option(help="Serve the decisions as Prometheus metrics here.")] = None,
    metrics_host: Annotated[str, typer.Option(help="Address of --metrics-port: this machine only by default; "
                                              "another needs LABSWARM_METRICS_TOKEN (or its _FILE), which every "
                                              "scrape must then send as a Bearer token.")] = "127.0.0.1",
    max_total_waiting: Annotated[int | None, typer.Option(
        min=0, help="Budget of messages waiting in all sessions' queues together; 0: no budget (default: "
        "LABSWARM_MAX_TOTAL_WAITING, 2000).")] = None,
) -> None:
    """Run the control loop until interrupted (Ctrl-C). Running sessions share the workers by weight."""
    if ctx.invoked_subcommand is not None:
        return
    if manager is None:
        err.print("[bold red]error:[/] --manager is required")
        raise typer.Exit(2)
    import asyncio

    from labswarm.health.loop import HealthLoop
    from labswarm.health.monitors import ManagerMonitor, RabbitMQMonitor
    from labswarm.settings import load_settings

    settings = load_settings(max_total_waiting=max_total_waiting)
    if rabbitmq_api is None and rabbitmq_api_file is not None:
        try:
            rabbitmq_api = rabbitmq_api_file.read_text().strip()
        except OSError as exc:
            raise _fail(ConfigError([("--rabbitmq-api-file", f"cannot read {rabbitmq_api_file}: "
                                                             f"{exc.strerror or exc}")]), 2) from None
    loop = HealthLoop(ManagerMonitor(manager, settings.api_token),
                      RabbitMQMonitor(rabbitmq_api) if rabbitmq_api else None,
                      controller={"name": controller}, period=period, log_dir=log_dir,
                      max_total_waiting=settings.max_total_waiting)
    if metrics_port:
        from labswarm.health.metrics_server import serve_metrics

        try:  # loopback unless a scrape token guards it (labswarm/health/metrics_server.py)
            serve_metrics(loop.registry, metrics_port, metrics_host, settings.metrics_token)
        except ConfigError as exc:
            raise _fail(exc, 2) from None
    console.print(f"health controller ({controller}) on {manager}; decisions in {log_dir}")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(loop.run())


@health_app.command("plot")
def health_plot(
    session: Annotated[str, typer.Argument(help="Session id.")],
    log_dir: Annotated[Path, typer.Option(help="Where the decisions were logged.")] = HEALTH_LOGS,
    out: Annotated[Path | None, typer.Option(help="PNG to write (default: LOG_DIR/health-SESSION.png).")] = None,
) -> None:
    """Draw a session's queue depth (top) and publish vs consume rate (bottom) as a PNG."""
    from labswarm.health.plot import plot_session

    try:
        png = plot_session(log_dir / f"health-{session}.jsonl", out or log_dir / f"health-{session}.png",
                           title=f"session {session}")
    except LabswarmError as exc:
        raise _fail(exc) from None
    console.print(f"wrote {png}")


def print_summary(summary) -> None:
    """Print a run summary: counts, rate, store size and the failures with their reasons."""
    table = Table(title=f"{summary.experiment}: {summary.total} samples in {summary.seconds:.1f} s", show_header=False)
    table.add_row("computed", str(summary.computed))
    table.add_row("cached", str(summary.cached))
    table.add_row("failed", f"[red]{summary.failed}[/]" if summary.failed else "0")
    rate = summary.computed / summary.seconds if summary.seconds else 0.0
    table.add_row("computed/s", f"{rate:.1f}")
    if summary.store is not None:
        table.add_row("store", f"{summary.store.entries} entries, {summary.store.bytes / 1e6:.1f} MB")
    console.print(table)
    if summary.failures:
        console.print("[bold red]failures:[/]")
        for sample_id, reason in summary.failures[:50]:
            console.print(f"  {sample_id}: {reason}", highlight=False, markup=False)
        if len(summary.failures) > 50:
            console.print(f"  ... and {len(summary.failures) - 50} more")
