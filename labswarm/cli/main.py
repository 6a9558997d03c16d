"""The ``labswarm`` command line (typer + rich): the app, its command groups, and the commands of the parts
(``demo-data``, ``worker``, ``manager``). Exit statuses: :mod:`labswarm.cli.exits`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from labswarm.cli import experiment
from labswarm.cli.compare import compare_command
from labswarm.cli.experiment import interrupted
from labswarm.cli.health import health_app
from labswarm.cli.helpfmt import HelpGroup
from labswarm.cli.jobs import jobs_app
from labswarm.cli.jobs_set import set_command  # issue 25: live changes
from labswarm.cli.models import models_app  # issue 25: model plugins
from labswarm.cli.output import console, err, fail, plural, warn_password
from labswarm.cli.predict import predict_command
from labswarm.cli.progress import Phase
from labswarm.cli.serve import serve_command  # issue 25: the prediction endpoint alone
from labswarm.cli.sessions import sessions_app
from labswarm.cli.store import store_app  # issue 24: store operations
from labswarm.cli.store_pack import pack_command  # noqa: F401 - registers `store pack` on store_app
from labswarm.cli.store_trim import trim_command  # noqa: F401 - registers `store trim` on store_app
from labswarm.cli.tokens import tokens_app
from labswarm.cli.watch import watch_command  # issue 27: a watched folder feeds a followed session
from labswarm.errors import LabswarmError

app = typer.Typer(
    cls=HelpGroup, no_args_is_help=True,
    help="""Audio deep-learning experiments on a swarm of workers, from a YAML file.

    `run` computes an experiment's augmentations and features into a shared store as a session of workers, then
    trains its model as a training job of learners; `features` and `train` do each part alone. `sessions` and
    `jobs` list, follow and steer them on a manager (`manager` serves one, `worker` joins one); `compare` trains an
    experiment under several frameworks and learner counts side by side; `predict` classifies audio files with a
    trained model; `demo-data` builds a small demo set.

    Exit status: 0 done, 1 some work failed (samples, files, a job), 2 usage or configuration error, 3
    infrastructure failure (manager, broker, store), 130 interrupted.""")


def _show_version(value: bool) -> None:
    """``--version``: the installed labswarm's version, then exit."""
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            console.print(f"labswarm {version('labswarm')}", highlight=False)
        except PackageNotFoundError:  # run from a source tree that is not installed
            console.print("labswarm (not installed: version unknown)", highlight=False)
        raise typer.Exit()


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", callback=_show_version, is_eager=True,
                                                help="Show the version and exit.")] = False) -> None:
    pass


app.add_typer(sessions_app, name="sessions")
app.add_typer(jobs_app, name="jobs")
app.add_typer(tokens_app, name="tokens")
app.add_typer(models_app, name="models")  # issue 25: model plugins
app.add_typer(health_app, name="health")
app.add_typer(store_app, name="store")  # issue 24: store operations
app.command("features")(experiment.features)
app.command("run")(experiment.run)
app.command("train")(experiment.train)
app.command("predict")(predict_command)
app.command("serve")(serve_command)
jobs_app.command("set")(set_command)  # labswarm jobs set JOB learning_rate=...
app.command("compare")(compare_command)
app.command("watch")(watch_command)


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

    with Phase("demo set", console, unit="clips") as phase:
        try:
            summary = build_demo_set(out_dir, per_class=per_class, seed=seed, jobs=jobs, progress=phase.update,
                                     force=force)
        except LabswarmError as exc:
            raise fail(exc) from None
        except KeyboardInterrupt:
            raise interrupted() from None
    counts = ", ".join(f"{label} {n} ({plural(summary.n_sources[label], 'source')})"
                       for label, n in summary.counts.items())
    how = "already built, kept" if summary.reused else f"built in {summary.seconds:.1f} s"
    console.print(f"demo set in [bold]{summary.out_dir}[/]: {counts}; {how}")


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
    import gc

    from labswarm.gcpause import collector_paused

    with collector_paused():  # while the worker's libraries are imported (run_worker pauses it again while it warms
        # them up, then freezes their objects before the pool forks; measured: 2.8 s of CPU instead of 3.2 s for the
        # start, load ~20)
        from labswarm.deploy.lifeline import end_with_parent
        from labswarm.queue.worker import run_worker
        from labswarm.settings import load_settings

    warn_password("--broker", broker, "LABSWARM_BROKER_URL")
    try:
        end_with_parent()  # a worker of a LocalLauncher ends with it (labswarm run killed: no worker left behind)
        run_worker(experiment, manager, broker_url=broker, concurrency=concurrency,
                   token=load_settings().api_token, loglevel=loglevel)
    except LabswarmError as exc:
        raise fail(exc) from None
    finally:
        # after the warm shutdown (its tasks done and acknowledged): the interpreter's collections of the ~250k
        # objects of the audio libraries at exit took 3-4 s on a loaded 2-core machine, 0.7 s frozen, and the
        # session's end waits for its workers to exit (docs/benchmarks/distributed.md, issue 27)
        gc.freeze()


@app.command("manager")
def manager_cmd(
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    broker: Annotated[str | None, typer.Option(help="Broker URL (default: LABSWARM_BROKER_URL or embedded).")] = None,
    database: Annotated[str | None, typer.Option(help="SQLAlchemy URL of the state database.")] = None,
    access_log: Annotated[bool, typer.Option(
        "--access-log/--no-access-log", help="Log a line per request on stderr (uvicorn's access log).")] = True,
) -> None:
    """Serve the manager API (OpenAPI docs at /docs). Sessions started with `launcher: local` run their workers
    on this machine; they stop with the manager. Every endpoint but /health needs LABSWARM_API_TOKEN (or a token
    of LABSWARM_TOKENS_FILE): without one, a manager on a non-loopback --host generates one and prints it once."""
    from labswarm.auth.authenticator import ensure_token
    from labswarm.manager.api import create_app
    from labswarm.manager.server import serve
    from labswarm.settings import load_settings

    warn_password("--broker", broker, "LABSWARM_BROKER_URL")
    warn_password("--database", database, "LABSWARM_DATABASE_URL")
    try:
        # no token on a non-loopback address: one is generated and printed once (on stderr)
        settings = ensure_token(load_settings(broker_url=broker, database_url=database), host)
        app = create_app(settings)
        if app.state.auth.open:
            err.print("note: no API token (LABSWARM_API_TOKEN, LABSWARM_TOKENS_FILE): this manager answers clients "
                      "on this machine only, every local user included", highlight=False)
        serve(app, host, port, access_log)
    except LabswarmError as exc:
        raise fail(exc) from None
