"""A distributed job's local shards (labswarm.jobs.lifecycle.cluster) with real shard processes: a shard serves on
the port it bound itself and the learners' plans name that port; a revived shard takes its port back; a port
another process took after the shard's death does not fail the job's next attempts (it takes a new one)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from helpers import wait_until

from labswarm.jobs.lifecycle.cluster import JobCluster
from labswarm.train.distributed.context import LearnerContext


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _learners_ports(plans: list) -> set[int]:
    return {port for plan in plans for _host, port in LearnerContext.from_env(plan.env).ps_addresses}


@pytest.mark.slow  # 3 real shard processes, each imports torch (4-7 s each on the 2 shared cores)
def test_a_shard_serves_on_its_own_port_and_a_port_taken_after_its_death_goes_to_the_next_attempt(
        tmp_path: Path) -> None:
    cluster = JobCluster("job1", tmp_path, {"name": "downpour"}, 2, 1)
    try:
        first = cluster.new_attempt(1, None)
        ((_host, port),) = cluster.ps_addresses
        assert port != 0 and _listening(port) and _learners_ports(first) == {port}
        assert cluster.where()["ps"] == [f"127.0.0.1:{port}"]
        (pid,) = cluster.shard_pids
        cluster.runner.procs[0].kill()  # the shard dies
        wait_until(lambda: cluster.dead_shards() == [0], "the killed shard found dead", 30)
        with socket.socket() as thief:  # another process of the machine takes its port before the revival
            thief.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            thief.bind(("127.0.0.1", port))
            thief.listen()
            cluster.revive(0)  # the learners know the old port: the revived shard tries it, and cannot bind it
            assert cluster.shard_pids != [pid]
            wait_until(lambda: cluster.dead_shards() == [0], "the revived shard exiting on its taken port", 120)
            cluster.stop_shards()  # the attempt ends (beyond the platform budget, or its learners failed)
            second = cluster.new_attempt(2, None)  # the port is still taken: the shard takes another
            ((_host, new_port),) = cluster.ps_addresses
            assert new_port not in (0, port) and _listening(new_port) and _learners_ports(second) == {new_port}
            assert cluster.dead_shards() == []
    finally:
        cluster.close()
    assert not _listening(new_port)
