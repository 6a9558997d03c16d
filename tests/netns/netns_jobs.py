"""Training jobs spread over a :class:`labswarm.netns.Cluster`'s hosts through the product's placement
(:mod:`labswarm.compare.hosts`, what ``labswarm compare --hosts`` uses): the manager runs in the test's process on
the gateway address (``198.18.0.1``: the learners report to it and reach the job's coordinator there); its local
learner launcher starts rank ``r``'s learner on ``hosts[r % len(hosts)]`` (``ip netns exec {host}`` as the host
command) with gloo on the host's ``eth0``, and the job's parameter-server shards on the last host."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from labswarm.compare.hosts import SHARD_PORT, parse_hosts, place
from labswarm.deploy.local_learners import LocalLearners
from labswarm.netns import GATEWAY, Cluster

__all__ = ["SHARD_PORT", "on_hosts"]


def on_hosts(cluster: Cluster, launcher: LocalLearners, home: Path, hosts: Sequence[str]) -> None:
    """Make the manager's local learner launcher start rank ``r`` on ``hosts[r % len(hosts)]`` of ``cluster``, the
    job's shards (checkpointing under ``home``) on ``hosts[-1]``, its coordinator on the gateway."""
    placed = parse_hosts([f"{cluster.host(h).netns}={cluster.address(h)}" for h in hosts], GATEWAY,
                         "ip netns exec {host}", env={"GLOO_SOCKET_IFNAME": "eth0"})
    place(launcher, placed, home)
