"""A halt between two passes under an asynchronous framework (downpour, real learner and shard processes): the
learner asked to stop during its validation stops the next pass before its first step, and its checkpoint's cursor is
read only once the other learner, still training that pass, has stopped; the resume trains every sample of every pass
exactly once."""

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

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("async_halt_worker.py")


def test_a_halt_between_passes_waits_for_the_peer_still_training_the_next_pass(three_classes: Path,
                                                                               tmp_path: Path) -> None:
    data, experiment, home = write_learner_experiment(three_classes, tmp_path, epochs=2)
    shard = start_shard(0, 2, tmp_path)
    try:
        addresses = [("127.0.0.1", shard_port(0, tmp_path, shard))]
        # rank 0 asks to stop once its first epoch ended; rank 1 trains 3 chunks of the second pass, 2 of them after
        roles = {0: "boundary", 1: "late"}
        codes = run_attempt(1, lambda rank: [sys.executable, str(WORKER), str(experiment), str(home), roles[rank],
                                             "fresh"], tmp_path, framework={"name": "downpour"},
                            ps_addresses=addresses)
        assert codes == {0: 3, 1: 3}, logs(tmp_path)
        run = next((home / "train").iterdir())
        states = [checkpoint.load(run / f"rank-{r}" / "checkpoint.pt") for r in range(2)]
        # rank 0 stopped the second pass before its first step; rank 1 after its third
        assert [(s["epoch"], s["partial"]["steps"]) for s in states] == [(1, 0), (1, 3)], logs(tmp_path)
        cursor = states[0]["distributed"]["cursor"]
        assert sum(v.startswith("D|") for v in cursor["passes"][1]) == 3  # rank 1's, marked after rank 0 stopped

        codes = run_attempt(2, lambda rank: [sys.executable, str(WORKER), str(experiment), str(home), "none",
                                             "resume"], tmp_path, cursor=cursor, framework={"name": "downpour"},
                            ps_addresses=addresses)
        assert codes == {0: 0, 1: 0}, logs(tmp_path)
    finally:
        kill_all([shard])
    with Pipeline(parse_experiment(data), split="train", train=False).epoch(0) as batches:
        train_ids = Counter(i for b in batches for i in b.ids)
    assert len(train_ids) == 36 and set(train_ids.values()) == {1}
    logged = [json.loads(line) for r in range(2)
              for line in (run / f"chunks-rank-{r}.jsonl").read_text().splitlines()]
    for pass_ in range(2):
        trained = Counter(i for c in logged if c["pass"] == pass_ for i in c["ids"])
        assert trained == train_ids, f"pass {pass_}: not every training sample exactly once across the halt"
