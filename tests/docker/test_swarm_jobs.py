"""Training jobs whose learners are real swarm services (``LABSWARM_JOB_LAUNCHER=swarm``), against the engine of
``.ci/docker``: the manager on the host creates one service per learner (the image's learner command, the
attempt's token in a docker secret, its spec in a docker config), the learner trains the tiny three-class
experiment in its container (host network, the shared folder bind-mounted at the same path) and reports to the
manager on the loopback; what tests/jobs/test_swarm_learners.py asserts against a fake engine holds against the
real one: the job completes, its model downloads, and halt, resume and delete leave no service, secret or config.
Distributed jobs: an ``allreduce`` learner killed restarts both as a new attempt; a ``downpour`` learner killed
restarts alone, beside its parameter-server shard's service (on the host network: its own port on 127.0.0.1).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from engine import docker, free_port, wait_for
from helpers import missing
from jobs.chunk_record import assert_every_sample_once_per_pass
from jobs.manager import read_events
from jobs.tiny import tiny_manifest
from torch.distributed import TCPStore
from train.three_classes import write_three_classes

from labswarm.deploy.swarm_jobs import learner_service_name, ps_service_name
from labswarm.deploy.swarm_shards import PS_PORT
from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer
from labswarm.settings import Settings
from labswarm.train.distributed import record
from labswarm.train.distributed.cursor import PREFIX as CURSOR_PREFIX

#: Seconds a job may take here (a learner's container starts Python and torch on a loaded machine).
JOB_TIMEOUT = 600.0


@pytest.fixture
def swarm(engine: None) -> None:
    state = docker("info", "-f", "{{.Swarm.LocalNodeState}}").stdout.strip()
    if state != "active":
        missing(f"the engine is not in a swarm ({state}): bash .ci/docker swarm")


@pytest.fixture
def jobs_http(swarm: None, image: str, shared: Path) -> Iterator[httpx.Client]:
    """A manager on the host whose learners are swarm services of ``image``; the tiny manifest's data, store
    and results store live in ``shared`` (writable by the image's user), as does the folder of the shards'
    checkpoints (``<swarm_data_target>/.labswarm-jobs``)."""
    for folder in ("store", "results", ".labswarm-jobs"):
        (shared / folder).mkdir(mode=0o777)
        (shared / folder).chmod(0o777)
    # the manager, root here, stores a killed learner's chunk record into the local results store whose folders the
    # image's user must still write into (a manager in the image runs as that user)
    umask = os.umask(0)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    settings = Settings(home=shared / "home", data_roots=[str(shared)], job_launcher="swarm", job_slots=2,
                        swarm_image=image, swarm_network="host", swarm_manager_url=url,
                        swarm_data_volume=str(shared), swarm_data_target=str(shared))
    server = EmbeddedServer(create_app(settings), port=port).start()
    try:
        with httpx.Client(base_url=url, timeout=60) as http:
            yield http
    finally:
        os.umask(umask)
        server.stop()
        for kind in ("service", "secret", "config"):
            left = docker(kind, "ls", "-q", "--filter", "name=labswarm-job-").stdout.split()
            if left:
                docker(kind, "rm", *left, check=False)


def leftovers(job_id: str) -> dict[str, list[str]]:
    """The engine's services, secrets and configs of ``job_id`` (``labswarm-job-<id>-...``)."""
    return {kind: docker(kind, "ls", "--filter", f"name=labswarm-job-{job_id}", "--format", "{{.Name}}").stdout.split()
            for kind in ("service", "secret", "config")}


def status(http: httpx.Client, job_id: str) -> dict[str, Any]:
    response = http.get(f"/v1/jobs/{job_id}")
    assert response.status_code == 200, response.text
    return response.json()


def wait_status(http: httpx.Client, job_id: str, wanted: str, timeout: float = JOB_TIMEOUT) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        job = status(http, job_id)
        if job["status"] == wanted:
            return job
        if job["status"] in ("completed", "failed", "cancelled") and job["status"] != wanted:
            logs = http.get(f"/v1/jobs/{job_id}/logs").text[-4000:]
            pytest.fail(f"job {job_id} ended {job['status']} while waiting for {wanted}: {job}\n{logs}")
        return None
    return wait_for(f"job {job_id} {wanted}", check, timeout, interval=1.0)  # type: ignore[return-value]


def test_one_learner_as_a_service_completes_and_its_model_downloads(jobs_http: httpx.Client, shared: Path) -> None:
    job = jobs_http.post("/v1/jobs", json=tiny_manifest(shared, epochs=2))
    assert job.status_code == 201, job.text
    job_id = job.json()["id"]
    wait_for("the learner's service", lambda: leftovers(job_id)["service"], 120, interval=1.0)
    assert leftovers(job_id)["secret"] and leftovers(job_id)["config"]  # its token and its spec travel beside it
    done = wait_status(jobs_http, job_id, "completed")
    assert done["attempts"][0]["exit_code"] == 0, done
    model = jobs_http.get(f"/v1/jobs/{job_id}/model")
    assert model.status_code == 200, model.text
    assert len(model.content) > 1000
    wait_for("no service, secret or config of the job left",
             lambda: not any(leftovers(job_id).values()), 120, interval=1.0)


def test_halt_resume_and_delete_leave_no_service_secret_or_config(jobs_http: httpx.Client, shared: Path) -> None:
    job = jobs_http.post("/v1/jobs", json=tiny_manifest(shared, epochs=500))
    assert job.status_code == 201, job.text
    job_id = job.json()["id"]
    wait_status(jobs_http, job_id, "running")
    assert jobs_http.patch(f"/v1/jobs/{job_id}", json={"status": "halt"}).status_code == 200
    wait_status(jobs_http, job_id, "halted")
    wait_for(f"no service, secret or config once halted: {leftovers(job_id)}",
             lambda: not any(leftovers(job_id).values()), 120, interval=1.0)
    assert jobs_http.patch(f"/v1/jobs/{job_id}", json={"status": "resume"}).status_code == 200
    wait_status(jobs_http, job_id, "running")
    assert leftovers(job_id)["service"], "the resumed attempt runs as a service"
    assert jobs_http.delete(f"/v1/jobs/{job_id}").status_code == 204
    wait_for(f"no service, secret or config once deleted: {leftovers(job_id)}",
             lambda: not any(leftovers(job_id).values()), 120, interval=1.0)


def test_an_allreduce_learners_container_killed_restarts_both_as_a_new_attempt(jobs_http: httpx.Client,
                                                                               shared: Path) -> None:
    """Two learners as two services (gloo over the loopback); once the first checkpoint is committed, one learner's
    container is killed: the attempt fails, the next one starts both learners again from the checkpoint, and the
    job completes with every epoch once (tests/jobs/test_distributed_jobs.py's restart, here with containers)."""
    manifest = tiny_manifest(shared, epochs=3, learners=2, framework={"name": "allreduce"})
    manifest["training"]["threads"] = 1  # 2 learners on 2 shared cores
    job = jobs_http.post("/v1/jobs", json=manifest)
    assert job.status_code == 201, job.text
    job_id = job.json()["id"]
    wait_for("the first checkpoint", lambda: status(jobs_http, job_id).get("checkpoint"), JOB_TIMEOUT)
    services = leftovers(job_id)["service"]
    assert len(services) == 2, services
    (victim,) = docker("ps", "-q", "--filter", f"label=com.docker.swarm.service.name={services[-1]}",
                       "--filter", "status=running").stdout.split()
    docker("kill", victim)
    done = wait_status(jobs_http, job_id, "completed")
    first, second = done["attempts"][:2]
    assert first["error_code"] is not None and second["exit_code"] == 0, done
    assert second["checkpoint_in"] is not None and second["checkpoint_in"]["epoch"] >= 1, second
    metrics = jobs_http.get(f"/v1/jobs/{job_id}/metrics").json()
    metrics = metrics["metrics"] if isinstance(metrics, dict) else metrics
    assert [r["epoch"] for r in metrics] == [1, 2, 3], metrics  # every epoch once
    wait_for("no service, secret or config of the job left",
             lambda: not any(leftovers(job_id).values()), 120, interval=1.0)


def running_container(service: str) -> str | None:
    """The id of ``service``'s running container (``None``: none yet)."""
    found = docker("ps", "-q", "--filter", f"label=com.docker.swarm.service.name={service}",
                   "--filter", "status=running").stdout.split()
    return found[0] if found else None


def service_id(name: str) -> str | None:
    done = docker("service", "inspect", "-f", "{{.ID}}", name, check=False)
    return done.stdout.strip() if done.returncode == 0 else None


def kill_after_a_done_chunk(pid: int, chunks: Path, store: Any, timeout: float) -> list[dict[str, Any]]:
    """SIGKILL the learner process ``pid`` (in its container, seen from the host) once it has trained
    a chunk and marked it done in the cursor: whenever its chunk record ``chunks`` has grown it is stopped
    (SIGSTOP) and, when the last line's chunk is done under the line's owner (the job's ``store``), killed; else
    continued. (Killed between a line and its done mark, the chunk would be trained again by another learner and
    the record would rightly show it twice.) Returns the record's lines at the kill."""
    deadline, seen = time.monotonic() + timeout, 0
    while time.monotonic() < deadline:
        assert psutil.pid_exists(pid), f"the learner ended before it trained a chunk: {record.read([chunks])}"
        if len(record.read([chunks])) > seen:
            os.kill(pid, signal.SIGSTOP)
            wait_for("the learner stopped", lambda: psutil.Process(pid).status() == psutil.STATUS_STOPPED, 10,
                     interval=0.001)
            lines = record.read([chunks])
            last = lines[-1]
            if store.get(f"{CURSOR_PREFIX}/{last['pass']}/{last['chunk']}").decode() == f"D|{last['owner']}":
                os.kill(pid, signal.SIGKILL)
                return lines
            seen = len(lines)
            os.kill(pid, signal.SIGCONT)
        time.sleep(0.002)
    raise AssertionError(f"no chunk of the learner done within {timeout} s: {record.read([chunks])}")


def test_a_downpour_learners_container_killed_restarts_it_alone_and_every_sample_is_trained_once(
        jobs_http: httpx.Client, shared: Path) -> None:
    """Downpour with 2 learners and 1 parameter-server shard, three services on the host network: the shard on a
    port of its own on 127.0.0.1 (no service name resolves there). Rank 1's container is killed once it has
    trained a chunk (its record on the shared volume, its done mark in the cursor). Downpour is asynchronous: rank 1
    alone starts again, a new service in the same attempt (no new attempt), and the job completes with every epoch
    once and every sample trained once per pass in the stored chunk record, the killed container's lines included
    (tests/jobs/test_distributed_jobs.py's downpour restarts, here with containers)."""
    write_three_classes(shared / "data", per_class=16)  # 72 training samples a pass, one a step
    manifest = tiny_manifest(shared, epochs=3, learners=2, framework={"name": "downpour"}, ps_shards=1)
    manifest["experiment"]["pipeline"][3]["size"] = 1
    manifest["training"]["threads"] = 1  # 2 learners and a shard on 2 shared cores
    job = jobs_http.post("/v1/jobs", json=manifest)
    assert job.status_code == 201, job.text
    job_id = job.json()["id"]
    rank1 = learner_service_name(job_id, 1, 1)
    victim = wait_for("rank 1's container running", lambda: running_container(rank1), JOB_TIMEOUT, interval=0.2)
    init = psutil.Process(int(docker("inspect", "-f", "{{.State.Pid}}", str(victim)).stdout))  # docker-init
    pid = wait_for("rank 1's learner process", lambda: next(
        (c.pid for c in init.children() if "labswarm.jobs.learner.entry" in " ".join(c.cmdline())), None), 60,
        interval=0.05)
    env = dict(v.split("=", 1) for v in json.loads(docker(
        "service", "inspect", "-f", "{{json .Spec.TaskTemplate.ContainerSpec.Env}}", rank1).stdout))
    store = TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=30))
    old = service_id(rank1)
    chunks = shared / ".labswarm-jobs" / job_id / "chunks" / "attempt-1" / "rank-1.jsonl"  # not in the container
    killed = kill_after_a_done_chunk(pid, chunks, store, JOB_TIMEOUT)
    started = read_events(jobs_http, job_id, until=lambda e: e["event"] == "attempt"
                          and e["data"]["event"] == "started")[-1]["data"]
    [address] = started["ps"]
    host, port = address.rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) != PS_PORT, started  # the host network: a port of its own
    shard = docker("service", "inspect", "-f", "{{json .Spec.TaskTemplate.ContainerSpec.Command}}",
                   ps_service_name(job_id, 0)).stdout
    assert f"--host 127.0.0.1 --port {port}" in shard, shard
    with socket.create_connection((host, int(port)), timeout=10):  # the shard's container listens there
        pass
    wait_for("rank 1 started again as a new service", lambda: service_id(rank1) not in (None, old), JOB_TIMEOUT)
    done = wait_status(jobs_http, job_id, "completed")
    [attempt] = done["attempts"]  # the same attempt: only the dead learner restarted
    [restart] = attempt["learner_restarts"]
    assert restart["rank"] == 1 and restart["previous"]["exit_code"] == 137, restart  # SIGKILL, as docker reports
    assert done["restarts"] == {"user": 0, "platform": 1}, done
    metrics = jobs_http.get(f"/v1/jobs/{job_id}/metrics").json()
    metrics = metrics["metrics"] if isinstance(metrics, dict) else metrics
    assert [r["epoch"] for r in metrics] == [1, 2, 3], metrics  # every epoch once
    results = shared / "results" / "jobs" / job_id
    stored = record.read([results / "logs" / "attempt-1" / "chunks-1.jsonl"])
    assert stored[:len(killed)] == killed, "the killed container's lines, first in its rank's stored record"
    after = {line["owner"] for line in stored[len(killed):]}
    logs = jobs_http.get(f"/v1/jobs/{job_id}/logs").text
    pids = re.findall(rf"learner 1/2 of job {job_id}, attempt 1, pid (\d+)", logs)  # each incarnation's
    print(f"killed {killed[-1]['owner']} after {len(killed)} chunk(s); rank 1's pids {pids}; replacement: {after}")
    assert killed[-1]["owner"] not in after  # the replacement's own owner, even with the same pid
    assert_every_sample_once_per_pass(results, done, manifest, 3)
    wait_for("the job's chunk records gone from the shared volume", lambda: not chunks.parent.exists(), 60)
    wait_for("no service, secret or config of the job left (the shard's included)",
             lambda: not any(leftovers(job_id).values()), 120, interval=1.0)
