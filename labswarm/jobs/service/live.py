"""Live changes of a job's training (issue 25 item 5), the manager's side: ``PATCH /v1/jobs/{id}`` with
``{"training": {"learning_rate": ..., "early_stopping": {"patience": ...}}}``.

The change goes into the job's resolved manifest at once (so the bundle's ``manifest.json`` and a later attempt
train with it) and into its event stream as a ``change`` event ``{training, previous, from_epoch, by}``;
``from_epoch`` is the epoch after the furthest one the current attempt's learners reported (``None``: none began,
the change holds from the start). The learners learn of it from the answers to their reports (:func:`latest`) and
apply it at the start of that epoch (:mod:`labswarm.jobs.learner.live`), each reporting its own ``change`` event.

The job's reuse fingerprint (:mod:`labswarm.train.provenance`) follows: a job no attempt of which started yet
trains wholly with the changed manifest, so its fingerprint is recomputed from it; a job that began training
under the old settings matches no manifest (its epochs before the change used them), so its fingerprint is
cleared and it is never reused (``POST /v1/jobs?reuse=true``).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from labswarm.config.experiment import ExperimentConfig
from labswarm.config.training import TrainingConfig
from labswarm.errors import ConfigError, Conflict, format_loc
from labswarm.jobs.records import events
from labswarm.jobs.records.models import JobEventRow, JobRow, LearnerRow
from labswarm.jobs.service.queries import JobQueries, job_fingerprint
from labswarm.jobs.spec.states import JobState
from labswarm.plugin import field_errors

#: States in which a job's training can no longer change.
FINISHED = frozenset({JobState.STORING.value, JobState.COMPLETED.value, JobState.FAILED.value})


def change_training(service: JobQueries, job_id: str, changes: dict[str, Any], owner: str | None,
                    by: str) -> dict[str, Any]:
    """Change a job's training now (see the module docstring).

    Args:
        service: the job service (its ``db``, ``lock`` and ``get``).
        job_id: the job.
        changes: ``learning_rate`` and/or ``early_stopping: {patience}``.
        owner: the caller's name for a user (the job must be theirs), ``None`` for an admin.
        by: who asks (recorded in the event).

    Returns:
        The ``change`` event's payload, with its ``seq``.

    Raises:
        NotFound: no such job, or another user's.
        Conflict: the job is storing its model, completed or failed.
        ConfigError: the job has no early stopping to change, or the training would be invalid (the field named).
    """
    with service.lock, service.db() as db:  # type: ignore[attr-defined]
        job = service.get(db, job_id, owner)
        if job.status in FINISHED:
            raise Conflict(f"job {job_id} is {job.status}: its training can no longer change")
        training = dict(job.manifest.get("training") or {})
        previous: dict[str, Any] = {}
        if "learning_rate" in changes:
            previous["learning_rate"] = training.get("learning_rate")
            training["learning_rate"] = changes["learning_rate"]
        if "early_stopping" in changes:
            stopping = training.get("early_stopping")
            if not stopping:
                raise ConfigError([("training.early_stopping.patience", f"job {job_id} has no early stopping to "
                                                                         "change (training.early_stopping: none)")])
            previous["early_stopping"] = {"patience": stopping.get("patience")}
            training["early_stopping"] = {**stopping, **changes["early_stopping"]}
        try:
            TrainingConfig.model_validate(training)
        except ValidationError as exc:
            raise ConfigError([(format_loc(("training", *loc)), why)
                               for loc, why in field_errors(exc, TrainingConfig)]) from None
        payload = {"training": changes, "previous": previous, "from_epoch": _next_epoch(db, job), "by": by}
        job.manifest = {**job.manifest, "training": training}  # a new dict: the JSON column sees the change
        job.fingerprint = _fingerprint(job)
        row = events.append(db, job, "change", payload)
        db.commit()
        return {**payload, "seq": row.seq}


def _fingerprint(job: JobRow) -> str | None:
    """The reuse fingerprint of ``job`` after a change of its manifest (see the module): recomputed while no
    attempt started (``attempt`` 0), else ``None`` (never reused); ``None`` too when it cannot be computed."""
    if job.attempt != 0 or not isinstance(job.manifest.get("experiment"), dict):
        return None
    try:
        experiment = ExperimentConfig.model_validate(job.manifest["experiment"])
    except ValidationError:
        return None
    return job_fingerprint(job.manifest, experiment)


def _next_epoch(db: Session, job: JobRow) -> int | None:
    """The epoch (from 1) after the furthest one the current attempt's learners reported; ``None``: none began."""
    epochs = [int(lr.progress["epoch"]) for lr in db.scalars(select(LearnerRow).where(
        LearnerRow.job_id == job.id, LearnerRow.attempt == job.attempt)) if lr.progress and lr.progress.get("epoch")]
    return max(epochs) + 1 if epochs else None


def latest(db: Session, job: JobRow) -> dict[str, Any] | None:
    """What a learner's report answer carries: the job's latest change ``{seq, from_epoch}`` with the training's
    current ``learning_rate`` and early-stopping ``patience``; ``None`` when its training never changed."""
    row = db.scalars(select(JobEventRow).where(JobEventRow.job_id == job.id, JobEventRow.kind == "change",
                                               JobEventRow.attempt.is_(None))
                     .order_by(JobEventRow.seq.desc()).limit(1)).first()
    if row is None:
        return None
    training = job.manifest.get("training") or {}
    return {"seq": row.seq, "from_epoch": row.payload.get("from_epoch"),
            "learning_rate": training.get("learning_rate"),
            "patience": (training.get("early_stopping") or {}).get("patience")}
