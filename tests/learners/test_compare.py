"""``labswarm compare`` through training jobs of an embedded manager (real learner processes, gloo, a real
parameter-server shard) on the tiny real-audio set: downpour with 2 learners beside the one-learner run. Two jobs,
each several seconds of process start-up and ``import torch``: 130 s with the 2 cores at load 15, ~40 s quiet. The
figures' arithmetic is tested without jobs in test_compare_report.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from train.three_classes import training_experiment, write_three_classes
from typer.testing import CliRunner

from labswarm.cli.main import app

#: real learner processes: each imports torch (several s on the 2 shared cores)
pytestmark = pytest.mark.slow


def test_compare_runs_each_framework_and_learner_count_as_a_job_and_writes_the_table_json_and_plots(
        tmp_path: Path) -> None:
    root = write_three_classes(tmp_path / "data")
    experiment = tmp_path / "experiment.yml"
    data = training_experiment(root, tmp_path / "store")
    experiment.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["compare", str(experiment), "--frameworks", "downpour", "--learners", "2,1",
                                      "--epochs", "2", "--target", "0.5", "--output", str(out)])
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "compare.json").read_text())
    rows = saved["rows"]
    assert [(r["framework"], r["learners"]) for r in rows] == [("labswarm", 1), ("downpour", 2)]
    assert saved["learner_counts"] == [1, 2] and saved["learners"] == 2
    for row in rows:
        assert [e["epoch"] for e in row["epochs"]] == [1, 2]  # one point per epoch
        assert [e["samples"] for e in row["epochs"]] == [36, 72], row  # every training sample once per epoch
        assert all(e["val_accuracy"] is not None and e["train_loss"] > 0 for e in row["epochs"])
        assert 0 < row["epochs"][0]["elapsed_s"] < row["epochs"][1]["elapsed_s"]
        assert row["final_val_accuracy"] == row["epochs"][-1]["val_accuracy"]
        assert row["samples_per_s"] > 0
    assert rows[0]["bytes_sent_per_learner"] == 0  # one learner sends nothing
    assert rows[1]["bytes_sent_per_learner"] > 0  # every rank's CommStats, from its epoch-end progress events
    assert "staleness_p50" in rows[1] and "staleness_p50" not in rows[0]  # async only
    assert len(list((out / "results" / "jobs").iterdir())) == 2  # one job per run, each with its own results
    table = (out / "compare.md").read_text().splitlines()
    assert len(table) == 4 and table[2].startswith("| labswarm | 1 |") and table[3].startswith("| downpour | 2 |")
    for name in ("accuracy.png", "loss.png", "scaling.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_options_name_their_field_before_any_job(tmp_path: Path) -> None:
    experiment = tmp_path / "experiment.yml"
    experiment.write_text(yaml.safe_dump(training_experiment(write_three_classes(tmp_path / "data"),
                                                             tmp_path / "store")))
    for args, field in ((["--framework", "allreduse"], "framework"), (["--learners", "1,x"], "learners"),
                        (["--learners", "0"], "learners"), (["--framework", "easgd:tau=0"], "framework.tau"),
                        (["--framework", "downpour:n_push"], "framework.downpour"),
                        # batch: global cannot split the experiment's batch of 8 across 3 learners
                        (["--framework", "allreduce", "--learners", "1,3"], "framework.batch")):
        result = CliRunner().invoke(app, ["compare", str(experiment), *args, "--output", str(tmp_path / "out")])
        assert result.exit_code != 0 and field in result.output, (args, result.output)
    assert not (tmp_path / "out" / "results").exists()  # no job ran
