"""The training job of ``labswarm run``: its manifest (the registered experiment, results beside the feature
store), its submission to the run's manager and the following of its events to the end, and the table of its
held-out result (also ``labswarm train``'s)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from labswarm.config.experiment import ExperimentConfig
from labswarm.threads import usable_cores

if TYPE_CHECKING:
    from rich.table import Table


@dataclass
class JobTraining:
    """The training job of a run, at its end.

    Attributes:
        job: the job as ``GET /v1/jobs/{id}`` shows it (``status``, ``attempts``, ...).
        metrics: its metrics records, each epoch once (the last one is the held-out result).
        model: where its results store keeps the trained model (a path, or ``s3://...``).
        reused: the job is an earlier one of the same configuration, data and code, completed: nothing was
            trained (``POST /v1/jobs?reuse=true``).
    """

    job: dict[str, Any]
    metrics: list[dict[str, Any]]
    model: str
    reused: bool = False

    @property
    def final(self) -> dict[str, Any]:
        """The last epoch's metrics record (``{}`` when none)."""
        return self.metrics[-1] if self.metrics else {}


def job_manifest(config: ExperimentConfig) -> dict[str, Any]:
    """The training job ``labswarm run`` submits: the registered experiment ``config.name`` with its own training
    settings, one learner given every core this process may run on (``resources.cpus``: a run's manager is the
    user's own machine, and the local launcher pins a learner to ``ceil(cpus)`` cores), results in
    ``<store root>/../results`` (beside the feature store the workers share, as in
    ``examples/jobs/music_speech_noise.job.yml``)."""
    results = config.store.root.resolve().parent / "results"
    return {"name": config.name, "description": f"labswarm run {config.name}", "experiment": config.name,
            "resources": {"cpus": len(usable_cores())},
            "results_store": {"name": "local", "path": str(results)}}


def train_job(manager_url: str, token: str | None, config: ExperimentConfig,
              follow: Callable[[Iterable[dict[str, Any]]], Any] | None = None, *, retrain: bool = False
              ) -> JobTraining:
    """Submit the training job of ``config`` (registered on the manager) and follow it to its end; unless
    ``retrain``, a completed job of the same configuration, data and code is reused instead (nothing is trained,
    nothing followed: :attr:`JobTraining.reused`).

    Args:
        manager_url: the manager.
        token: its API token.
        config: the experiment.
        follow: called with the job's event stream (:meth:`~labswarm.run.experiment.RunHooks.on_job_events`);
            default: read silently.
        retrain: train even when an identical job has completed.

    Returns:
        The job at its end (completed or failed), its metrics and where its model is (or would be).

    Raises:
        ManagerError: the manager refused the job or cannot be reached.
    """
    from labswarm.jobs.client.client import JobsClient
    from labswarm.jobs.spec.layout import MODEL_KEY, job_storage

    manifest = job_manifest(config)
    with JobsClient(manager_url, token) as jobs:
        job = jobs.submit(manifest, reuse=not retrain)
        reused = bool(job.get("reused"))
        if not reused:
            events = jobs.events(job["id"])
            if follow is not None:
                follow(events)
            for _ in events:  # to the terminal status, whatever ``follow`` left
                pass
        shown = jobs.show(job["id"])
        metrics = jobs.metrics(job["id"])
    # a reused job's model is where its own results store keeps it
    results = (shown.get("manifest") or {}).get("results_store") or manifest["results_store"]
    return JobTraining(shown, metrics, job_storage(results, job["id"]).describe(MODEL_KEY), reused)


def reused_line(training: JobTraining) -> str:
    """What ``labswarm run`` and ``labswarm train`` say of a reused training job: which job, when it completed,
    and how to train again."""
    job = training.job
    done = (job.get("timestamps") or {}).get("completed") or job.get("updated_at") or "?"
    return (f"training reused: job {job['id']} (completed {done}) trained this configuration on the same data "
            f"with the same code; its model and metrics follow (--retrain to train again)")


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
