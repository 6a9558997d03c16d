"""A framework named by its SINGA topology trains as the named framework did (issue 23 item 1): real learner
processes on gloo (``tests/learners/worker.py``), the same seed, parameters compared exactly."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from helpers import require

from labswarm.config.manifest import parse_manifest

torch = require("torch")

#: real learner processes: each imports torch (4-7 s on the 2 shared cores)
pytestmark = pytest.mark.slow


@pytest.fixture
def stores() -> Iterator[Any]:
    """Makes the rendezvous part of a learner's environment, each call a fresh ``TCPStore`` on a free loopback port
    (a process group's keys are per store: two runs on one store would meet each other's)."""
    from torch.distributed import TCPStore

    servers: list[Any] = []

    def make() -> dict[str, str]:
        servers.append(TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                timeout=timedelta(seconds=10)))
        return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(servers[-1].port),
                "LABSWARM_COLLECTIVE_TIMEOUT_S": "20"}

    yield make
    servers.clear()


def resolved(learners: int, framework: dict[str, Any]) -> dict[str, Any]:
    """The framework spec a job of ``learners`` learners runs (what its learners get: the resolved manifest's)."""
    job = parse_manifest({"name": "job", "experiment": "music_speech_noise", "learners": learners,
                          "framework": framework, "results_store": {"name": "local", "path": "/tmp/results"}})
    return job.resolved()["framework"]


def run(spec: dict[str, Any], env: dict[str, str], out: Path) -> list[dict[str, Any]]:
    """Two learners of the tiny task under ``spec`` (AdamW, 4 steps of 8 samples each); their results by rank."""
    from learners.tiny import kill_all, start_learners, wait_all

    out.mkdir()
    procs = start_learners(2, {**spec, "out": str(out)}, env, out)
    try:
        wait_all(procs, 90, out)
    finally:
        kill_all(procs.values())
    return [torch.load(out / f"rank-{r}.pt") for r in range(2)]


@pytest.mark.parametrize(("named", "topology"), [
    ({"name": "allreduce"}, {"worker_groups": 1, "workers_per_group": 2}),
    ({"name": "model_averaging", "period": 3},  # Distributed Hogwild's topology, run by name as model_averaging
     {"name": "model_averaging", "topology": {"worker_groups": 2, "workers_per_group": 1, "server_groups": 2,
                                              "sync_period": 3}}),
], ids=["allreduce", "model_averaging"])
def test_the_topology_trains_the_same_parameters_as_the_named_framework(
        named: dict[str, Any], topology: dict[str, Any], stores: Any, tmp_path: Path) -> None:
    by_topology = resolved(2, topology if "name" in topology else {"topology": topology})
    assert by_topology["name"] == named["name"] and by_topology == resolved(2, named)
    steps = {"steps": 4, "batch": 8, "optimizer": "adamw", "lr": 0.05, "snapshots": [2, 4]}
    before = run({**steps, "framework": named}, stores(), tmp_path / "named")  # the spec as written before
    after = run({**steps, "framework": by_topology}, stores(), tmp_path / "topology")
    moved = False
    for rank in range(2):
        for name, value in before[rank]["params"].items():
            assert torch.equal(after[rank]["params"][name], value), (rank, name)
            moved |= not torch.equal(value, before[rank]["snapshots"][2][name])
        for step in (2, 4):
            for name, value in before[rank]["snapshots"][step].items():
                assert torch.equal(after[rank]["snapshots"][step][name], value), (rank, step, name)
    assert moved  # the steps changed the parameters: the comparison can fail
    assert before[0]["stats"] == after[0]["stats"]
