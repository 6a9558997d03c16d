"""``labswarm compare`` with real learner processes (gloo, 2 learners) on the tiny real-audio set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from train.three_classes import training_experiment, write_three_classes
from typer.testing import CliRunner

from labswarm.cli import app

#: real learner processes: each imports torch (several s on the 2 shared cores)
pytestmark = pytest.mark.slow


def test_compare_writes_the_table_the_json_and_the_plots_with_one_point_per_epoch(tmp_path: Path) -> None:
    root = write_three_classes(tmp_path / "data")
    experiment = tmp_path / "experiment.yml"
    experiment.write_text(yaml.safe_dump(training_experiment(root, tmp_path / "store")))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["compare", str(experiment), "--frameworks", "allreduce,downpour",
                                      "--learners", "2", "--epochs", "2", "--target", "0.5", "--output", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "compare.json").read_text())
    assert [r["framework"] for r in data["rows"]] == ["allreduce", "downpour"]
    for row in data["rows"]:
        assert [e["epoch"] for e in row["epochs"]] == [1, 2]  # one point per epoch
        assert [e["samples"] for e in row["epochs"]] == [36, 72]  # every training sample once per epoch
        assert all(e["val_accuracy"] is not None and e["train_loss"] > 0 for e in row["epochs"])
        assert row["epochs"][0]["elapsed_s"] < row["epochs"][1]["elapsed_s"]
        assert row["final_val_accuracy"] == row["epochs"][-1]["val_accuracy"]
        assert row["bytes_sent_per_learner"] > 0 and row["samples_per_s"] > 0
    assert "staleness_p50" in data["rows"][1] and "staleness_p50" not in data["rows"][0]  # async only
    table = (out / "compare.md").read_text().splitlines()
    assert len(table) == 4 and table[2].startswith("| allreduce |") and table[3].startswith("| downpour |")
    for name in ("accuracy.png", "loss.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
