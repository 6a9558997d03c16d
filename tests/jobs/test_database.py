"""The jobs service on SQLite and on a real PostgreSQL server: a job's transitions, events (per-job sequence numbers,
metrics kept once by their key) and attempts, through the API."""

from __future__ import annotations

import sys
from pathlib import Path

from jobs.manager import manager, read_events, statuses
from jobs.tiny import tiny_manifest

#: Reports each epoch's metric twice (as a restarted attempt would) and fails in attempt 1.
_PROGRAM = """
import os, sys
for epoch in (1, 2):
    print(f"epoch={epoch}", flush=True)
    print(f"epoch={epoch}", flush=True)
sys.exit(3 if os.environ["LABSWARM_ATTEMPT"] == "1" else 0)
"""


def test_a_job_s_states_events_and_attempts(database_url: str, tmp_path: Path) -> None:
    manifest = tiny_manifest(tmp_path, framework={
        "name": "command", "command": [sys.executable, "-c", _PROGRAM],
        "metrics": {"regex": {"epoch": r"epoch=(\d+)"}}},
        restart={"max_restarts_user": 1, "user_exit_codes": [3], "backoff_s": 0.1})
    with manager(tmp_path, database_url=database_url) as m:
        job = m.submit(manifest)
        stream = read_events(m.http, job["id"])
        shown = m.show(job["id"])
        metrics = m.http.get(f"/v1/jobs/{job['id']}/metrics").json()["metrics"]
        listed = m.http.get("/v1/jobs", params={"status": "completed"}).json()
    assert [e["id"] for e in stream] == list(range(1, len(stream) + 1))
    assert statuses(stream) == ["queued", "pending", "running", "pending", "running", "storing", "completed"]
    assert [(r["epoch"], r["attempt"]) for r in metrics] == [(1, 1), (2, 1)]  # once each, from the first attempt
    assert [a["exit_code"] for a in shown["attempts"]] == [3, 0]
    assert shown["restarts"] == {"user": 1, "platform": 0} and listed["total"] == 1
