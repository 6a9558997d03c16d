"""``downpour`` with SINGA's worker groups (``group_size``), with real shard and learner processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from labswarm.errors import ConfigError
from labswarm.train.distributed.launch import plan_attempt, restart_scope
from learners.test_ps import run_job


def test_group_size_must_divide_the_learners_and_a_group_restarts_alone(tmp_path: Path) -> None:
    spec = {"name": "downpour", "group_size": 2}
    with pytest.raises(ConfigError) as info:
        plan_attempt(spec, 3, 1, ("h", 1), [("h", 2)], tmp_path)
    assert info.value.errors[0][0] == "framework.group_size"
    assert len(plan_attempt(spec, 4, 1, ("h", 1), [("h", 2)], tmp_path)) == 1 + 4
    # each group is a process group of its own (issue 23 item 3): a dead member's peers fail and restart alone too,
    # and the group meets again in a new generation; the other groups go on (tests/learners/test_ps_groups_job.py)
    assert restart_scope(spec) == "learner"
    assert restart_scope({"name": "downpour"}) == "learner"


@pytest.mark.slow  # 4 learners + a shard, each imports torch: 114-163 s at load ~24 on the 2 shared cores
def test_two_groups_of_two_learn_the_task_and_members_stay_equal(store: Any, master_env: dict[str, str],
                                                                  tmp_path: Path) -> None:
    steps = 40  # 0.97 accuracy after 60 steps, measured
    results = run_job({"name": "downpour", "group_size": 2, "n_fetch": 2}, tmp_path, n=4, shards=1, env=master_env,
                      wait_s=300,  # 4 learners on 2 cores shared by up to 7 test runs: 125 s seen for 60 steps
                      steps=steps, batch=16, lr=0.2, eval=True, data_seed=1, snapshots=list(range(1, steps + 1)))
    for first in (0, 2):  # one replica per group: equal after every step (the in-group all-reduce, the broadcast)
        a, b = results[first], results[first + 1]
        for step in range(1, steps + 1):
            for name, value in a["snapshots"][step].items():
                assert torch.equal(b["snapshots"][step][name], value), (first, step, name)
    # the groups differ: each steps on its own batches between pulls (asynchronous to each other)
    assert any(not torch.equal(results[0]["snapshots"][1][k], v) for k, v in results[2]["snapshots"][1].items())
    for result in results:  # the server's model (finish() pulled it); a linear 3-class task, chance 1/3
        assert result["accuracy"] > 0.85, result["accuracy"]
    leader, member = results[0]["stats"], results[1]["stats"]
    # leader: an all-reduce a step, a push a step, a pull + broadcast every 2 steps (stats taken before finish)
    assert leader["syncs"] == steps + steps + 2 * steps // 2
    assert member["syncs"] == steps + steps // 2 and "staleness_p50" not in member  # never talks to the server
    assert leader["staleness_max"] >= 1
