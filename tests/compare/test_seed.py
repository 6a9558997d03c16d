"""``labswarm compare --seed N``: the seed reaches every run's job manifest as its ``training.seed`` (the manifests
the comparison really builds, checked by the manager's parser, without running the jobs: ``run_all`` is replaced by
its manifest-building step and a row per run), and a bad value exits 2 naming ``--seed`` before anything is written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from train.three_classes import training_experiment, write_three_classes
from typer.testing import CliRunner

from labswarm.cli.main import app
from labswarm.compare import run
from labswarm.compare.report import summarize
from labswarm.config.manifest import parse_manifest


def test_the_seed_reaches_every_jobs_manifest_and_a_bad_one_exits_2_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    experiment = tmp_path / "experiment.yml"
    experiment.write_text(yaml.safe_dump(training_experiment(write_three_classes(tmp_path / "data", per_class=2),
                                                             tmp_path / "store")))
    built: list[dict[str, Any]] = []

    def manifests_only(config: Any, runs: Any, workdir: Path, opts: run.CompareOptions, epochs: int | None,
                       **_: Any) -> list[dict[str, Any]]:
        built.extend(run.job_manifests(config, runs, workdir, opts, epochs))
        epoch = {"epoch": 1, "val_accuracy": 0.5, "elapsed_s": 1.0, "samples": 4}  # no job runs: a row per run
        return [summarize("labswarm" if fw is None else fw["name"], [[epoch]] * n, opts.target, params=fw)
                for n, fw in runs]

    monkeypatch.setattr(run, "run_all", manifests_only)
    base = ["compare", str(experiment), "--frameworks", "allreduce,downpour", "--learners", "1,2", "--epochs", "1"]
    for seed in ("7", None):
        built.clear()
        out = tmp_path / f"out-{seed}"
        result = CliRunner().invoke(app, [*base, "--output", str(out), *(["--seed", seed] if seed else [])])
        assert result.exit_code == 0, result.output
        assert [(m["framework"]["name"], m["learners"]) for m in built] == [
            ("labswarm", 1), ("allreduce", 2), ("downpour", 2)]
        for manifest in built:
            config = parse_manifest(manifest).training_config()  # the manager takes it
            assert config.seed == (7 if seed else None), manifest["training"]  # unset: the experiment's seed
            assert manifest["training"] == {"threads": 1, "epochs": 1, **({"seed": 7} if seed else {})}
        assert json.loads((out / "compare.json").read_text())["seed"] == (7 if seed else None)
    for bad in ("-1", "x", "1.5", ""):
        result = CliRunner().invoke(app, [*base, "--output", str(tmp_path / "bad"), "--seed", bad])
        assert result.exit_code == 2 and "--seed" in result.output, (bad, result.output)
    assert not (tmp_path / "bad").exists()  # refused before anything was written
