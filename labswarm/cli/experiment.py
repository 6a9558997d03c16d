"""``labswarm features | run | train EXPERIMENT.yml``: the commands that run an experiment.

Before any work starts (a manager, a worker, a process pool, a learner) each loads the experiment and checks
the files it names (:func:`labswarm.config.preflight.check_files`): a problem is an error of the command, exit
status 2, each with its field. ``run --manager URL`` leaves the files to that manager (they may live on its
machines only). The exit statuses are those of :mod:`labswarm.cli.exits`: 1 when some samples failed (the run
completed; each failure is listed with its reason), or when the training job failed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from labswarm.cli.exits import FAILED, INFRASTRUCTURE, INTERRUPTED, USAGE
from labswarm.cli.output import console, err, fail, plural, print_session, warn_password
from labswarm.cli.progress import Phase
from labswarm.errors import ConfigError, LabswarmError

Experiment = Annotated[Path, typer.Argument(help="Experiment YAML file.")]
RETRAIN_HELP = "Train even when a completed training of the same configuration, data and code can be reused."


def load(path: Path, *, files: bool = True) -> Any:
    """The experiment of ``path``, validated; with ``files``, the files it names checked too (see the module).
    Exits with status 2 on any problem, before anything has started."""
    from labswarm.config.experiment import load_experiment
    from labswarm.config.preflight import check_files

    try:
        config = load_experiment(path)
        if files:
            check_files(config, source=str(path))
    except ConfigError as exc:
        raise fail(exc, USAGE) from None
    return config


def interrupted() -> typer.Exit:
    """Say so on stderr; the :class:`typer.Exit` of a command interrupted by Ctrl-C (status 130)."""
    err.print("interrupted: what this command started is stopped", highlight=False)
    return typer.Exit(INTERRUPTED)


def features(
    experiment: Experiment,
    jobs: Annotated[int | None, typer.Option(min=1, help="Worker processes (default: all cores).")] = None,
) -> None:
    """Compute every sample × transformation of an experiment on this machine (skips what the store has).
    Exit status 1 when some samples failed (each listed with its reason)."""
    from labswarm.local import run_local
    from labswarm.sample import count_samples

    config = load(experiment)
    total = count_samples(config)  # the labels CSV was read by load(): readable
    with Phase(f"features {config.name}", console) as phase:
        state = {"done": 0, "failed": 0}

        def update(result: Any) -> None:
            state["done"] += 1
            state["failed"] += result.status == "failed"
            phase.update(state["done"], total, failed=state["failed"])

        try:
            summary = run_local(config, jobs, on_result=update)
        except LabswarmError as exc:
            raise fail(exc) from None
        except KeyboardInterrupt:
            raise interrupted() from None
    print_summary(summary)
    if summary.failed:
        raise typer.Exit(FAILED)


def run(
    experiment: Experiment,
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
    retrain: Annotated[bool, typer.Option(help=RETRAIN_HELP)] = False,
    follow: Annotated[bool, typer.Option("--follow", help="Follow the labels CSV: rows appended later are "
                                         "computed as they appear, until the session is cancelled (Ctrl-C "
                                         "cancels it); no training.")] = False,
) -> None:
    """Run an experiment distributed over workers (embedded manager and broker unless URLs are given); then,
    when the experiment has a `training` section, train its model on the features as a job (a completed job of
    the same configuration, data and code is reused unless --retrain). Exit status 1 when some samples failed
    or the training job failed, 3 when a service failed."""
    config = load(experiment, files=manager is None)
    if launcher not in ("local", "swarm", "none"):
        raise fail(ConfigError([("--launcher", f"unknown launcher {launcher!r}; known: local, none, swarm")]), USAGE)
    failed = _compute(config, workers=workers, concurrency=concurrency, broker=broker, manager=manager, rate=rate,
                      health=health, rabbitmq_api=rabbitmq_api, launcher=launcher,
                      train=train and config.training is not None and not follow,  # as a job (labswarm.run)
                      retrain=retrain, follow=follow)
    _exit_if_failed(failed)


def train(
    experiment: Annotated[Path, typer.Argument(help="Experiment YAML file with `model` and `training` sections.")],
    resume: Annotated[bool, typer.Option(help="Continue after the last checkpoint of this configuration.")] = False,
    compute: Annotated[bool, typer.Option(help="First compute the features missing from the store, through the "
                                          "distributed run (embedded default).")] = True,
    workers: Annotated[int, typer.Option(min=0, help="Local workers for the missing features.")] = 2,
    retrain: Annotated[bool, typer.Option(help=RETRAIN_HELP)] = False,
) -> None:
    """Train the experiment's model on its features: per-epoch metrics as JSON lines, a checkpoint every epoch
    (resume with --resume), the trained model saved under the experiment's name and configuration hash. A model
    that a completed training of the same configuration, data and code left is reused unless --retrain (no
    feature is computed then)."""
    from labswarm.run import reuse, training_table
    from labswarm.settings import load_settings
    from labswarm.train.provenance import of_experiment
    from labswarm.train.trainer import Trainer

    config = load(experiment)
    if config.training is None:
        raise fail(ConfigError([("training", "missing: add `model` and `training` sections to train")]), USAGE)
    try:
        model = Trainer(config, load_settings().home).model_path
        provenance = of_experiment(config)
    except LabswarmError as exc:
        raise fail(exc) from None
    done = None if retrain else reuse.earlier(model, provenance)
    if done is not None:
        console.print(f"training reused: model {model} (completed {done.get('completed')}) was trained with this "
                      "configuration on the same data with the same code (--retrain to train again)",
                      highlight=False, soft_wrap=True)
        console.print(training_table(config.name, done.get("final") or {}, model))
        return
    failed = _compute(config, workers=workers) if compute else (0, 0)
    _train(config, resume=resume, provenance=provenance)  # on the samples that did not fail
    _exit_if_failed(failed)


def _exit_if_failed(failed: tuple[int, int]) -> None:
    """Exit with status 1 when ``failed = (failed samples, samples)`` counts any, saying so on stderr."""
    if failed[0]:
        err.print(f"{failed[0]} of {plural(failed[1], 'sample')} failed (listed above with their reasons)",
                  highlight=False)
        raise typer.Exit(FAILED)


def _compute(config: Any, *, workers: int = 2, concurrency: int = 1, broker: str | None = None,
             manager: str | None = None, rate: float | None = None, health: bool = True,
             rabbitmq_api: str | None = None, launcher: str = "local", train: bool = False,
             retrain: bool = False, follow: bool = False) -> tuple[int, int]:
    """The features of every sample into the store, as a session; with ``train``, then the model as a training
    job of the same manager, followed live. Exits 1 unless the session completes or when the job fails; 3 when
    the session failed (its publisher or launcher).

    Returns:
        ``(failed samples, samples)`` of the completed session.
    """
    from labswarm.run import reused_line, run_experiment, training_table

    warn_password("--broker", broker, "LABSWARM_BROKER_URL")
    warn_password("--rabbitmq-api", rabbitmq_api, "LABSWARM_RABBITMQ_API")
    result = _session(config, workers=workers, concurrency=concurrency, broker=broker, manager=manager, rate=rate,
                      health=health, rabbitmq_api=rabbitmq_api, launcher=launcher, train=train, retrain=retrain,
                      run=run_experiment, follow=follow)
    progress = result.progress
    if progress["status"] != "completed" and not (follow and progress["status"] == "cancelled"):
        raise typer.Exit(INFRASTRUCTURE if progress["status"] == "failed" else FAILED)
    if result.training is not None:
        job = result.training.job
        if result.training.reused:
            console.print(reused_line(result.training), highlight=False, soft_wrap=True)
        console.print(training_table(config.name, result.training.final, result.training.model, job=job["id"]))
        if job["status"] != "completed":
            raise fail(LabswarmError(f"training job {job['id']} {job['status']}: {job.get('reason') or ''}"), FAILED)
    return progress["failed"], progress["total"]


def _session(config: Any, *, run: Any, workers: int, concurrency: int, broker: str | None, manager: str | None,
             rate: float | None, health: bool, rabbitmq_api: str | None, launcher: str, train: bool,
             retrain: bool = False, follow: bool = False) -> Any:
    """``run_experiment``'s result, its progress shown as a :class:`Phase`, its session summarized."""
    from labswarm.jobs.client.follow import follow as follow_job
    from labswarm.run import RunHooks, RunOptions, dashboard_line
    from labswarm.settings import load_settings

    options = RunOptions(workers=workers, concurrency=concurrency, broker_url=broker, manager_url=manager, rate=rate,
                         health=health, rabbitmq_api=rabbitmq_api, launcher=launcher, train=train, retrain=retrain,
                         follow=follow)
    with Phase(f"features {config.name}", console) as phase:

        class Shown(RunHooks):  # what the console shows of the run
            def on_dashboard(self, url: str, token_file: Path | None) -> None:
                console.print(dashboard_line(url, token_file), soft_wrap=True)

            def on_resume(self, p: dict[str, Any]) -> None:
                console.print(f"session {p['id']}, left running by a run that did not end it, taken over: "
                              f"{p['finished']}/{p['total']} samples finished", highlight=False)

            def on_progress(self, p: dict[str, Any]) -> None:
                phase.update(p["finished"], p["total"], rate=p["samples_per_s"], failed=p["failed"])

            def on_session_end(self, result: Any) -> None:
                phase.stop()
                print_session(result.progress, result.failures, result.seconds)
                if result.progress.get("error"):
                    err.print(f"session {result.progress['status']}: {result.progress['error']}", highlight=False)
                if result.figure is not None:
                    console.print(f"health figure (queue depth; publish vs consume rate): {result.figure}")

            def on_job_events(self, events: Any) -> None:
                follow_job(events, console)

        try:
            return run(config, options, settings=load_settings(), hooks=Shown())
        except LabswarmError as exc:
            raise fail(exc) from None
        except KeyboardInterrupt:
            raise interrupted() from None


