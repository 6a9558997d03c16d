"""The trainer's distributed mode with real learner processes (gloo, 2 allreduce learners) on the tiny real-audio
set: lockstep, equal replicas, a halt in the middle of an epoch and the resume that continues its pass."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers import require
from three_classes import write_learner_experiment

from labswarm.config.experiment import parse_experiment
from labswarm.pipeline.pipeline import Pipeline
from labswarm.train import checkpoint
from labswarm.train.trainer import Trainer, TrainerHooks, load_model

torch = require("torch")  # skips here, fails in CI (tests/helpers.py)

from distributed_run import logs, run_attempt  # noqa: E402 (imports torch)

#: real learner processes: each imports torch (several s on the 2 shared cores)
pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("halt_worker.py")


def test_allreduce_learners_halted_mid_epoch_resume_the_pass_train_each_sample_once_and_stay_equal(
        three_classes: Path, tmp_path: Path) -> None:
    data, experiment, home = write_learner_experiment(three_classes, tmp_path, epochs=2)
    # 36 training samples, the experiment's batch of 4 split across the 2 learners (batch: global, the default):
    # chunks of 2, 18 a pass, 9 lockstep steps (one learner's 9 steps of 4); rank 1 alone asks to stop after its
    # 2nd step: both stop there (4 chunks done), the 2 chunks claimed for step 3 go back
    codes = run_attempt(1, lambda rank: [sys.executable, str(WORKER), str(experiment), str(home),
                                         "2" if rank == 1 else "0", "fresh"], tmp_path)
    assert codes == {0: 3, 1: 3}, logs(tmp_path)
    run = next((home / "train").iterdir())
    states = [checkpoint.load(run / f"rank-{r}" / "checkpoint.pt") for r in range(2)]
    assert [(s["epoch"], s["partial"]["steps"], s["partial"]["seen"]) for s in states] == [(0, 2, 4)] * 2
    cursor = states[0]["distributed"]["cursor"]
    values = cursor["passes"][0]
    assert cursor["chunk_size"] == 2
    assert sum(v.startswith("D|") for v in values) == 4 and values.count("") == 14  # claimed-untrained: free

    # attempt 2 through the learner command, from a fresh coordinator given rank 0's cursor (the deployer's way)
    codes = run_attempt(2, lambda _rank: [sys.executable, "-m", "labswarm.train.distributed.learner", str(experiment),
                                          "--home", str(home), "--framework", '{"name": "allreduce"}', "--resume"],
                        tmp_path, cursor=cursor)
    assert codes == {0: 0, 1: 0}, logs(tmp_path)
    config = parse_experiment(data)
    with Pipeline(config, split="train", train=False).epoch(0) as batches:
        train_ids = Counter(i for b in batches for i in b.ids)
    assert len(train_ids) == 36 and set(train_ids.values()) == {1}  # 18 training sources × 2 transformations
    lines = {r: (run / f"chunks-rank-{r}.jsonl").read_text().splitlines() for r in range(2)}
    logged = [json.loads(line) for r in range(2) for line in lines[r]]
    assert all(c["pass"] == 0 for r in range(2) for c in map(json.loads, lines[r][:2]))  # both trained in pass 0
    for pass_ in range(2):
        trained = Counter(i for c in logged if c["pass"] == pass_ for i in c["ids"])
        assert trained == train_ids, f"pass {pass_}: not every training sample exactly once across the halt"
    assert {len(c["ids"]) for c in logged} == {2}  # each step's batch: half the experiment's

    ranks = [checkpoint.read_metrics(run / f"rank-{r}" / "metrics.jsonl") for r in range(2)]
    assert [r["epoch"] for r in ranks[0]] == [1, 2] == [r["epoch"] for r in ranks[1]]
    assert "val_accuracy" in ranks[0][-1] and "val_accuracy" not in ranks[1][-1]  # rank 0 validates
    assert ranks[0][0]["samples"] + ranks[1][0]["samples"] == 36  # the halted epoch's sums went on
    assert ranks[0][0]["steps"] == ranks[1][0]["steps"] == 9  # lockstep, across the halt
    for r in (ranks[0][1], ranks[1][1]):  # the wait for the peers (rank 0's validation) is out of epoch_s
        assert r["peer_wait_s"] >= 0 and r["samples_per_s"] == pytest.approx(r["samples"] / r["epoch_s"])
        assert r["epoch_s"] + r["peer_wait_s"] <= r["elapsed_s"]
    final = [checkpoint.load(run / f"rank-{r}" / "checkpoint.pt") for r in range(2)]
    buffers = ("running_mean", "running_var", "num_batches_tracked")  # batch-norm statistics: each rank's own
    params = [n for n in final[0]["model"] if not n.endswith(buffers)]
    assert len(params) >= 4
    for name in params:  # the same parameters on both ranks at the end
        assert torch.equal(final[0]["model"][name], final[1]["model"][name]), name
    assert final[0]["distributed"]["framework"]["name"] == "allreduce"
    assert all(v.startswith("D|") for p in final[0]["distributed"]["cursor"]["passes"].values() for v in p)
    assert any((home / "models").iterdir())  # rank 0 wrote the model
    # shared validation: each rank validated its shard with rank 0's parameters and statistics; the all-reduced
    # figures are those of the model file over the whole validation split in one process
    model_file = next((home / "models").iterdir())
    model, _ = load_model(model_file)
    trainer = Trainer(config, home)
    whole = trainer.validate(model)
    last = ranks[0][-1]
    assert whole["val_samples"] == last["val_samples"] > 0
    assert whole["val_confusion"] == last["val_confusion"]
    assert whole["val_loss"] == pytest.approx(last["val_loss"], rel=1e-4)
    # one learner (the single-process trainer) on the same experiment takes as many optimizer steps a pass as
    # the two learners of the global batch did: 9 steps of the experiment's 4 (a whole step each: same updates)
    counted = StepCount()
    Trainer(parse_experiment({**data, "training": {**data["training"], "epochs": 1}}), tmp_path / "one",
            hooks=[counted]).fit()
    assert counted.steps == ranks[0][0]["steps"]


class StepCount(TrainerHooks):
    """Counts the trainer's optimizer steps."""

    def __init__(self) -> None:
        self.steps = 0

    def after_step(self, trainer: Any, epoch: int, step: int, loss: float) -> None:
        self.steps += 1
