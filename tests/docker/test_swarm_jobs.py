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

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from engine import docker, free_port, wait_for
from helpers import missing
from jobs.chunk_record import assert_every_sample_once_per_pass
from jobs.manager import read_events
from jobs.tiny import tiny_manifest

from labswarm.deploy.swarm_jobs import learner_service_name, ps_service_name
from labswarm.deploy.swarm_shards import PS_PORT
from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer
from labswarm.settings import Settings

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


def test_a_downpour_learners_container_killed_restarts_it_alone_and_every_sample_is_trained_once(
        jobs_http: httpx.Client, shared: Path) -> None:
    """Downpour with 2 learners and 1 parameter-server shard, three services on the host network: the shard on a
    port of its own on 127.0.0.1 (no service name resolves there). Rank 1's container is frozen (docker pause) as
    soon as it runs (Python and torch still importing: it trained nothing), rank 0 takes its first step, then rank
    1's container is killed. Downpour is asynchronous: rank 1 alone starts again, a new service in the same attempt
    (no new attempt), and the job completes with every epoch once and every sample trained once per pass in the
    stored chunk record (tests/jobs/test_distributed_jobs.py's downpour restart, here with containers)."""
    manifest = tiny_manifest(shared, epochs=3, learners=2, framework={"name": "downpour"}, ps_shards=1)
    manifest["training"]["threads"] = 1  # 2 learners and a shard on 2 shared cores
    job = jobs_http.post("/v1/jobs", json=manifest)
    assert job.status_code == 201, job.text
    job_id = job.json()["id"]
    rank1 = learner_service_name(job_id, 1, 1)
    victim = wait_for("rank 1's container running", lambda: running_container(rank1), JOB_TIMEOUT, interval=0.2)
    docker("pause", str(victim))
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
    old = service_id(rank1)
    read_events(jobs_http, job_id, until=lambda e: e["event"] == "log" and e["data"].get("rank") == 0
                and "first step" in e["data"]["line"])
    docker("kill", str(victim))
    wait_for("rank 1 started again as a new service", lambda: service_id(rank1) not in (None, old), JOB_TIMEOUT)
    done = wait_status(jobs_http, job_id, "completed")
    [attempt] = done["attempts"]  # the same attempt: only the dead learner restarted
    [restart] = attempt["learner_restarts"]
    assert restart["rank"] == 1 and restart["previous"]["exit_code"] == 137, restart  # SIGKILL, as docker reports
    assert done["restarts"] == {"user": 0, "platform": 1}, done
    metrics = jobs_http.get(f"/v1/jobs/{job_id}/metrics").json()
    metrics = metrics["metrics"] if isinstance(metrics, dict) else metrics
    assert [r["epoch"] for r in metrics] == [1, 2, 3], metrics  # every epoch once
    assert_every_sample_once_per_pass(shared / "results" / "jobs" / job_id, done, manifest, 3)
    wait_for("no service, secret or config of the job left (the shard's included)",
             lambda: not any(leftovers(job_id).values()), 120, interval=1.0)