def _train(config: Any, *, resume: bool, provenance: Any) -> None:
    """Train the experiment's model, printing one line per epoch and the held-out result; a completed training
    records its ``provenance`` beside the model (:mod:`labswarm.run.reuse`)."""
    from labswarm.jobs.client.follow import epoch_line
    from labswarm.run import reuse, training_table
    from labswarm.settings import load_settings
    from labswarm.train.distributed.single import SingleLearner
    from labswarm.train.trainer import Trainer

    def show(r: dict[str, Any]) -> None:
        console.print(epoch_line(r), highlight=False)

    try:  # it reads the training split as a job's learners do (in memory up to training.keep_bytes, else streamed)
        trainer = Trainer(config, load_settings().home, on_epoch=show,
                          distributed=SingleLearner(report=lambda line: console.print(line, highlight=False)))
        epochs = plural(config.training.epochs, "epoch")
        console.print(f"training {config.model.name} on {config.model.input} for {epochs}; "
                      f"metrics: {trainer.metrics_path}")
        reuse.forget(trainer.model_path)
        result = trainer.fit(resume=resume)
        if not result.stopped:
            reuse.remember(trainer.model_path, provenance, result.final)
    except LabswarmError as exc:
        raise fail(exc) from None
    except ImportError as exc:  # an optional dependency (torch) missing: the installation's configuration
        raise fail(LabswarmError(str(exc)), USAGE) from None
    except KeyboardInterrupt:
        raise interrupted() from None
    console.print(training_table(config.name, result.final, result.model_path, resumed_from=result.resumed_from))


def print_summary(summary: Any) -> None:
    """Print a run summary: counts, rate, store size and the failures with their reasons."""
    table = Table(title=f"{summary.experiment}: {plural(summary.total, 'sample')} in {summary.seconds:.1f} s",
                  show_header=False)
    table.add_row("computed", str(summary.computed))
    table.add_row("cached", str(summary.cached))
    table.add_row("failed", f"[red]{summary.failed}[/]" if summary.failed else "0")
    rate = summary.computed / summary.seconds if summary.seconds else 0.0
    table.add_row("computed/s", f"{rate:.1f}")
    if summary.store is not None:
        entries = plural(summary.store.entries, "entry", "entries")
        table.add_row("store", f"{entries}, {summary.store.bytes / 1e6:.1f} MB")
    console.print(table)
    if summary.failures:
        console.print("[bold red]failures:[/]")
        for sample_id, reason in summary.failures[:50]:
            console.print(f"  {sample_id}: {reason}", highlight=False, markup=False)
        if len(summary.failures) > 50:
            console.print(f"  ... and {len(summary.failures) - 50} more")
