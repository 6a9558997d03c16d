"""``labswarm compare``: the same experiment trained under each framework and each learner count, as training jobs,
side by side (SINGA's "unified platform for verifying the performance of different frameworks (convergence rate,
computation time) under the same environmental setting").

Every run is a training job (:mod:`labswarm.jobs`) of one manager: the embedded one this process hosts (as
``labswarm run`` does: SQLite state in ``<workdir>/manager``, the local launcher, a token of this run only), or a
running one (``manager_url``; its token from ``LABSWARM_API_TOKEN``; its data roots must hold the experiment's
folders and ``<workdir>/results``). Each job gets the same inline experiment
(model, data, seed), the same ``training`` overrides (epochs: the sample budget is epochs × the training split;
threads per learner), the same per-learner batch (the pipeline's batch block) and schedule; ``learners: N`` with
the framework, or, for ``N = 1``, the single-process trainer (``framework: {name: labswarm}``, what every framework
reduces to with one learner: the manifest takes a distributed framework with 2 learners or more only). Jobs run one
after another, never side by side. The figures come from the jobs' event streams
(:func:`~labswarm.compare.report.rank_records`).

Output folder: ``compare.json`` (every figure; the dashboard's ``/ui/compare`` reads it), ``compare.md`` (the
table), ``loss.png``, ``accuracy.png`` and ``scaling.png`` (:func:`~labswarm.compare.report.plot`).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from labswarm.compare.report import CompareError, plot, rank_records, scaling, summarize, table
from labswarm.compare.specs import parse_frameworks, parse_learners, topology_learners
from labswarm.errors import ConfigError
from labswarm.settings import COMPARE_DIR

if TYPE_CHECKING:
    from labswarm.compare.hosts import Hosts

__all__ = [
    "COMPARE_DIR",
    "RUN_TIMEOUT_S",
    "CompareError",
    "CompareOptions",
    "compare",
    "default_output",
    "job_manifest",
    "parse_frameworks",
    "parse_learners",
    "plot",
    "rank_records",
    "scaling",
    "summarize",
    "table",
]

#: Seconds one job may take before it is deleted (its processes stopped) and the comparison fails.
RUN_TIMEOUT_S = 1800.0
#: The frameworks compared when none is named.
DEFAULT_FRAMEWORKS = ("allreduce", "downpour")


def job_manifest(experiment: Mapping[str, Any], framework: Mapping[str, Any] | None, learners: int, results: Path,
                 epochs: int | None = None, threads: int = 1, ps_shards: int = 1, *, seed: int | None = None
                 ) -> dict[str, Any]:
    """The job of one run: ``experiment`` inline, ``learners`` of ``framework`` (``None`` or ``learners == 1``: the
    single-process trainer), ``threads`` torch threads and CPUs per learner, results in ``results``; ``seed``: its
    ``training.seed`` (``None``: the experiment's).

    The single-process trainer's prefetch block gets ``producers: 0``: its pipeline runs in the trainer's process,
    so its data work counts as waiting for data (left out of the compute seconds that samples/s divides by, see
    :func:`~labswarm.compare.report.summarize`) and no producer process competes with it for the cores;
    the distributed learners read their features into memory before their first step.

    Raises:
        ConfigError: a distributed framework with one learner.
    """
    if learners == 1:
        framework = None
    elif framework is None:
        raise ConfigError([("framework", f"{learners} learners need a distributed framework")])
    from labswarm.registry import FRAMEWORKS

    name = "labswarm" if framework is None else str(framework["name"])
    if framework is None:  # the pipeline in the trainer's process: its data work is data wait, not compute
        experiment = {**experiment, "pipeline": [
            {**b, "producers": 0} if isinstance(b, Mapping) and b.get("name") == "prefetch" else b
            for b in experiment.get("pipeline") or []]}
    training: dict[str, Any] = {"threads": threads}
    if epochs is not None:
        training["epochs"] = epochs
    if seed is not None:
        training["seed"] = seed
    manifest: dict[str, Any] = {
        "name": f"compare-{name.replace('_', '-')}-{learners}", "description": f"labswarm compare: {name} ×{learners}",
        "experiment": dict(experiment), "training": training, "learners": learners,
        "resources": {"cpus": threads}, "framework": dict(framework or {"name": "labswarm"}),
        "results_store": {"name": "local", "path": str(results)}}
    if framework is not None and FRAMEWORKS.get(name).needs_parameter_server:
        topology = framework.get("topology")
        manifest["ps_shards"] = ps_shards if not isinstance(topology, Mapping) else (
            int(topology.get("server_groups", 1)) * int(topology.get("shards_per_group") or 1))
    return manifest


def default_output(home: Path, now: float | None = None) -> Path:
    """Where ``labswarm compare`` writes when not told: ``<home>/compare/<UTC stamp>`` beside a manager's home
    (``home``, ``LABSWARM_HOME``, is a folder: the dashboard's ``/ui/compare`` lists the runs there), else
    ``./compare``."""
    if not Path(home).is_dir():
        return Path(COMPARE_DIR)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    return Path(home) / COMPARE_DIR / stamp


@contextlib.contextmanager
def embedded_manager(home: Path, data_roots: Sequence[Path], slots: int,
                     hosts: Hosts | None = None) -> Iterator[tuple[str, str]]:
    """A manager served in this process for the comparison's jobs (``labswarm run``'s way): its own SQLite state
    in ``home`` (never the environment's database or broker: its lifecycle would take over their jobs), the local
    launcher, ``slots`` learner slots, and a token of this run only; with ``hosts``, served on ``hosts.address``
    and its learners and shards placed on them (:func:`labswarm.compare.hosts.place`). Yields ``(url, token)``."""
    from labswarm.auth.tokens import new_token
    from labswarm.compare.hosts import place
    from labswarm.manager.api import create_app
    from labswarm.manager.server import EmbeddedServer
    from labswarm.settings import Settings

    token = new_token()
    settings = Settings(home=home, database_url=None, broker_url=None, tokens_file=None, api_token=token,
                        data_roots=list(data_roots), job_slots=slots, job_launcher="local")
    home.mkdir(parents=True, exist_ok=True)
    app = create_app(settings)
    if hosts is not None:
        place(app.state.jobs.lifecycle.learners, hosts, app.state.jobs.runtime.home)
    server = EmbeddedServer(app, host=hosts.address if hosts is not None else "127.0.0.1").start()
    try:
        yield server.url, token
    finally:
        server.stop()


def run_job(client: Any, manifest: Mapping[str, Any], timeout_s: float = RUN_TIMEOUT_S,
            on_event: Callable[[str, dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Submit one job and read its event stream to its end.

    Args:
        client: a :class:`~labswarm.jobs.client.client.JobsClient`.
        manifest: the job.
        timeout_s: seconds before the job is deleted and this fails.
        on_event: called with ``(job id, event)`` for each event (the CLI prints the metrics).

    Returns:
        The job's events (``{id, event, data}``), in order.

    Raises:
        CompareError: the job ended other than completed, or took longer than ``timeout_s``.
        ManagerError: the manager refused the job or cannot be reached.
    """
    job = client.submit(dict(manifest))
    deadline = time.monotonic() + timeout_s
    events: list[dict[str, Any]] = []
    for event in client.events(job["id"]):
        events.append(event)
        if on_event is not None:
            on_event(job["id"], event)
        if time.monotonic() > deadline:
            with contextlib.suppress(Exception):
                client.delete(job["id"])
            raise CompareError(f"job {job['id']} ({manifest['name']}) took more than {timeout_s:.0f} s: deleted")
    shown = client.show(job["id"])
    if shown["status"] != "completed":
        tail = "\n".join(shown.get("log_tail") or [])
        raise CompareError(f"job {job['id']} ({manifest['name']}) ended {shown['status']}: "
                           f"{shown.get('error') or shown.get('reason')}\n{tail}")
    return events


@dataclass(frozen=True)
class CompareOptions:
    """What a comparison runs: how many learners, for how long, on what.

    Attributes:
        learners: learner counts; 1 runs the single-process trainer once (not once per framework).
        epochs: override ``training.epochs`` (the sample budget); ``None``: the experiment's.
        target: the validation accuracy whose first reach is timed (0-1).
        ps_shards: parameter-server shards of the frameworks that need them.
        threads: torch threads (and ``resources.cpus``) per learner.
        timeout_s: the longest a job may take, in s.
        owner: recorded in ``compare.json``: that user may see the run on the dashboard (admins see all).
        hosts: the machines the learners and shards run on (:mod:`labswarm.compare.hosts`); ``None``: this one.
        seed: every run's ``training.seed`` (order, crops, initial weights; not the features); ``None``: the
            experiment's.
    """

    learners: Sequence[int] = (2,)
    epochs: int | None = None
    target: float = 0.8
    ps_shards: int = 1
    threads: int = 1
    timeout_s: float = RUN_TIMEOUT_S
    owner: str | None = None
    hosts: Hosts | None = None
    seed: int | None = None


def compare(experiment: Path, frameworks: Sequence[Mapping[str, Any] | str], output: Path,
            options: CompareOptions | None = None, *, manager_url: str | None = None, token: str | None = None,
            workdir: Path | None = None,
            on_event: Callable[[str, dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Run every (learner count, framework) as a job, one after another, and write ``compare.json``,
    ``compare.md`` and the plots into ``output``.

    Args:
        experiment: the experiment YAML (with ``model`` and ``training``).
        frameworks: framework specs (``{"name": ..., **params}``) or names.
        output: the output folder (created) of ``compare.json``, ``compare.md`` and the plots.
        options: learner counts, epochs, target, shards, threads, timeout, owner (:class:`CompareOptions`).
        manager_url: a running manager; ``None``: one embedded here. Its data roots must hold the experiment's
            folders and ``workdir/results``.
        token: that manager's API token.
        workdir: where the embedded manager keeps its state (``workdir/manager``: database, the learners'
            folders) and the jobs their results (``workdir/results``: models, checkpoints, logs, metrics);
            default ``output``.
        on_event: called with ``(job id, event)`` for every event of every job.

    Returns:
        The rows (:func:`~labswarm.compare.report.summarize`): learner counts ascending, frameworks in
        the given order.

    Raises:
        ConfigError: no framework, an unknown one, bad parameters or learner counts (named by field), or an
            experiment the jobs cannot train.
        CompareError: a job failed.
        ManagerError: the manager refused a job or cannot be reached.
    """
    from labswarm.config.experiment import load_experiment

    opts = options if options is not None else CompareOptions()
    if not frameworks:
        raise ConfigError([("framework", "name at least one framework")])
    if opts.hosts is not None and manager_url is not None:
        raise ConfigError([("hosts", "places the learners of the embedded manager; not with a running manager")])
    specs = [s for f in frameworks for s in (parse_frameworks([f]) if isinstance(f, str) else [dict(f)])]
    counts = parse_learners(list(opts.learners))
    config = load_experiment(Path(experiment))
    output = Path(output).resolve()
    workdir = Path(workdir).resolve() if workdir is not None else output
    runs = [(n, None) for n in counts if n == 1] + sorted(  # a topology runs with its own learners only
        [(n, fw) for n in counts if n > 1 for fw in specs if topology_learners(fw) is None]
        + [(n, fw) for fw in specs if (n := topology_learners(fw)) is not None], key=lambda run: run[0])
    rows = run_all(config, runs, workdir, opts, opts.epochs, manager_url=manager_url, token=token,
                   on_event=on_event)
    output.mkdir(parents=True, exist_ok=True)
    (output / "compare.json").write_text(json.dumps({
        "experiment": str(experiment), "learners": max(counts), "learner_counts": counts, "epochs": opts.epochs,
        "seed": opts.seed, "threads": opts.threads, "owner": opts.owner, "frameworks": specs,
        "hosts": None if opts.hosts is None else dict(zip(opts.hosts.names, opts.hosts.addresses, strict=True)),
        "rows": rows}, indent=1))
    (output / "compare.md").write_text(table(rows))
    plot(rows, output)
    return rows


def job_manifests(config: Any, runs: Sequence[tuple[int, Mapping[str, Any] | None]], workdir: Path,
                  opts: CompareOptions, epochs: int | None) -> list[dict[str, Any]]:
    """The job manifest of each run of :func:`run_all` (:func:`job_manifest`: the experiment ``config`` inline,
    ``opts``' threads, shards and seed, results in ``workdir/results``), in the order of ``runs``."""
    workload = config.model_dump(mode="json")
    return [job_manifest(workload, fw, n, workdir / "results", epochs, opts.threads, opts.ps_shards, seed=opts.seed)
            for n, fw in runs]


def run_all(config: Any, runs: Sequence[tuple[int, Mapping[str, Any] | None]], workdir: Path,
            opts: CompareOptions, epochs: int | None, *, manager_url: str | None = None, token: str | None = None,
            on_event: Callable[[str, dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Each run ``(learners, framework spec or None: the single-process trainer)`` of the experiment ``config``
    (an :class:`~labswarm.config.experiment.ExperimentConfig`) as a job for ``epochs`` epochs, one after another,
    on ``manager_url`` or a manager embedded here (its state in ``workdir/manager``, the results in
    ``workdir/results``). Every manifest is checked before the first job starts.

    Returns:
        One row per run, in order (:func:`~labswarm.compare.report.summarize`).

    Raises:
        ConfigError: a run's job is invalid (named by field). CompareError: a job failed. ManagerError: the manager
            refused a job or cannot be reached.
    """
    from labswarm.config.manifest import parse_manifest
    from labswarm.config.roots import experiment_folders
    from labswarm.jobs.client.client import JobsClient

    manifests = job_manifests(config, runs, workdir, opts, epochs)
    for manifest in manifests:
        parse_manifest(manifest, source=f"job {manifest['name']}").training_config()  # every error before the first
        # job: the training settings and the framework's batch split (framework.batch) against the experiment
    with contextlib.ExitStack() as stack:
        if manager_url is None:
            manager_url, token = stack.enter_context(embedded_manager(
                workdir / "manager", [*experiment_folders(config), workdir], max(n for n, _ in runs), opts.hosts))
        client = stack.enter_context(JobsClient(manager_url, token))
        rows = []
        for (n, fw), manifest in zip(runs, manifests, strict=True):
            events = run_job(client, manifest, opts.timeout_s, on_event)
            rows.append(summarize("labswarm" if fw is None else str(fw["name"]), rank_records(events, n),
                                  opts.target, params=fw))
    return rows
