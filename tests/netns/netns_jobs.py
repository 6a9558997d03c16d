"""Training jobs spread over a :class:`labswarm.netns.Cluster`'s hosts: the manager runs in the test's process on
the gateway address (``198.18.0.1``: the learners report to it and reach the job's coordinator there); its local
learner launcher starts each rank's learner on its host (``ip netns exec``, through a wrapper in place of the
interpreter) with gloo on the host's ``eth0``; the job's parameter-server shards run on a host of their own
(:class:`HostShards`) or on the gateway (:class:`~labswarm.jobs.lifecycle.cluster.LocalShards`)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from labswarm.deploy import local_learners
from labswarm.deploy.learners import LearnerLaunch
from labswarm.jobs.lifecycle.cluster import LocalShards
from labswarm.netns import GATEWAY, Cluster

#: The first shard's port on its host (the host's namespace has nothing else listening).
SHARD_PORT = 29600


class HostShards(LocalShards):
    """A job's shards as processes on host ``host`` of ``cluster`` (``ip netns exec``), listening on its address
    (ports from :data:`SHARD_PORT`), checkpointing into ``home/ps`` (the filesystem is shared); the coordinator
    stays in the manager's process on the gateway."""

    def __init__(self, job_id: str, home: Path, cluster: Cluster, host: str) -> None:
        super().__init__(job_id, home, GATEWAY)
        self.cluster, self.shard_host = cluster, host

    def address(self, index: int) -> tuple[str, int]:
        return self.cluster.address(self.shard_host), SHARD_PORT + index

    def start(self, index: int, argv: list[str], env: dict[str, str], wait: bool = True) -> None:
        super().start(index, self.cluster.command(self.shard_host, argv), env, wait)


def on_hosts(cluster: Cluster, launcher: local_learners.LocalLearners, home: Path, wrapper: Path,
             manager_url: str, monkeypatch: pytest.MonkeyPatch, hosts: dict[int, str],
             shard_host: str | None = None) -> None:
    """Make the manager's local learner launcher start rank ``r`` on host ``hosts[r]`` (reporting to
    ``manager_url``), host the job's coordinator on the gateway address and its shards (under ``home``) on
    ``shard_host`` (``None``: on the gateway too)."""
    wrapper.write_text(f'#!/bin/sh\nexec ip netns exec "$LABSWARM_TEST_NETNS" {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setattr(local_learners, "sys", type("Sys", (), {"executable": str(wrapper)}))
    start = launcher.start

    def start_on_host(launch: LearnerLaunch):
        env = {**launch.env, "LABSWARM_TEST_NETNS": cluster.host(hosts[launch.rank]).netns,
               "GLOO_SOCKET_IFNAME": "eth0"}
        return start(replace(launch, env=env, spec={**launch.spec, "manager_url": manager_url}))

    def shards(job_id: str) -> LocalShards:
        if shard_host is None:
            return LocalShards(job_id, home / job_id, GATEWAY)
        return HostShards(job_id, home / job_id, cluster, shard_host)

    monkeypatch.setattr(launcher, "start", start_on_host)
    monkeypatch.setattr(launcher, "shard_runner", shards, raising=False)
