"""Fine-tuning from a job (``training.init_from: {job: ID}``), the manager's side: at submission the parent job
must be one the submitter may read (their own; an admin: any) and completed with a model; the manifest then
records where that model is (the parent's results store) and its SHA-256, which the learner checks after its
download (:mod:`labswarm.jobs.learner.parent`) and the job's bundle reports (``versions.json``: ``parent_model``).

``init_from: {model: PATH}`` names a file the learner opens as the manager's OS user, with no owner to check
(another user's job results, any readable ``.pt``): like ``model: {code: ...}`` it is an admin's only (403
naming ``training.init_from.model``); a user fine-tunes from a job of theirs with ``{job: ID}``.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

from labswarm.config.experiment import ExperimentConfig
from labswarm.config.manifest import JobManifest
from labswarm.errors import ConfigError, NotFound, StorageError
from labswarm.jobs.records.models import JobRow
from labswarm.jobs.service.queries import JobQueries
from labswarm.jobs.spec import layout
from labswarm.jobs.spec.errors import AdminOnly
from labswarm.jobs.spec.states import JobState
from labswarm.storage.base import MissingObject

FIELD = "training.init_from.job"
MODEL_FIELD = "training.init_from.model"


def resolve_parent(service: JobQueries, manifest: JobManifest, experiment: ExperimentConfig, owner: str,
                   admin: bool) -> JobManifest:
    """``manifest`` with its ``init_from: {job: ID}`` resolved (``store`` and ``sha256`` added to the manifest's
    training overrides), or itself when it fine-tunes from no job.

    Args:
        service: the job service (its ``db`` and ``get``).
        manifest: the manifest as submitted.
        experiment: the experiment it trains (its training section may hold the ``init_from``).
        owner: the submitter; admin: whether they are an admin.

    Raises:
        AdminOnly: ``init_from: {model: PATH}`` from a user who is not an admin (a file read as the manager's OS
            user, whoever owns it).
        ConfigError: ``store`` or ``sha256`` given by the user; no such job (or another user's: the same
            answer); the job is not completed; it has no model; its results store cannot be read.
    """
    source = manifest.training_config(experiment).init_from
    if source is not None and source.model is not None and not admin:
        raise AdminOnly(f"{MODEL_FIELD}: a model file is read by the learner as the manager's OS user, whoever's "
                        f"it is: only an admin may submit it ({owner} is a user); fine-tune from a job of yours "
                        "with training.init_from: {job: ID} instead")
    if source is None or source.job is None:
        return manifest
    if source.store is not None or source.sha256 is not None:
        raise ConfigError([("training.init_from", "store and sha256 are set by the manager from the job: give "
                                                  "job alone")])
    with service.db() as db:
        try:
            parent: JobRow = service.get(db, source.job, None if admin else owner)
        except NotFound:
            raise ConfigError([(FIELD, f"no job {source.job!r}")]) from None
        status, store = parent.status, parent.manifest.get("results_store")
    if status != JobState.COMPLETED.value:
        raise ConfigError([(FIELD, f"job {source.job} is {status}: fine-tuning starts from a completed job's model")])
    digest = _model_sha256(store, source.job)
    resolved = {**source.model_dump(mode="json", exclude_none=True), "store": store, "sha256": digest}
    return manifest.model_copy(update={"training": {**manifest.training, "init_from": resolved}})


def _model_sha256(store: dict[str, Any] | None, job_id: str) -> str:
    """The SHA-256 (hex) of the job's stored model file.

    Raises:
        ConfigError: no model, or the store failed.
    """
    if store is None:
        raise ConfigError([(FIELD, f"job {job_id} has no results store")])
    folder = Path(tempfile.mkdtemp(prefix="labswarm-parent-"))
    try:
        path = layout.job_storage(store, job_id).get_file(layout.MODEL_KEY, folder / "model.pt")
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest()
    except MissingObject:
        raise ConfigError([(FIELD, f"job {job_id} has no trained model")]) from None
    except StorageError as exc:
        raise ConfigError([(FIELD, f"job {job_id}'s model cannot be read: {exc}")]) from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
