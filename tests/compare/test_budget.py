"""``labswarm compare --budget N`` (issue 23 item 5): the topologies that fit N processes, the trials that prune
them, and the report of the least time to the target with the table of what was tried."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from train.three_classes import training_experiment, write_three_classes
from typer.testing import CliRunner

from labswarm.cli.main import app
from labswarm.compare.budget import candidates, estimate, processes
from labswarm.config.manifest import parse_manifest
from labswarm.errors import ConfigError


def test_the_candidates_are_every_topology_a_framework_runs_within_the_budget() -> None:
    assert candidates(1) == [(1, None)]
    three = candidates(3, sync_period=2)
    described = sorted((n, (spec or {}).get("name", "labswarm"), processes((n, spec))) for n, spec in three)
    assert described == [(1, "labswarm", 1), (2, "allreduce", 2), (2, "distributed_hogwild", 2), (2, "downpour", 3),
                         (2, "sandblaster", 3), (3, "allreduce", 3), (3, "distributed_hogwild", 3)]
    for n, spec in three:
        assert processes((n, spec)) <= 3
        if spec is not None:  # each one a valid job of its learners and shards
            job = parse_manifest({"name": "job", "experiment": "music_speech_noise", "learners": n,
                                  "framework": spec, "results_store": {"name": "local", "path": "/tmp/results"},
                                  **({"ps_shards": processes((n, spec)) - n} if processes((n, spec)) > n else {})})
            assert job.framework.topology is not None and job.framework.topology.learners == n
    four = [spec["topology"] for n, spec in candidates(4) if spec is not None and spec["name"] == "distributed_hogwild"]
    assert {"worker_groups": 2, "workers_per_group": 2, "server_groups": 2, "sync_period": 4} in four  # the hybrid
    with pytest.raises(ConfigError) as caught:
        candidates(0)
    assert caught.value.errors[0][0] == "budget"


def test_a_trial_that_missed_the_target_is_estimated_from_its_accuracy() -> None:
    assert estimate({"time_to_target_s": 12.5, "final_val_accuracy": 0.9, "wall_s": 20, "target": 0.8}) == 12.5
    assert estimate({"time_to_target_s": None, "final_val_accuracy": 0.4, "wall_s": 10, "target": 0.8}) == 20
    assert math.isinf(estimate({"time_to_target_s": None, "final_val_accuracy": None, "wall_s": 10, "target": 0.8}))


@pytest.mark.slow  # 3 training jobs (one per candidate of 2 processes), each with its learners' torch import
def test_a_budget_of_two_tries_each_topology_and_reports_the_soonest_to_the_target(tmp_path: Path) -> None:
    root = write_three_classes(tmp_path / "data")
    experiment = tmp_path / "experiment.yml"
    experiment.write_text(yaml.safe_dump(training_experiment(root, tmp_path / "store")))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["compare", str(experiment), "--budget", "2", "--keep", "1", "--epochs", "1",
                                      "--target", "0.5", "--output", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "budget.json").read_text())
    trials = report["trials"]
    assert sorted((t["framework"], t["learners"]) for t in trials) == [
        ("allreduce", 2), ("distributed_hogwild", 2), ("labswarm", 1)]
    assert all(t["epochs"] and t["epochs"][0]["val_accuracy"] is not None for t in trials)
    assert [t["kept"] for t in trials].count(True) == 1
    [kept] = [t for t in trials if t["kept"]]
    assert all(kept["estimate_s"] <= t["estimate_s"] for t in trials)  # the soonest estimate goes on
    assert report["runs"] == [kept] and report["best"] == kept  # one epoch: the trials were the full runs
    assert len(list((out / "trials" / "results" / "jobs").iterdir())) == 3  # one job per candidate
    text = (out / "budget.md").read_text()
    assert f"best {kept['label']}" in text and text.count("| yes |") == 1 and text.count("| no |") == 2
    assert "Budget 2 processes" in result.output


@pytest.mark.parametrize(("given", "named"), [
    (["--framework", "allreduce"], "budget: searches the topologies itself"),
    (["--learners", "3"], "learners: not with --budget"),  # once the default "1,2", silently ignored
    (["--ps-shards", "2"], "ps_shards: not with --budget"),
])
def test_budget_with_an_option_it_sets_itself_is_refused_naming_it(tmp_path: Path, given: list[str],
                                                                   named: str) -> None:
    result = CliRunner().invoke(app, ["compare", str(tmp_path / "none.yml"), "--budget", "4", *given])
    assert result.exit_code == 2 and named in result.output, result.output
