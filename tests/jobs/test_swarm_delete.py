"""A halted swarm job keeps its learners' chunk records on the shared volume (its resume appends to them); deleting
it removes them. The real job service over real HTTP, the fake engine standing in for the Docker engine (as in
test_swarm_learners.py): the test plays the learner, which wrote its chunk record on the volume, reported, and
exits halted when the manager asks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from deploy.deploy_tools import FakeClient, FakeEngine

from jobs.manager import manager, read_events, statuses, wait_until
from jobs.tiny import tiny_manifest
from labswarm.deploy.platforms import SwarmPlatform
from labswarm.deploy.swarm_learners import SwarmLearners, learner_service_name
from labswarm.jobs.spec.errors import EXIT_HALTED


def test_deleting_a_halted_swarm_job_removes_its_chunk_records(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    engine, shared = FakeEngine(), tmp_path / "shared"  # the data volume's host folder (a bind mount)
    monkeypatch.setattr(SwarmPlatform, "learners",
                        classmethod(lambda _cls, settings: SwarmLearners(settings, client=FakeClient(engine))))
    manifest = tiny_manifest(tmp_path, framework={"name": "command", "command": [sys.executable, "-c", "pass"]})
    with manager(tmp_path, job_launcher="swarm", job_start_timeout=60, swarm_data_volume=str(shared),
                 swarm_data_target="/data") as m:
        job = m.submit(manifest)
        name = learner_service_name(job["id"], 1, 0)
        service = wait_until(lambda: engine.services.get(name), 30, f"service {name}")
        records = shared / ".labswarm-jobs" / job["id"] / "chunks"
        (records / "attempt-1").mkdir(parents=True)
        (records / "attempt-1" / "rank-0.jsonl").write_text('{"pass": 0, "chunk": 0}\n')  # as the learner wrote
        service.set_task("running")
        assert m.http.patch(f"/v1/jobs/{job['id']}", json={"status": "halt"}).status_code == 200
        service.set_task("complete", EXIT_HALTED)  # it checkpointed and exited halted
        stream = read_events(m.http, job["id"], until=lambda e: e["event"] == "status"
                             and e["data"]["status"] == "halted", timeout=60)
        assert statuses(stream)[-1] == "halted"
        assert (records / "attempt-1" / "rank-0.jsonl").is_file()  # kept for the resume
        assert m.http.delete(f"/v1/jobs/{job['id']}").status_code == 204
        assert m.http.get(f"/v1/jobs/{job['id']}").status_code == 404
    assert not (shared / ".labswarm-jobs" / job["id"]).exists() and shared.is_dir()
