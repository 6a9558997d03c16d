"""The trainer's distributed mode with real learner processes (gloo, 2 learners) on the tiny real-audio set."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from three_classes import training_experiment

from labswarm.config import parse_experiment
from labswarm.pipeline.pipeline import Pipeline
from labswarm.train import checkpoint

torch = pytest.importorskip("torch")

#: real learner processes: each imports torch (several s on the 2 shared cores)
pytestmark = pytest.mark.slow


def _experiment(three_classes: Path, tmp_path: Path, epochs: int = 2) -> Path:
    data = training_experiment(three_classes, tmp_path / "store",
                               training={"epochs": epochs, "learning_rate": 0.01, "validation": 0.25, "threads": 1})
    path = tmp_path / "experiment.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_allreduce_through_the_trainer_gives_equal_replicas_and_trains_each_sample_once_per_epoch(
        three_classes: Path, tmp_path: Path) -> None:
    from distributed_run import logs, run_attempt

    path, home = _experiment(three_classes, tmp_path), tmp_path / "home"
    codes = run_attempt(1, lambda _rank: [sys.executable, "-m", "labswarm.learners.learner", str(path), "--home",
                                          str(home), "--framework", '{"name": "allreduce"}'], tmp_path)
    assert codes == {0: 0, 1: 0}, logs(tmp_path)
    runs = sorted((home / "train").glob("*/rank-*/metrics.jsonl"), key=lambda p: int(p.parent.name[5:]))
    ranks = [checkpoint.read_metrics(p) for p in runs]
    assert [len(r) for r in ranks] == [2, 2]
    assert "val_accuracy" in ranks[0][-1] and "val_accuracy" not in ranks[1][-1]  # rank 0 validates
    assert ranks[0][-1]["steps"] == ranks[1][-1]["steps"]  # lockstep
    run = next((tmp_path / "home" / "train").iterdir())
    states = [checkpoint.load(run / f"rank-{r}" / "checkpoint.pt") for r in range(2)]
    buffers = ("running_mean", "running_var", "num_batches_tracked")  # batch-norm statistics: each rank's own
    params = [n for n in states[0]["model"] if not n.endswith(buffers)]
    assert len(params) >= 4
    for name in params:  # the same parameters on both ranks after the epoch
        assert torch.equal(states[0]["model"][name], states[1]["model"][name]), name
    assert states[0]["distributed"]["framework"]["name"] == "allreduce"
    cursor = states[0]["distributed"]["cursor"]
    assert all(v.startswith("D|") for p in cursor["passes"].values() for v in p)

    config = parse_experiment(yaml.safe_load(path.read_text()))
    with Pipeline(config, split="train", train=False).epoch(0) as batches:
        train_ids = Counter(i for b in batches for i in b.ids)
    assert len(train_ids) == 36 and set(train_ids.values()) == {1}  # 18 training sources × 2 transformations
    lines = {r: (run / f"rank-{r}" / "chunks.jsonl").read_text().splitlines() for r in range(2)}
    assert all(lines.values())  # both ranks trained chunks
    logged = [json.loads(line) for r in range(2) for line in lines[r]]
    for epoch in range(2):
        trained = Counter(i for c in logged if c["pass"] == epoch for i in c["ids"])
        assert trained == train_ids, f"epoch {epoch + 1}: not every training sample exactly once"
    assert sum(r[0]["samples"] for r in ranks) == 36
