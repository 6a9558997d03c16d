"""The parameter-server frameworks with real shard and learner processes."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from labswarm.train.distributed.ps import assign_shards
from learners.test_collective import single_process
from learners.tiny import kill_all, logs, shard_port, start_learners, start_shard, wait_all, wait_for

#: real learner processes: each imports torch (4-7 s measured on the 2 shared, busy cores)
pytestmark = pytest.mark.slow

def run_job(framework: dict[str, Any], tmp_path: Path, n: int = 2, shards: int = 2, env: dict[str, str] | None = None,
            wait_s: float = 90, **spec: Any) -> list[dict]:
    """Start the shards, then ``n`` learners (the lifecycle's order) with ``env`` added to their environment, and wait
    up to ``wait_s`` for them; their results by rank."""
    procs: list[subprocess.Popen] = []
    try:
        shard_procs = [start_shard(k, n, tmp_path) for k in range(shards)]
        procs += shard_procs
        addrs = ",".join(f"127.0.0.1:{shard_port(k, tmp_path, p)}" for k, p in enumerate(shard_procs))
        learners = start_learners(n, {"framework": framework, "out": str(tmp_path), **spec},
                                  {"LABSWARM_PS_ADDRS": addrs, "LABSWARM_COLLECTIVE_TIMEOUT_S": "20", **(env or {})},
                                  tmp_path)
        procs += learners.values()
        wait_all(learners, wait_s, tmp_path)
    finally:
        kill_all(procs)
    return [torch.load(tmp_path / f"rank-{r}.pt") for r in range(n)]


def test_shard_assignment_is_balanced_and_deterministic() -> None:
    sizes = {"a.weight": 100, "a.bias": 10, "b.weight": 60, "b.bias": 3}
    assert assign_shards(sizes, 2) == {"a.weight": 0, "b.weight": 1, "a.bias": 1, "b.bias": 1}
    assert assign_shards(sizes, 1) == dict.fromkeys(sizes, 0)


def test_sandblaster_matches_one_learner_on_the_concatenated_batch(tmp_path: Path) -> None:
    steps, batch = 5, 8
    results = run_job({"name": "sandblaster"}, tmp_path, steps=steps, batch=batch, optimizer="adamw", lr=0.05)
    reference = single_process(steps, 2 * batch, "adamw", 0.05)
    for name, expected in reference.items():
        for result in results:
            torch.testing.assert_close(result["params"][name], expected, atol=1e-5, rtol=0)
    assert results[0]["stats"]["syncs"] == steps


@pytest.mark.parametrize("framework", [{"name": "downpour", "n_fetch": 2, "n_push": 1},
                                       {"name": "easgd", "alpha": 0.3, "tau": 2}], ids=lambda f: f["name"])
def test_asynchronous_frameworks_learn_the_task(framework: dict[str, Any], tmp_path: Path) -> None:
    results = run_job(framework, tmp_path, shards=1, steps=150, batch=16, lr=0.2, eval=True, data_seed=1)
    for result in results:  # the server's model (finish() pulled it); a linear 3-class task, chance 1/3
        assert result["accuracy"] > 0.85, result["accuracy"]
    if framework["name"] == "downpour":
        stats = results[0]["stats"]
        assert stats["syncs"] == 150 + 75  # a push a step, a pull every 2
        assert stats["staleness_max"] >= 1  # its own push between two pulls at least
    else:
        assert results[0]["stats"]["syncs"] == 75


def test_a_killed_shard_restarts_from_its_checkpoint_and_the_job_completes(tmp_path: Path) -> None:
    pause = tmp_path / "pause"
    pause.mkdir()
    procs: list[subprocess.Popen] = []
    try:
        shards = [start_shard(k, 2, tmp_path, every=5) for k in range(2)]
        procs += shards
        ports = [shard_port(k, tmp_path, p) for k, p in enumerate(shards)]
        learners = start_learners(2, {"framework": {"name": "downpour"}, "out": str(tmp_path), "steps": 100,
                                      "batch": 16, "lr": 0.2, "eval": True, "data_seed": 1,
                                      "pause": {"step": 20, "dir": str(pause)}},
                                  {"LABSWARM_PS_ADDRS": ",".join(f"127.0.0.1:{p}" for p in ports),
                                   "LABSWARM_COLLECTIVE_TIMEOUT_S": "60"}, tmp_path)
        procs += learners.values()
        wait_for(lambda: all((pause / f"paused-{r}").exists() for r in range(2)), 90, "both learners at step 20")
        shards[1].send_signal(signal.SIGKILL)
        assert shards[1].wait(timeout=10) == -signal.SIGKILL
        (pause / "go").touch()  # the learners' next push to shard 1 is refused: they retry while it restarts
        restarted = start_shard(1, 2, tmp_path, port=ports[1], every=5)
        procs.append(restarted)
        shard_port(1, tmp_path, restarted)
        wait_all(learners, 90, tmp_path)
    finally:
        kill_all(procs)
    resumed = re.findall(r"shard 1 resumed from .* at version (\d+)", (tmp_path / "shard-1.log").read_text())
    assert resumed == ["40"], logs(tmp_path)  # 2 learners x 20 pushes, checkpointed every 5: nothing lost
    state = torch.load(tmp_path / "ps" / "shard-1.pt")
    assert state["version"] >= 40 + 150  # the restarted shard went on (SIGKILL'd: the last periodic checkpoint)
    for r in range(2):
        assert torch.load(tmp_path / f"rank-{r}.pt")["accuracy"] > 0.85


def test_downpour_learner_killed_mid_pass_restarts_alone_and_every_sample_is_trained_once(
        store: Any, master_env: dict[str, str], tmp_path: Path) -> None:
    n_samples, passes = 800, 3
    spec = {"framework": {"name": "downpour"}, "out": str(tmp_path), "lr": 0.2, "eval": True, "data_seed": 1,
            "cursor": {"n_samples": n_samples, "chunk_size": 16, "lease_s": 1.0, "passes": passes}}
    procs: list[subprocess.Popen] = []
    try:
        shard = start_shard(0, 2, tmp_path)
        procs.append(shard)
        env = {**master_env, "LABSWARM_PS_ADDRS": f"127.0.0.1:{shard_port(0, tmp_path, shard)}"}
        # rank 1 trains 2 chunks, claims a third and hangs on it; rank 0 starts once it does
        first = start_learners(2, {**spec, "hold": {"1": 2}, "wait_go": [0]}, env, tmp_path)
        procs += first.values()
        wait_for(lambda: store.check(["holding"]), 90, "rank 1 to hold a chunk")
        first[1].send_signal(signal.SIGKILL)
        assert first[1].wait(timeout=10) == -signal.SIGKILL
        store.set("go", "1")
        again = start_learners(2, spec, env, tmp_path, ranks=[1])  # restarted alone: it pulls the parameters
        procs += again.values()
        wait_all({0: first[0], 1: again[1]}, 90, tmp_path)
    finally:
        kill_all(procs)
    records = [json.loads(line) for r in range(2) for line in (tmp_path / f"rank-{r}.jsonl").read_text().splitlines()]
    for pass_ in range(passes):
        counts = Counter(s for r in records if r["pass"] == pass_ for s in r["samples"])
        assert sorted(counts) == list(range(n_samples)) and set(counts.values()) == {1}, f"pass {pass_}"
    held_pass, held_index = map(int, store.get("holding").decode().split("/"))
    assert sum((r["pass"], r["chunk"]) == (held_pass, held_index) for r in records) == 1
    for r in range(2):
        assert torch.load(tmp_path / f"rank-{r}.pt")["accuracy"] > 0.85, logs(tmp_path)
