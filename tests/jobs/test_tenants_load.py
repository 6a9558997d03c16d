"""The CI-sized run of ``bench/tenants.py`` (issue 26's load test, scaled down): a manager in its own process
with four users each with their own token (one greedy) submitting small ``command`` jobs while they poll lists,
shows, dashboard pages and event streams, one feature session with a worker the manager runs, and a client
flooding wrong tokens. Asserted: no 5xx and no request left unanswered, every job submitted and completed, the
session completed, the flood answered 401 then 429. No timing is asserted: the
latencies, Jain's index and the RSS are the benchmark's to report (docs/benchmarks/tenants.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "tenants.py"


@pytest.mark.slow
def test_users_at_once_get_answers_and_every_job_completes(tmp_path: Path) -> None:
    out = tmp_path / "tenants.json"
    run = subprocess.run([sys.executable, str(BENCH), "--users", "3", "--jobs-per-user", "2", "--greedy-jobs", "4",
                          "--spread", "4", "--job-seconds", "0.2", "--sessions", "1", "--json", str(out)],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["errors"] == 0, figures["codes"]
    assert figures["jobs"] == 3 * 2 + 4 and figures["states"] == {"completed": 10}, figures["states"]
    assert figures["flood"].get("401", 0) >= 1 and figures["flood"].get("429", 0) >= 1, figures["flood"]
    assert set(figures["latency_ms"]) >= {"list", "show", "submit", "session"}
    assert [s["status"] for s in figures["sessions"]] == ["completed"], figures["sessions"]
