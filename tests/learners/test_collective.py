"""``allreduce`` and ``model_averaging`` with real learner processes on gloo (CPU)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import wait_until

from learners.tiny import kill_all, start_learners, tiny_batch, tiny_model, wait_all

#: real learner processes: each imports torch (4-7 s measured on the 2 shared, busy cores)
pytestmark = pytest.mark.slow

def run(n: int, spec: dict[str, Any], env: dict[str, str], tmp_path: Path) -> list[dict[str, Any]]:
    """Run ``n`` learners of ``spec`` to completion; their results by rank."""
    spec = {**spec, "out": str(tmp_path)}
    procs = start_learners(n, spec, env, tmp_path)
    try:
        wait_all(procs, 60, tmp_path)
    finally:
        kill_all(procs.values())
    return [torch.load(tmp_path / f"rank-{r}.pt") for r in range(n)]


def single_process(steps: int, batch: int, optimizer: str, lr: float) -> dict[str, Any]:
    """The reference: one process trained on the concatenated batches."""
    model = tiny_model(torch)
    opt = {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW}[optimizer](model.parameters(), lr=lr)
    for step in range(steps):
        x, y = tiny_batch(torch, step, batch)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model.state_dict()


def test_allreduce_matches_one_learner_on_the_concatenated_batch(master_env: dict[str, str], tmp_path: Path) -> None:
    # AdamW, the trainer's optimizer: its update is not linear in the gradient, so only an exact mean matches
    steps, batch, optimizer = 5, 8, "adamw"
    results = run(2, {"framework": {"name": "allreduce"}, "steps": steps, "batch": batch, "optimizer": optimizer,
                      "lr": 0.05}, master_env, tmp_path)
    reference = single_process(steps, 2 * batch, optimizer, 0.05)
    start = tiny_model(torch).state_dict()
    for name, expected in reference.items():
        assert not torch.allclose(expected, start[name])  # the steps moved the parameters
        for result in results:
            torch.testing.assert_close(result["params"][name], expected, atol=1e-5, rtol=0)
        assert torch.equal(results[0]["params"][name], results[1]["params"][name])
    n_params = sum(p.numel() for p in reference.values())
    assert results[0]["stats"]["bytes_sent"] == steps * n_params * 4  # ring: 2 (N-1)/N = 1 of the gradient


def test_model_averaging_equal_after_an_average_apart_between(master_env: dict[str, str], tmp_path: Path) -> None:
    # the batches differ per rank, so the replicas drift apart between averages (after steps 1, 4, 7)
    results = run(2, {"framework": {"name": "model_averaging", "period": 3}, "batch": 8, "lr": 0.1, "steps": 7,
                      "snapshots": [6, 7]}, master_env, tmp_path)
    after_local_steps, after_average = (tuple(r["snapshots"][s] for r in results) for s in (6, 7))
    assert any(not torch.allclose(after_local_steps[1][k], v) for k, v in after_local_steps[0].items())
    for name, value in after_average[0].items():
        torch.testing.assert_close(after_average[1][name], value, atol=1e-6, rtol=0)
    assert results[0]["stats"]["syncs"] == 3
    # 7 steps of allreduce would send 7 times the model's bytes (ring, N=2): averaging sent 3 of those
    n_params = sum(p.numel() for p in after_average[0].values())
    assert results[0]["stats"]["bytes_sent"] == 3 * n_params * 4


def test_a_hung_peer_fails_the_collective_within_the_timeout(store: Any, master_env: dict[str, str],
                                                              tmp_path: Path) -> None:
    # rank 1 joins more than the 3-s collective timeout after rank 0 (learners start seconds apart, each importing
    # torch): the first join is bounded by JOIN_TIMEOUT_S instead, so both train; rank 1 then stops before step 3,
    # and rank 0's next collective must fail within the 3 s, not torch's 30 min default
    spec = {"framework": {"name": "model_averaging", "period": 2}, "batch": 4, "steps": 5, "hang": [1, 3],
            "out": str(tmp_path)}
    env = {**master_env, "LABSWARM_COLLECTIVE_TIMEOUT_S": "3"}
    keys = store.num_keys()
    procs = start_learners(2, spec, env, tmp_path, ranks=[0])
    try:
        wait_until(lambda: store.num_keys() > keys or procs[0].poll() is not None, "rank 0 in its join", 120)
        time.sleep(6)  # rank 1 late by twice the collective timeout (the lateness under test, not a wait)
        procs |= start_learners(2, spec, env, tmp_path, ranks=[1])
        code = procs[0].wait(timeout=120)
        hanging = procs[1].poll() is None  # joined, trained steps 1-2, sleeping before step 3
    finally:
        kill_all(procs.values())
    log = (tmp_path / "learner-0.log").read_text()
    assert code != 0 and "timed out waiting 3000ms" in log.lower(), log[-2000:]
    assert hanging, (tmp_path / "learner-1.log").read_text()[-2000:]
    assert not (tmp_path / "rank-0.pt").exists()
