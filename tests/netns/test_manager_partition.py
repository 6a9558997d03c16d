"""The manager partitioned from the broker for 20 s while it publishes a session: it resumes when the partition
heals, and the ledger holds every sample once, none lost, none published twice.

Hosts: ``a`` the manager, ``b`` a worker; RabbitMQ is the machine's, through the gateway. The partition drops
only ``a``'s traffic with RabbitMQ's port (iptables inside ``a``): the worker on ``b`` still reaches both the
broker and the manager, and so does the test (from the machine itself)."""

from __future__ import annotations

import time

import pytest
from netns_site import STARTUP_TIMEOUT, wait_until

from labswarm.netns import GATEWAY, Cluster

#: serial (run after the parallel tests, alone): the gateway 198.18.0.1 is one address of the machine, which
#: a second cluster with a gateway made meanwhile by another test process would take too
pytestmark = [pytest.mark.cluster, pytest.mark.serial]

HEARTBEAT = 4.0
#: The partition's length (the issue's 20 s): five heartbeats of the manager's Celery connection.
PARTITION_SECONDS = 20.0
#: The publish rate, in tasks/s: slow enough that the manager is still publishing when the partition starts.
RATE = 3.0


def test_the_manager_resumes_publishing_after_a_partition_from_the_broker(make_site) -> None:
    with Cluster(["a", "b"], gateway=True) as cluster:
        site = make_site(cluster, heartbeat=HEARTBEAT, tones=16)
        site.start_manager("a")
        site.start_worker("b")
        wait_until(lambda: site.consumers() == {cluster.address("b")}, "the worker consuming", STARTUP_TIMEOUT,
                   site.logs)
        site.start_session(RATE)
        before = site.wait_for(lambda p: p["published"] >= 10, "the first publishes")

        cluster.block("a", GATEWAY, port=5672)
        time.sleep(PARTITION_SECONDS)  # the partition's deliberate length
        during = site.progress()
        cluster.unblock("a", GATEWAY, port=5672)
        assert during["published"] < during["total"], f"it had published everything before the partition: {during}"

        progress = site.wait_completed()
        site.assert_each_sample_done_once(progress)
        # it resumed: the samples it had not published when cut off were published after the partition healed,
        # each once (republished: the reconciliation's, for messages that went missing, none here)
        assert progress["published"] > during["published"]
        assert progress["published"] == progress["total"] and progress["republished"] == 0, progress
        print(f"published {before['published']} before, {during['published']} at the heal; {progress}")
