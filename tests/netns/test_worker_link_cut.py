"""A worker's host loses its link mid-session: the broker drops it after its heartbeat, its unacknowledged
messages go to the worker on the other host, and it comes back when the link returns; every sample is done once.

Hosts: ``a`` the manager, ``b`` and ``c`` a worker each; RabbitMQ is the machine's, through the gateway. Every
process runs with a 4-s AMQP heartbeat (``LABSWARM_BROKER_HEARTBEAT``; 30 s by default)."""

from __future__ import annotations

import time

import pytest
from netns_site import STARTUP_TIMEOUT, wait_until

from labswarm.netns import Cluster

#: serial (run after the parallel tests, alone): the gateway 198.18.0.1 is one address of the machine, which
#: a second cluster with a gateway made meanwhile by another test process would take too
pytestmark = [pytest.mark.cluster, pytest.mark.serial]

HEARTBEAT = 4.0
#: How long b's link stays down: well past the broker's heartbeat timeout (it drops b after ~2 heartbeats).
CUT_SECONDS = 4 * HEARTBEAT


def test_a_cut_worker_hands_its_messages_over_and_comes_back(make_site) -> None:
    with Cluster(["a", "b", "c"], gateway=True) as cluster:
        site = make_site(cluster, heartbeat=HEARTBEAT, tones=24)
        site.start_manager("a")
        b, c = cluster.address("b"), cluster.address("c")
        for host in "bc":
            site.start_worker(host)
        wait_until(lambda: site.consumers() == {b, c}, "both workers consuming", STARTUP_TIMEOUT, site.logs)
        site.start_session()  # the manager's default rate: a backlog builds, each worker always holds a message
        site.wait_for(lambda p: p["finished"] >= 3, "the first outcomes")
        # messages wait in the queue: b (prefetch 1, acks late) holds one unacknowledged while it runs it
        wait_until(lambda: site.backlog() >= 2, "a backlog", 60, site.logs)

        cluster.cut("b")
        cut_at = time.monotonic()
        # the broker drops b on its missed heartbeats, while the link is still down (not when it returns)
        wait_until(lambda: site.consumers() == {c}, "the broker dropping b", 10 * HEARTBEAT, site.logs)
        dropped_after = time.monotonic() - cut_at
        at_drop = site.progress()["finished"]
        site.wait_for(lambda p: p["finished"] > at_drop or p["status"] == "completed", "c going on alone")
        time.sleep(max(0.0, CUT_SECONDS - (time.monotonic() - cut_at)))  # the cut's deliberate length
        cluster.restore("b")

        # b reconnects by itself (Celery's reconnection), whether or not the session has work left for it
        wait_until(lambda: site.consumers() == {b, c}, "b consuming again", STARTUP_TIMEOUT, site.logs)
        progress = site.wait_completed()
        site.assert_each_sample_done_once(progress)
        # what b held when its link went was delivered again (to c: b was gone), and counted in the ledger
        again = [row for row in site.ledger() if row[2] >= 2]
        print(f"b dropped {dropped_after:.1f} s after the cut; delivered again: {again}; {progress}")
        if not again:  # everything above held, but the handover itself was not exercised this time (seen once in
            # 5 runs, fresh-clone CI 2026-11-26; cause not found): say so rather than pass as if it had been
            pytest.skip("b held no unacknowledged message when its link was cut: the handover was not exercised")
