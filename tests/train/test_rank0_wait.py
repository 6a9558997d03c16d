"""Rank 0 validating alone longer than the collective timeout (labswarm/train/distributed/rank0_wait.py): its peers
wait for it in the job's store, not in their next collective, so the job is not restarted. Real learner processes
(gloo) on the tiny set: ``model_averaging`` (synchronous, unequal replicas) and a worker group of 2 of
``distributed_hogwild`` (asynchronous groups); rank 0 sleeps past the timeout after each epoch, the last included
(then the peers wait for it before the framework's last sync). The timeout is 15 s, not shorter: it bounds every
collective of the run, the first rendezvous of two learners started seconds apart on a loaded machine included;
the group's run has one epoch (its wait before the last sync), model averaging two (between passes too)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import require
from three_classes import write_learner_experiment

from labswarm.train import checkpoint

torch = require("torch")  # skips here, fails in CI (tests/helpers.py)

from distributed_run import logs, run_attempt  # noqa: E402 (imports torch)

pytestmark = pytest.mark.slow  # real learner processes, and two sleeps of 2x the timeout

WORKER = Path(__file__).with_name("slow_validation_worker.py")
TIMEOUT_S = 15
#: Rank 0's sleep after each epoch: past the timeout by a margin.
SLEEP_S = TIMEOUT_S + 6


@pytest.mark.parametrize(("framework", "epochs"), [
    ({"name": "model_averaging", "timeout_s": TIMEOUT_S}, 2),
    ({"name": "distributed_hogwild", "group_size": 2, "timeout_s": TIMEOUT_S}, 1),
], ids=["model_averaging", "hogwild_group"])
def test_peers_outwait_a_rank_0_validating_longer_than_the_collective_timeout(
        three_classes: Path, tmp_path: Path, framework: dict[str, Any], epochs: int) -> None:
    _data, experiment, home = write_learner_experiment(three_classes, tmp_path, epochs=epochs)
    codes = run_attempt(1, lambda _rank: [sys.executable, str(WORKER), str(experiment), str(home),
                                          json.dumps(framework), str(SLEEP_S)], tmp_path, framework=framework)
    assert codes == {0: 0, 1: 0}, logs(tmp_path)  # without the store wait: gloo timed out, both exited 1
    run = next((home / "train").iterdir())
    ranks = [checkpoint.read_metrics(run / f"rank-{r}" / "metrics.jsonl") for r in range(2)]
    assert [r["epoch"] for r in ranks[0]] == list(range(1, epochs + 1)) == [r["epoch"] for r in ranks[1]]
    if epochs > 1:  # the wait between passes is in the next epoch's record (the last one's, before the last
        # sync, is in none: the exit codes above show it)
        assert ranks[1][1]["peer_wait_s"] >= TIMEOUT_S + 1  # it did wait for rank 0, past the timeout
