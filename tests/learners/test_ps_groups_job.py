"""``downpour`` worker groups in a training job: the trainer's distributed mode, the lifecycle's restart scope."""

from __future__ import annotations

from pathlib import Path

import pytest
from jobs.chunk_record import assert_every_sample_once_per_pass
from jobs.manager import manager, statuses
from jobs.test_distributed_jobs import _distributed, _results, kill_learner_after_first_checkpoint

#: a real manager, a shard and 2 learner processes per attempt (each imports torch)
pytestmark = pytest.mark.slow


def test_a_dead_group_member_restarts_the_attempt_and_the_job_completes(tmp_path: Path) -> None:
    # one group of 2: a member killed -9 fails its peer's next in-group all-reduce; both restart from the checkpoint
    manifest = _distributed(tmp_path, {"name": "downpour", "group_size": 2, "n_fetch": 2}, epochs=3)
    with manager(tmp_path, job_slots=2) as m:
        job = m.submit(manifest)
        stream, shown, metrics = kill_learner_after_first_checkpoint(m, job["id"])
    assert statuses(stream)[-1] == "completed", shown.get("log_tail")
    attempts = shown["attempts"]
    # one new attempt, never the dead learner alone. A third attempt was seen once in 3 runs at load 16-24 and the
    # assertion was loosened to >= 2, which hid why the second one ended: it is exact again, and a failure says how
    # each attempt ended (4 runs at load ~7 gave exactly 2)
    ended = [(a["number"], a["error_code"], a["reason"], [(lr["rank"], lr["exit_code"], lr["killed"])
                                                          for lr in a["learners"]]) for a in attempts]
    assert len(attempts) == 2 and not any(a.get("learner_restarts") for a in attempts), ended
    assert attempts[0]["error_code"] is not None and attempts[-1]["exit_code"] == 0
    assert attempts[-1]["checkpoint_in"]["epoch"] >= 1
    assert sorted(lr["rank"] for lr in attempts[-1]["learners"]) == [0, 1]
    assert [r["epoch"] for r in metrics] == [1, 2, 3]  # every epoch once
    assert metrics[-1]["comm"]["syncs"] > 0 and "staleness_p50" in metrics[-1]["comm"]  # rank 0 leads its group
    assert_every_sample_once_per_pass(_results(tmp_path, job["id"]), shown, manifest, 3)
