"""The lifecycle manager with ``command`` learners (no torch: fast and under the test's control): the queue's
capacity and priorities, the watchdog, and a manager killed and restarted mid-job."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import httpx
import psutil
import pytest
from helpers import wait_until

from jobs.manager import learner_processes, manager, manager_process, read_events, statuses
from jobs.tiny import tiny_manifest
from labswarm.manager.server import free_port

#: A learner program that runs until the file ``argv[1]`` exists (or at once in attempt ``argv[2]`` and later).
_UNTIL = """
import os, sys, time
print("attempt", os.environ["LABSWARM_ATTEMPT"], "started", flush=True)
while not os.path.exists(sys.argv[1]) and int(os.environ["LABSWARM_ATTEMPT"]) < int(sys.argv[2]):
    time.sleep(0.05)
print("done", flush=True)
"""


def _waiting(tmp_path: Path, name: str, release: Path, *, from_attempt: int = 99, **overrides) -> dict:
    return tiny_manifest(tmp_path, name=name, framework={
        "name": "command", "command": [sys.executable, "-c", _UNTIL, str(release), str(from_attempt)]}, **overrides)


def test_capacity_holds_jobs_in_the_queue_and_a_higher_priority_goes_first(tmp_path: Path) -> None:
    with manager(tmp_path, job_slots=1) as m:
        first = m.submit(_waiting(tmp_path, "first", tmp_path / "release-first"))
        read_events(m.http, first["id"], until=lambda e: e["event"] == "log" and "started" in e["data"]["line"])
        low = m.submit(_waiting(tmp_path, "low", tmp_path / "release-low"))
        high = m.submit(_waiting(tmp_path, "high", tmp_path / "release-high", priority=5))
        assert (m.show(low["id"])["status"], m.show(high["id"])["status"]) == ("queued", "queued")
        assert m.show(high["id"])["queue_position"] == 1 and m.show(low["id"])["queue_position"] == 2
        assert m.show(first["id"])["queue_position"] is None
        (tmp_path / "release-first").touch()
        read_events(m.http, high["id"], until=lambda e: e["event"] == "log" and "started" in e["data"]["line"])
        assert m.show(low["id"])["status"] == "queued" and m.show(low["id"])["queue_position"] == 1
        (tmp_path / "release-high").touch()
        (tmp_path / "release-low").touch()
        for job in (first, high, low):
            assert statuses(read_events(m.http, job["id"]))[-1] == "completed"
        shown = {job["id"]: m.show(job["id"]) for job in (first, high, low)}
    started = {i: s["timestamps"]["pending"] for i, s in shown.items()}
    assert started[first["id"]] < started[high["id"]] < started[low["id"]]


@pytest.mark.slow  # 17-23 s at load 5-8 (18 s before this change)
def test_a_hung_learner_is_killed_and_restarted(tmp_path: Path) -> None:
    with manager(tmp_path) as m:  # the default heartbeat timeout (60 s) but while the hung learner is watched
        job = m.submit(_waiting(tmp_path, "hangs", tmp_path / "never", from_attempt=2))
        read_events(m.http, job["id"], until=lambda e: e["event"] == "status" and e["data"]["status"] == "running")
        [pid] = m.learner_pids()
        [program] = psutil.Process(pid).children()  # the user's program, in a process group of its own
        os.kill(pid, signal.SIGSTOP)  # alive, silent
        # 5 s only while the stopped learner is the one watched: a healthy learner (the next attempt's) starved of
        # its 1-s reports for 5 s on a loaded machine would be killed as hung too, and the attempts miscounted
        m.jobs.settings.job_heartbeat_timeout = 5.0
        wait_until(lambda: m.show(job["id"])["attempts"][0]["learners"][0]["killed"], "the watchdog's kill", 120)
        m.jobs.settings.job_heartbeat_timeout = 60.0
        stream = read_events(m.http, job["id"])
        shown = m.show(job["id"])
    # killing the hung learner killed its program too (it ran on, orphaned, before: attempt 1 never ends)
    assert not psutil.wait_procs([program], timeout=30)[1]
    assert statuses(stream)[-4:] == ["pending", "running", "storing", "completed"]
    first, second = shown["attempts"]
    assert first["error_code"] == "S103" and first["learners"][0]["killed"] == "hung"
    assert second["exit_code"] == 0 and shown["restarts"] == {"user": 0, "platform": 1}


def test_a_manager_killed_mid_job_is_restarted_and_re_attaches_to_its_learner(tmp_path: Path) -> None:
    home, port = tmp_path / "home", free_port()
    url = f"http://127.0.0.1:{port}"
    first = manager_process(home, port, tmp_path / "manager.log")
    try:
        answer = httpx.post(f"{url}/v1/jobs", json=_waiting(tmp_path, "survives", tmp_path / "release"), timeout=30)
        assert answer.status_code == 201, answer.text
        job_id = answer.json()["id"]
        with httpx.Client(base_url=url, timeout=30) as http:
            read_events(http, job_id, until=lambda e: e["event"] == "log" and "started" in e["data"]["line"])
        [learner] = learner_processes(job_id)
        first.kill()
        first.wait(30)
        assert learner.is_running() and learner_processes(job_id) == [learner]
        second = manager_process(home, port, tmp_path / "manager.log")
        try:
            # the new manager re-attaches: the same learner process ends attempt 1, its reports are delivered
            with httpx.Client(base_url=url, timeout=30) as http:
                assert http.get(f"/v1/jobs/{job_id}").json()["status"] == "running"
                (tmp_path / "release").touch()
                stream = read_events(http, job_id)
                shown = http.get(f"/v1/jobs/{job_id}").json()
        finally:
            second.kill()
            second.wait(30)
    finally:
        if first.poll() is None:
            first.kill()
        first.wait(30)
    assert statuses(stream) == ["queued", "pending", "running", "storing", "completed"]
    lines = [e["data"]["line"] for e in stream if e["event"] == "log"]
    assert "done" in lines
    # the learner's last line is its exit; only its reporter's own notes (e.g. reconnected to the new manager,
    # written while it flushes) may follow it
    exit_line = max(i for i, line in enumerate(lines) if line.endswith("learner exits with code 0"))
    assert all("labswarm.jobs.learner.reporter" in line for line in lines[exit_line + 1:]), lines[exit_line:]
    assert shown["attempt"] == 1 and shown["attempts"][0]["exit_code"] == 0
    assert shown["attempts"][0]["learners"][0]["pid"] == learner.pid
    assert not learner_processes(job_id)


def test_a_halt_before_the_learner_reported_ends_halted_and_resume_completes(tmp_path: Path) -> None:
    with manager(tmp_path) as m:
        job = m.submit(_waiting(tmp_path, "early", tmp_path / "never", from_attempt=2))
        seen = read_events(m.http, job["id"],
                           until=lambda e: e["event"] == "status" and e["data"]["status"] == "pending")
        assert m.http.patch(f"/v1/jobs/{job['id']}", json={"status": "halt"}).status_code == 200
        seen += read_events(m.http, job["id"], last_event_id=seen[-1]["id"],
                            until=lambda e: e["event"] == "status" and e["data"]["status"] == "halted")
        assert not m.learner_pids()
        assert m.http.patch(f"/v1/jobs/{job['id']}", json={"status": "resume"}).status_code == 200
        seen += read_events(m.http, job["id"], last_event_id=seen[-1]["id"])
    assert statuses(seen)[:2] == ["queued", "pending"] and "failed" not in statuses(seen)
    assert statuses(seen)[-6:] == ["halted", "queued", "pending", "running", "storing", "completed"]
