"""Every job manifest shipped in examples/jobs parses and validates (the manifest model, with the experiment it
names where that is a file of examples/), so an example never rots silently."""

from __future__ import annotations

from pathlib import Path

import pytest

from labswarm.config.experiment import load_experiment
from labswarm.config.manifest import DistributedFramework, load_manifest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MANIFESTS = sorted((EXAMPLES / "jobs").glob("*.yml")) + sorted((EXAMPLES / "jobs").glob("*.yaml"))


def test_there_are_examples_including_a_distributed_one() -> None:
    assert len(MANIFESTS) >= 2
    assert any(isinstance(load_manifest(path).framework, DistributedFramework) for path in MANIFESTS)


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_each_example_manifest_is_valid(path: Path) -> None:
    manifest = load_manifest(path)
    experiment = load_experiment(EXAMPLES / f"{manifest.experiment}.yml")
    assert manifest.training_config(experiment).epochs >= 1  # its overrides fit the experiment's training
    assert manifest.resolved(experiment)["learners"] == manifest.learners
    if isinstance(manifest.framework, DistributedFramework):
        assert manifest.learners >= 2
        assert manifest.shards == (manifest.ps_shards or 1 if manifest.framework.needs_parameter_server else 0)
