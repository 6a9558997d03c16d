"""Fine-tuning from a job (``training.init_from: {job: ID}``), the learner's side: download the parent job's model
from the results store the manager recorded (:mod:`labswarm.jobs.service.parent`), check its SHA-256, and hand the
trainer the local file (``init_from.model``)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from labswarm.config.training import TrainingConfig
from labswarm.errors import ConfigError
from labswarm.jobs.spec import layout
from labswarm.storage.base import MissingObject


def fetch_parent(training: TrainingConfig, workdir: Path) -> TrainingConfig:
    """``training`` with a job's ``init_from`` pointing at its model downloaded into ``workdir``; unchanged
    without one (or when the model is already local).

    Raises:
        ConfigError: the manager did not resolve the job (no ``store``), the model is gone, or its SHA-256 is not
            the one recorded at submission (``training.init_from.job``).
        StorageError: the parent's results store failed.
    """
    source = training.init_from
    if source is None or source.job is None or source.model is not None:
        return training
    if source.store is None or source.sha256 is None:
        raise ConfigError([("training.init_from.job", "not resolved by a manager (no store, no sha256): submit "
                                                      "the job to the manager that ran the parent")])
    target = workdir / f"parent-{source.job}.pt"
    try:
        layout.job_storage(source.store, source.job).get_file(layout.MODEL_KEY, target)
    except MissingObject:
        raise ConfigError([("training.init_from.job", f"job {source.job} has no model any more")]) from None
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    if digest != source.sha256:
        raise ConfigError([("training.init_from.job", f"job {source.job}'s model changed since the submission "
                                                      f"(SHA-256 {digest}, not {source.sha256})")])
    return training.model_copy(update={"init_from": source.model_copy(update={"model": str(target)})})
