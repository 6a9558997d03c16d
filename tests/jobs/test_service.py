"""Training jobs end to end: a real manager over real HTTP, learners as real processes, the tiny experiment.

Each test waits on the job's own event stream (Server-Sent Events), never on a sleep."""

from __future__ import annotations

import io
import os
import signal
import sys
import zipfile
from pathlib import Path

import pytest
from helpers import promtool_check

from jobs.manager import manager, read_events, statuses
from jobs.tiny import tiny_manifest
from labswarm.jobs.client.client import JobsClient
from labswarm.train.trainer import load_model


def _terminal(event: dict) -> bool:
    return event["event"] == "status" and event["data"]["status"] in ("completed", "failed")


def test_a_job_completes_and_a_reconnecting_stream_misses_nothing_and_repeats_nothing(tmp_path: Path) -> None:
    with manager(tmp_path) as m:
        job = m.submit(tiny_manifest(tmp_path, epochs=2))
        assert job["status"] in ("queued", "pending") and job["attempt"] in (0, 1)
        # read until the first metric, disconnect, reconnect with Last-Event-ID, read to the end
        first = read_events(m.http, job["id"], until=lambda e: e["event"] == "metric")
        rest = read_events(m.http, job["id"], last_event_id=first[-1]["id"])
        whole = read_events(m.http, job["id"])  # once more from the start, after the end
        # after the end, a reconnection with the last id is a 204 (a browser's EventSource stops there), as is
        # the client's reader; a Last-Event-ID that is not a number is a 400, not a replay from the start
        finished = m.http.get(f"/v1/jobs/{job['id']}/events", headers={"Last-Event-ID": str(whole[-1]["id"])})
        assert finished.status_code == 204 and finished.content == b""
        assert list(JobsClient(m.server.url).events(job["id"], after=whole[-1]["id"], give_up_s=1)) == []
        malformed = m.http.get(f"/v1/jobs/{job['id']}/events", headers={"Last-Event-ID": "3x"})
        assert malformed.status_code == 400 and "Last-Event-ID" in malformed.json()["detail"]
        shown = m.show(job["id"])
        model = m.http.get(f"/v1/jobs/{job['id']}/model")
        metrics = m.http.get(f"/v1/jobs/{job['id']}/metrics").json()["metrics"]
        logs = m.http.get(f"/v1/jobs/{job['id']}/logs", params={"pagesize": 5000}).json()["lines"]
        bundle = m.http.get(f"/v1/jobs/{job['id']}/bundle")
        exposition = m.http.get("/metrics").text
    promtool_check(exposition)
    labels = f'job="{job["id"]}",name="{job["name"]}"'
    assert f'labswarm_job_status{{{labels},status="completed"}} 1.0' in exposition
    assert f'labswarm_job_status{{{labels},status="running"}} 0.0' in exposition
    assert f"labswarm_job_attempt{{{labels}}} 1.0" in exposition
    assert f"labswarm_job_epoch{{{labels}}} 2.0" in exposition
    for name in ("validation_accuracy_ratio", "loss", "samples_per_second"):
        assert f"labswarm_job_{name}{{{labels}}}" in exposition
    assert 'labswarm_jobs{status="completed"} 1.0' in exposition
    assert bundle.status_code == 200 and bundle.headers["content-type"] == "application/zip"
    with zipfile.ZipFile(io.BytesIO(bundle.content)) as files:
        assert {"model/model.pt", "metrics.jsonl", "manifest.json", "logs/attempt-1/learner-0.log"} <= set(
            files.namelist())
        assert files.read("model/model.pt") == model.content
    joined = first + rest
    assert [e["id"] for e in joined] == [e["id"] for e in whole] == list(range(1, len(whole) + 1))
    assert joined == whole
    assert statuses(whole) == ["queued", "pending", "running", "storing", "completed"]
    # the learner's last lines are stored before the terminal status
    last_log = max(e["id"] for e in whole if e["event"] == "log")
    assert "learner exits with code 0" in next(e for e in whole if e["id"] == last_log)["data"]["line"]
    assert last_log < whole[-1]["id"] and _terminal(whole[-1])
    assert [r["epoch"] for r in metrics] == [1, 2]
    assert shown["status"] == "completed" and shown["error_code"] is None and shown["attempt"] == 1
    assert set(shown["timestamps"]) == {"queued", "pending", "running", "storing", "completed"}
    assert shown["attempts"][0]["exit_code"] == 0 and shown["attempts"][0]["reason"] == "completed"
    assert shown["attempts"][0]["checkpoint_out"]["key"] == "checkpoints/attempt-1/epoch-0002.pt"
    assert model.status_code == 200
    (tmp_path / "model.pt").write_bytes(model.content)
    _net, meta = load_model(tmp_path / "model.pt")
    assert meta["metrics"]["val_accuracy"] == metrics[-1]["val_accuracy"]
    assert [line["line"] for line in logs] == [e["data"]["line"] for e in whole if e["event"] == "log"]
    assert not list((tmp_path / "home" / "jobs" / job["id"]).glob("attempt-*/rank-*"))  # collected
    assert (tmp_path / "home" / "jobs" / job["id"] / "attempt-1" / "learner-0.json").is_file()


