"""A ``downpour`` job over the network: its parameter-server shard on host ``d``, its learners on ``b`` (rank 0)
and ``c`` (rank 1); ``c``'s link cut mid-job. ``b`` goes on training meanwhile (asynchronous: it waits for
nobody); ``c``'s learner ends (its push to the shard fails after the framework's ``timeout_s``, or the watchdog
finds it silent) and is restarted alone in the same attempt once its link is back, and the job completes with
every sample trained once per pass in the stored chunk record (the cut learner's chunks included: a chunk it held
is taken over once its lease expires).

The manager runs in the test's process on the gateway address (:mod:`netns_jobs`)."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import httpx
import psutil
import pytest
from helpers import missing
from jobs.chunk_record import assert_every_sample_once_per_pass
from jobs.manager import Manager, read_events, statuses, wait_until
from jobs.tiny import tiny_manifest
from netns_jobs import SHARD_PORT, on_hosts
from train.three_classes import write_three_classes

from labswarm.jobs.spec.errors import EXIT_PLATFORM
from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer
from labswarm.netns import GATEWAY, Cluster
from labswarm.settings import Settings
from labswarm.train.distributed import record

#: serial: the gateway address is one per machine (see test_worker_link_cut.py)
pytestmark = [pytest.mark.cluster, pytest.mark.serial]

if os.geteuid() != 0:
    missing("network namespaces need root")

#: The framework's request timeout, in s (the first join has its own bound, JOIN_TIMEOUT_S, since 4bde901).
TIMEOUT_S = 10
#: Where each rank's learner runs; the shard runs on ``d``.
HOSTS = {0: "b", 1: "c"}


def _learner(m: Manager, job_id: str, rank: int) -> dict:
    return next(lr for lr in m.show(job_id)["attempts"][-1]["learners"] if lr["rank"] == rank)


def _chunks(home: Path, job_id: str, rank: int) -> list[dict]:
    """The chunk lines rank ``rank`` wrote so far in attempt 1 (its working folder's record, on the shared disk)."""
    return record.read(sorted((home / job_id).glob(f"attempt-1/rank-{rank}/chunks*.jsonl")))


def _ended(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_cut_downpour_learner_restarts_alone_while_the_other_goes_on(tmp_path: Path) -> None:
    write_three_classes(tmp_path / "data", per_class=16)
    manifest = tiny_manifest(tmp_path, epochs=3, learners=2, ps_shards=1,
                             framework={"name": "downpour", "timeout_s": TIMEOUT_S})
    manifest["training"]["threads"] = 1
    manifest["experiment"]["pipeline"][3]["size"] = 1  # 72 training samples a pass, one a step: ~36 a rank
    token = uuid.uuid4().hex
    with Cluster(["b", "c", "d"], gateway=True) as cluster:
        app = create_app(Settings(home=tmp_path / "home", data_roots=[str(tmp_path)], job_slots=2, api_token=token))
        server = EmbeddedServer(app, host=GATEWAY).start()
        jobs = app.state.jobs
        home = jobs.runtime.home
        on_hosts(cluster, jobs.lifecycle.learners, home, [HOSTS[0], HOSTS[1], "d"])  # the shard on d, the last
        http = httpx.Client(base_url=server.url, timeout=30, headers={"Authorization": f"Bearer {token}"})
        m = Manager(server, http, jobs)
        try:
            job = m.submit(manifest)
            # c trains (its first step done: it has claimed a chunk) before its link goes
            read_events(http, job["id"], until=lambda e: e["event"] == "log" and e["data"].get("rank") == 1
                        and "first step" in e["data"]["line"])
            victim, other = _learner(m, job["id"], 1)["pid"], _learner(m, job["id"], 0)["pid"]
            for rank, pid in ((0, other), (1, victim)):  # each learner in its host's namespace, the shard on d's
                where = subprocess.run(["ip", "netns", "identify", str(pid)], capture_output=True, text=True,
                                       check=False).stdout.strip()
                assert where == cluster.host(HOSTS[rank]).netns, (rank, where)
            listening = cluster.check("d", ["ss", "-Htln", f"sport = :{SHARD_PORT}"]).stdout
            assert f"{cluster.address('d')}:{SHARD_PORT}" in listening, listening
            cluster.cut("c")
            at_cut = len(_chunks(home, job["id"], 0))
            # b goes on alone while c is cut off
            wait_until(lambda: len(_chunks(home, job["id"], 0)) > at_cut, 120, "b training on while c is cut")
            wait_until(lambda: _ended(victim), 120, "c's learner ending")
            during = len(_chunks(home, job["id"], 0)) - at_cut
            cluster.restore("c")
            stream = read_events(http, job["id"], timeout=420)
            shown = m.show(job["id"])
        finally:
            http.close()
            server.stop()
    assert statuses(stream)[-1] == "completed", shown.get("log_tail")
    [attempt] = shown["attempts"]  # the same attempt: only the cut learner restarted
    first = {lr["rank"]: lr for lr in attempt["learners"]}
    assert first[0]["pid"] == other and first[0]["exit_code"] == 0, first  # b never stopped
    restarts = attempt["learner_restarts"]
    assert restarts and {r["rank"] for r in restarts} == {1}, restarts
    cut = restarts[0]["previous"]
    # c ended by itself on the unreachable shard (EXIT_PLATFORM), or was found silent by the watchdog and killed
    assert cut["pid"] == victim and (cut["exit_code"] == EXIT_PLATFORM or cut["killed"] == "hung"), cut
    results = tmp_path / "results" / "jobs" / job["id"]
    assert_every_sample_once_per_pass(results, shown, manifest, 3)
    lines = record.read(results.glob("logs/attempt-1/chunks-1.jsonl"))
    assert any(c["owner"].split(":")[2] == str(victim) for c in lines), "the premise: c trained chunks before the cut"
    print(f"b trained {during} chunks while c was cut; c's learner: {cut}; restarts {shown['restarts']}")
