"""The tiny experiment the jobs tests train (the training tests' three-class set, a few seconds an epoch) and
helpers to run learners as real processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from train.three_classes import training_experiment, write_three_classes

from labswarm.config.manifest import parse_manifest


def tiny_manifest(tmp_path: Path, *, epochs: int = 3, **overrides: Any) -> dict[str, Any]:
    """A manifest (as a mapping) training the three-class experiment inline; its results store is
    ``tmp_path/results`` and the data lives in ``tmp_path/data`` (written once)."""
    data = tmp_path / "data"
    if not (data / "labels.csv").is_file():
        write_three_classes(data)
    experiment = training_experiment(data, tmp_path / "store")
    experiment["pipeline"] = [{"name": "source"}, {"name": "shuffle"}, {"name": "features"},
                              {"name": "batch", "size": 4}, {"name": "prefetch", "producers": 1}]
    manifest = {"name": "tiny", "experiment": experiment, "training": {"epochs": epochs},
                "results_store": {"name": "local", "path": str(tmp_path / "results")},
                "restart": {"backoff_s": 0.1, "backoff_max_s": 0.5}}
    manifest.update(overrides)
    return manifest


def learner_spec(tmp_path: Path, manifest: dict[str, Any], url: str, *, job_id: str = "job1", attempt: int = 1,
                 checkpoint: dict[str, Any] | None = None) -> Path:
    """Write a learner spec file for ``manifest`` (resolved) reporting to ``url``; returns its path."""
    resolved = parse_manifest(manifest).resolved()
    spec = {"job_id": job_id, "attempt": attempt, "manifest": resolved, "manager_url": url,
            "results_store": resolved["results_store"], "checkpoint": checkpoint,
            "workdir": str(tmp_path / "work" / f"attempt-{attempt}"), "heartbeat_s": 0.5}
    path = tmp_path / f"spec-{attempt}.json"
    path.write_text(json.dumps(spec))
    return path


def start_learner(spec: Path, out: Path) -> subprocess.Popen:
    """``python -m labswarm.jobs.learner.entry SPEC`` in its own process group, its raw output into ``out``."""
    with open(out, "ab") as handle:
        return subprocess.Popen([sys.executable, "-m", "labswarm.jobs.learner.entry", str(spec)], stdout=handle,
                                stderr=subprocess.STDOUT, start_new_session=True)
