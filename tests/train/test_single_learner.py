"""``labswarm train`` reads the training split as a job's learners do (labswarm/train/distributed/single.py): the
console script with ``LABSWARM_LEARNER_KEEP_BYTES=0`` streams the features from the store, one batch read ahead,
and its epochs' losses equal those of the same training with the split kept in memory (the same crops of the same
samples in the same order: streaming changes where the bytes come from, nothing else); the pipeline's reading
differs from both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import require
from three_classes import training_experiment, write_three_classes

from labswarm.config.experiment import parse_experiment
from labswarm.pipeline.features import FeaturesBlock
from labswarm.sample import iter_samples

require("torch")  # skips here, fails in CI (tests/helpers.py)

from labswarm.train.distributed.single import SingleLearner  # noqa: E402 (after the torch check)
from labswarm.train.trainer import Trainer  # noqa: E402


def _losses(records: list[dict]) -> list[float]:
    return [r["train_loss"] for r in records]


@pytest.mark.slow
def test_labswarm_train_streams_like_a_learner_and_trains_as_it_does_in_memory(tmp_path: Path) -> None:
    root = write_three_classes(tmp_path / "data", per_class=6)
    data = training_experiment(root, tmp_path / "store", training={"epochs": 2, "learning_rate": 0.01,
                                                                    "validation": 0.25, "threads": 1})
    data["pipeline"][3]["frames"] = 24  # random crops, re-drawn each epoch
    config = parse_experiment(data)
    block = FeaturesBlock(config)
    for sample in iter_samples(config):
        assert block.process(sample).status == "computed"
    lines: list[str] = []
    hooks = SingleLearner(report=lines.append)
    kept = Trainer(config, tmp_path / "home-kept", distributed=hooks).fit()
    assert hooks.samples is not None and not hooks.samples.streaming and hooks.samples.nbytes > 0
    assert "MB of features in memory" in lines[0]
    n = len(hooks.samples.positions)
    assert [r["samples"] for r in kept.metrics] == [n, n]  # every training sample once per epoch
    assert all(r["data_wait_s"] > 0 for r in kept.metrics)  # each chunk's crops read in its step
    piped = Trainer(config, tmp_path / "home-piped").fit()  # the pipeline's reading: other crops and order
    assert _losses(piped.metrics) != pytest.approx(_losses(kept.metrics))

    experiment = tmp_path / "three.yml"
    experiment.write_text(yaml.safe_dump(data))
    env = {**os.environ, "COLUMNS": "200", "LABSWARM_HOME": str(tmp_path / "home-cli"),
           "LABSWARM_LEARNER_KEEP_BYTES": "0"}
    done = subprocess.run([sys.executable, "-m", "labswarm.cli", "train", str(experiment), "--no-compute"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{n} training samples, streamed from the store (one batch read ahead" in done.stdout, done.stdout
    [metrics] = (tmp_path / "home-cli" / "train").glob("*/metrics.jsonl")
    streamed = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["samples"] for r in streamed] == [n, n]
    assert all(r["data_wait_s"] > 0 for r in streamed)  # each epoch's first chunk read in its step, not ahead
    assert _losses(streamed) == pytest.approx(_losses(kept.metrics), rel=1e-6)
