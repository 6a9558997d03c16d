"""Worker groups halted and resumed (issue 23): 2 groups of 2 under the real trainer, real learner processes (and
a shard). Each group halts on its own, and the members of a group resume from one position even when one member's
own checkpoint is older than its peer's (here: it has none, restarted before its first copy was stored): they agree
on the group's newest (``DistributedTraining.agree``); before, such a group stepped through different passes and
failed in a collective."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
from helpers import require
from three_classes import write_learner_experiment

from labswarm.config.experiment import parse_experiment
from labswarm.pipeline.pipeline import Pipeline
from labswarm.train import checkpoint

torch = require("torch")  # skips here, fails in CI (tests/helpers.py)

from distributed_run import logs, run_attempt  # noqa: E402 (imports torch)
from learners.tiny import kill_all, shard_port, start_shard  # noqa: E402

#: 4 learner processes twice, and a shard (each imports torch)
pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("group_halt_worker.py")
FRAMEWORK = {"name": "downpour", "group_size": 2, "timeout_s": 120}  # rank 0 validates alone, its peer waits


def test_two_worker_groups_halt_and_resume_and_a_restarted_group_agrees_on_its_position(
        three_classes: Path, tmp_path: Path) -> None:
    epochs = 2
    data, experiment, home = write_learner_experiment(three_classes, tmp_path, epochs=epochs)
    shard = start_shard(0, 4, tmp_path)
    spec = json.dumps(FRAMEWORK)
    try:
        addresses = [("127.0.0.1", shard_port(0, tmp_path, shard))]

        def attempt(number: int, mode: str, cursor: dict | None = None) -> dict[int, int]:
            return run_attempt(number, lambda _rank: [sys.executable, str(WORKER), str(experiment), str(home), spec,
                                                      mode], tmp_path, learners=4, cursor=cursor, timeout_s=600,
                               framework=FRAMEWORK, ps_addresses=addresses)

        # each group halts in its second pass after a step (one that gets no chunk of it completes instead)
        codes = attempt(1, "fresh")
        assert codes[0] == codes[1] in (0, 3) and codes[2] == codes[3] in (0, 3) and 3 in codes.values(), \
            logs(tmp_path)
        run = next((home / "train").iterdir())
        states = [checkpoint.load(run / f"rank-{r}" / "checkpoint.pt") for r in range(4)]
        positions = [(s["epoch"], (s["partial"] or {}).get("steps")) for s in states]
        assert positions[0] == positions[1] and positions[2] == positions[3], positions  # a group stops as one
        for rank in (0, 2):  # halted after a step of the second pass, or completed
            assert positions[rank] == (epochs, None) if codes[rank] == 0 else \
                (positions[rank][0] == 1 and positions[rank][1] >= 1), positions
        # rank 3 comes back without a checkpoint of its own (restarted before its first copy was stored) while
        # its group's peer resumes in the second pass (or after it)
        (run / "rank-3" / "checkpoint.pt").unlink()
        codes = attempt(2, "resume", states[0]["distributed"]["cursor"])
        assert codes == {r: 0 for r in range(4)}, logs(tmp_path)
    finally:
        kill_all([shard])
    assert "takes rank 2's checkpoint" in (tmp_path / "learner-2-3.log").read_text(), logs(tmp_path)
    with Pipeline(parse_experiment(data), split="train", train=False).epoch(0) as batches:
        train_ids = Counter(i for b in batches for i in b.ids)
    logged = [json.loads(line) for r in range(4) for line in (run / f"chunks-rank-{r}.jsonl").read_text().splitlines()]
    for pass_ in range(epochs):
        trained = Counter(i for c in logged if c["pass"] == pass_ for i in c["ids"])
        assert trained == train_ids, f"pass {pass_}: not every training sample exactly once across the halt"
    final = [checkpoint.load(run / f"rank-{r}" / "checkpoint.pt") for r in range(4)]
    assert [s["epoch"] for s in final] == [epochs] * 4
    for r in range(4):
        assert [m["epoch"] for m in checkpoint.read_metrics(run / f"rank-{r}" / "metrics.jsonl")] == \
            list(range(1, epochs + 1)), r
    buffers = ("running_mean", "running_var", "num_batches_tracked")  # batch-norm statistics: each rank's own
    for name, value in final[2]["model"].items():  # one replica per group: rank 3 took its group's, and kept it
        if not name.endswith(buffers):
            assert torch.equal(final[3]["model"][name], value), name
