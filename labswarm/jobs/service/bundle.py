"""A job's bundle: one zip with what it takes to use, audit or reproduce the trained model.

::

    manifest.json       the resolved manifest (the experiment inline, the training settings merged)
    job.json            the job as ``GET /v1/jobs/{id}`` shows it (status, attempts, timestamps, restarts)
    metrics.jsonl       the metrics records, each epoch once
    logs/attempt-<n>/learner-<rank>.log   every learner's log, from the results store
    model/model.pt      the trained model (``labswarm`` framework, once stored)
    versions.json       the experiment's fingerprint, the feature store's layout and key versions, the
                        versions of Python and of the libraries the model depends on, and ``parent_model``:
                        what a fine-tuned model started from (``{job, sha256}`` of the parent job's model
                        file, or ``{model}``: a file's path; ``null`` for a model trained from scratch)
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from labswarm.config.experiment import ExperimentConfig
from labswarm.jobs.spec import layout
from labswarm.storage.base import Storage

#: The distributions whose versions a bundle records.
LIBRARIES = ("labswarm", "torch", "numpy", "librosa", "soundfile", "scipy", "pydantic")


def write_bundle(job: dict[str, Any], metrics: list[dict[str, Any]], storage: Storage, target: Path) -> Path:
    """Write the bundle of ``job`` (as :meth:`JobService.describe` gives it) to the zip file ``target``.

    Raises:
        StorageError: the results store could not be read.
        OSError: ``target`` could not be written.
    """
    manifest = job["manifest"]
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as bundle:
        bundle.writestr("manifest.json", json.dumps(manifest, indent=2))
        bundle.writestr("job.json", json.dumps({k: v for k, v in job.items() if k != "manifest"}, indent=2))
        bundle.writestr("metrics.jsonl", "".join(json.dumps(record) + "\n" for record in metrics))
        for key in storage.list("logs"):
            bundle.writestr(key, storage.get_bytes(key))
        if storage.exists(layout.MODEL_KEY):
            with tempfile.TemporaryDirectory(prefix="labswarm-bundle-") as tmp:
                bundle.write(storage.get_file(layout.MODEL_KEY, Path(tmp) / "model.pt"), layout.MODEL_KEY)
        bundle.writestr("versions.json", json.dumps(versions(manifest), indent=2))
    return target


def versions(manifest: dict[str, Any]) -> dict[str, Any]:
    """What the bundle's model was made with: the experiment's name and fingerprint (its whole configuration), the
    feature store's layout and key versions, Python's and the libraries' versions (``None``: not installed)."""
    from labswarm.store.keys import KEY_VERSION
    from labswarm.store.store import LAYOUT_VERSION

    experiment = manifest.get("experiment")
    fingerprint = (ExperimentConfig.model_validate(experiment).fingerprint() if isinstance(experiment, dict)
                   else None)
    libraries: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            libraries[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            libraries[name] = None
    return {"experiment": experiment.get("name") if isinstance(experiment, dict) else experiment,
            "experiment_fingerprint": fingerprint,
            "feature_store": {"layout_version": LAYOUT_VERSION, "key_version": KEY_VERSION},
            "parent_model": parent_model(manifest),
            "python": platform.python_version(), "libraries": libraries}


def parent_model(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """What the resolved manifest's model was fine-tuned from (``training.init_from``): ``{job, sha256}`` (the
    parent job and the SHA-256 of its model file, recorded at submission) or ``{model}`` (a file's path);
    ``None`` without ``init_from``."""
    source = (manifest.get("training") or {}).get("init_from")
    if not isinstance(source, dict):
        return None
    if source.get("job"):
        return {"job": source["job"], "sha256": source.get("sha256")}
    return {"model": source.get("model")}
