"""``distributed_hogwild`` in a training job (issue 23 item 2): real manager, 2 real learner processes, the tiny
three-class experiment. A learner killed -9 mid-job is restarted alone by the job's restart policy (the attempt
goes on, its peer never waits), the job completes, and the stored chunk record shows every training sample
trained exactly once per pass, the killed process's chunks included."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from jobs.chunk_record import assert_every_sample_once_per_pass
from jobs.manager import freeze_until_rank_0_steps, manager, read_events, statuses
from jobs.tiny import tiny_manifest


@pytest.mark.slow
def test_a_hogwild_learner_killed_9_in_a_job_restarts_alone_and_the_job_completes(tmp_path: Path) -> None:
    manifest = tiny_manifest(tmp_path, epochs=3, learners=2,
                             framework={"name": "distributed_hogwild", "sync_period": 1})
    manifest["training"]["threads"] = 1  # 2 learners on 2 shared cores
    with manager(tmp_path, job_slots=2) as m:
        job = m.submit(manifest)
        assert m.show(job["id"])["manifest"]["framework"]["topology"] == {  # the resolved job shows its topology
            "worker_groups": 2, "workers_per_group": 1, "server_groups": 2, "shards_per_group": 1,
            "colocated": True, "serves": [[0], [1]], "sync_period": 1}
        # Rank 1 never waits for rank 0 and trains the tiny set in well under a second: killed at a log line it
        # might have exited 0 already. It is frozen while it starts (torch's import alone takes seconds) and
        # killed once rank 0 has taken its first step (the downpour kill test's way), in the attempt running then
        # (on a loaded machine an earlier one may have failed before its first step).
        victim, number = freeze_until_rank_0_steps(m, job["id"], 1)
        before = m.show(job["id"])
        os.kill(victim, signal.SIGKILL)
        stream = read_events(m.http, job["id"])
        shown = m.show(job["id"])
        response = m.http.get(f"/v1/jobs/{job['id']}/metrics")
        assert response.status_code == 200, response.text
        body = response.json()
        metrics = body["metrics"] if isinstance(body, dict) else body
    assert statuses(stream)[-1] == "completed", shown.get("log_tail")
    attempt = shown["attempts"][-1]  # the same attempt: only the dead learner restarted
    assert attempt["number"] == number == len(before["attempts"]), shown["attempts"]
    [restart] = attempt["learner_restarts"]
    assert restart["rank"] == 1 and restart["previous"]["pid"] == victim, attempt["learner_restarts"]
    assert restart["previous"]["exit_code"] == -signal.SIGKILL
    assert shown["restarts"] == {"user": 0, "platform": before["restarts"]["platform"] + 1}, shown["attempts"]
    assert [r["epoch"] for r in metrics] == [1, 2, 3]
    assert all(r["world_size"] == 2 and "syncs" in r["comm"] for r in metrics)
    assert_every_sample_once_per_pass(tmp_path / "results" / "jobs" / job["id"], shown, manifest, 3)
