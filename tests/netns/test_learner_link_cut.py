"""A 2-learner ``allreduce`` job with its learners on hosts ``b`` and ``c``: ``c``'s link cut mid-job. ``b``'s
next all-reduce fails within the framework's ``timeout_s``, the lifecycle kills the cut peer, the job restarts as a
new attempt (``c``'s link back by then) and completes, every sample trained once per pass in the stored chunk
record.

The manager runs in the test's process on the gateway address (the learners report to it, and reach the job's
coordinator store, at ``198.18.0.1``); its local learner launcher starts each rank's learner on its host
(``ip netns exec {host}`` as the host command of :mod:`labswarm.compare.hosts`) with gloo on the host's ``eth0``
(:mod:`netns_jobs`)."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import httpx
import pytest
from helpers import missing
from jobs.chunk_record import assert_every_sample_once_per_pass
from jobs.manager import Manager, read_events, statuses, wait_until
from jobs.tiny import tiny_manifest
from netns_jobs import on_hosts

from labswarm.jobs.spec.errors import EXIT_PLATFORM
from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer
from labswarm.netns import GATEWAY, Cluster
from labswarm.settings import Settings

#: serial: the gateway address is one per machine (see test_worker_link_cut.py)
pytestmark = [pytest.mark.cluster, pytest.mark.serial]

if os.geteuid() != 0:
    missing("network namespaces need root")

#: The framework's collective timeout, in s (the first join has its own bound, JOIN_TIMEOUT_S, since 4bde901).
TIMEOUT_S = 10
#: Where each rank's learner runs.
HOSTS = {0: "b", 1: "c"}


def test_a_cut_learner_fails_the_step_and_the_job_restarts_as_a_new_attempt(tmp_path: Path) -> None:
    manifest = tiny_manifest(tmp_path, epochs=3, learners=2, framework={"name": "allreduce", "timeout_s": TIMEOUT_S})
    manifest["training"]["threads"] = 1
    token = uuid.uuid4().hex
    with Cluster(["b", "c"], gateway=True) as cluster:
        app = create_app(Settings(home=tmp_path / "home", data_roots=[str(tmp_path)], job_slots=2, api_token=token))
        server = EmbeddedServer(app, host=GATEWAY).start()
        jobs = app.state.jobs
        on_hosts(cluster, jobs.lifecycle.learners, jobs.runtime.home, [HOSTS[0], HOSTS[1]])
        http = httpx.Client(base_url=server.url, timeout=30, headers={"Authorization": f"Bearer {token}"})
        m = Manager(server, http, jobs)
        try:
            job = m.submit(manifest)
            read_events(http, job["id"], until=lambda e: e["event"] == "metric" and e["data"].get("epoch") == 1)
            wait_until(lambda: m.show(job["id"])["checkpoint"], 120, "the first checkpoint")
            for learner in m.show(job["id"])["attempts"][0]["learners"]:  # each on its host
                where = subprocess.run(["ip", "netns", "identify", str(learner["pid"])], capture_output=True,
                                       text=True, check=False).stdout.strip()
                assert where == cluster.host(HOSTS[learner["rank"]]).netns, learner
            cluster.cut("c")
            # b's all-reduce times out; the lifecycle ends the attempt: c's link back before its new learner starts
            wait_until(lambda: m.show(job["id"])["attempts"][0]["error_code"] is not None, 120,
                       "the first attempt failing")
            cluster.restore("c")
            stream = read_events(http, job["id"], timeout=420)
            shown = m.show(job["id"])
        finally:
            http.close()
            server.stop()
    assert statuses(stream)[-1] == "completed", shown.get("log_tail")
    first, second = shown["attempts"]
    cut = {lr["rank"]: lr for lr in first["learners"]}
    assert cut[0]["exit_code"] == EXIT_PLATFORM and cut[1]["killed"] == "peer", cut
    rank0 = [e["data"]["line"] for e in stream if e["event"] == "log" and e["data"].get("rank") == 0
             and e["data"].get("attempt") == 1]
    # gloo's own words: the manifest's timeout (10 s), not its default 30 s
    assert any(f"timed out waiting {TIMEOUT_S * 1000}ms" in line.lower() for line in rank0), rank0[-5:]
    assert second["exit_code"] == 0 and second["checkpoint_in"] is not None
    assert_every_sample_once_per_pass(tmp_path / "results" / "jobs" / job["id"], shown, manifest, 3)