def test_halting_a_completed_job_is_refused(tmp_path: Path) -> None:
    with manager(tmp_path) as m:
        job = m.submit(tiny_manifest(tmp_path, epochs=1))
        read_events(m.http, job["id"])
        answer = m.http.patch(f"/v1/jobs/{job['id']}", json={"status": "halt"})
    assert answer.status_code == 409 and "completed" in answer.json()["detail"]


@pytest.mark.slow  # a training job of two attempts (24.4 s in stop 32's CI)
def test_a_learner_killed_mid_training_restarts_from_its_checkpoint(tmp_path: Path) -> None:
    with manager(tmp_path) as m:
        job = m.submit(tiny_manifest(tmp_path, epochs=3))
        read_events(m.http, job["id"], until=lambda e: e["event"] == "checkpoint")  # epoch 1 is committed
        [pid] = m.learner_pids()
        os.kill(pid, signal.SIGKILL)
        stream = read_events(m.http, job["id"])
        shown = m.show(job["id"])
        metrics = m.http.get(f"/v1/jobs/{job['id']}/metrics").json()["metrics"]
    assert statuses(stream) == ["queued", "pending", "running", "pending", "running", "storing", "completed"]
    first, second = shown["attempts"]
    assert first["error_code"] == "S102" and first["exit_code"] == -signal.SIGKILL
    assert second["checkpoint_in"] is not None and second["checkpoint_in"]["attempt"] == 1
    assert second["checkpoint_in"]["epoch"] >= 1 and second["exit_code"] == 0
    assert shown["restarts"] == {"user": 0, "platform": 1}
    assert [r["epoch"] for r in metrics] == [1, 2, 3]  # every epoch once


def test_halt_checkpoints_and_resume_completes_with_every_epoch_once(tmp_path: Path) -> None:
    with manager(tmp_path) as m:
        job = m.submit(tiny_manifest(tmp_path, epochs=3))
        seen = read_events(m.http, job["id"], until=lambda e: e["event"] == "metric")  # epoch 1 done
        assert m.http.patch(f"/v1/jobs/{job['id']}", json={"status": "halt"}).status_code == 200
        seen += read_events(m.http, job["id"], last_event_id=seen[-1]["id"],
                            until=lambda e: e["event"] == "status" and e["data"]["status"] == "halted")
        halted = m.show(job["id"])
        assert halted["status"] == "halted" and halted["checkpoint"] is not None
        assert not m.learner_pids()
        resumed = m.http.patch(f"/v1/jobs/{job['id']}", json={"status": "resume"})
        assert resumed.status_code == 200 and resumed.json()["status"] in ("queued", "pending", "running")
        seen += read_events(m.http, job["id"], last_event_id=seen[-1]["id"])
        shown = m.show(job["id"])
        metrics = m.http.get(f"/v1/jobs/{job['id']}/metrics").json()["metrics"]
    assert statuses(seen) == ["queued", "pending", "running", "halting", "halted", "queued", "pending", "running",
                              "storing", "completed"]
    first, second = shown["attempts"]
    assert first["reason"] == "halted" and first["exit_code"] == 75
    assert second["checkpoint_in"] == halted["checkpoint"]
    assert [r["epoch"] for r in metrics] == [1, 2, 3]
    assert shown["restarts"] == {"user": 0, "platform": 0}


def test_a_command_learner_s_user_error_fails_the_job_within_the_user_budget(tmp_path: Path) -> None:
    program = "import os, sys; print('boom in attempt', os.environ['LABSWARM_ATTEMPT']); sys.exit(3)"
    manifest = tiny_manifest(tmp_path, framework={"name": "command", "command": [sys.executable, "-c", program]},
                             restart={"max_restarts_user": 1, "user_exit_codes": [3], "backoff_s": 0.1})
    with manager(tmp_path) as m:
        job = m.submit(manifest)
        stream = read_events(m.http, job["id"])
        shown = m.show(job["id"])
    assert statuses(stream)[-1] == "failed"
    assert shown["status"] == "failed" and shown["error_code"] == "C101" and shown["fault"] == "user"
    assert "exit code 3" in shown["reason"] and "user restarts used: 1 of 1" in shown["reason"]
    assert [a["exit_code"] for a in shown["attempts"]] == [3, 3]  # one restart, not more
    assert "boom in attempt 2" in shown["log_tail"]
    assert stream[-1]["data"]["exit_code"] == 3 and "boom in attempt 2" in stream[-1]["data"]["log_tail"]


def test_delete_leaves_no_process_and_no_file_of_the_job_and_the_data_alone(tmp_path: Path) -> None:
    with manager(tmp_path) as m:
        job = m.submit(tiny_manifest(tmp_path, epochs=3))
        read_events(m.http, job["id"], until=lambda e: e["event"] == "checkpoint")
        assert m.learner_pids()
        assert (tmp_path / "results" / "jobs" / job["id"]).is_dir()
        assert m.http.delete(f"/v1/jobs/{job['id']}").status_code == 204
        assert not m.learner_pids()
        assert m.http.get(f"/v1/jobs/{job['id']}").status_code == 404
    assert not (tmp_path / "results" / "jobs" / job["id"]).exists()
    assert not (tmp_path / "home" / "jobs" / job["id"]).exists()
    assert (tmp_path / "data" / "labels.csv").is_file()
