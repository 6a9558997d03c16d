"""``labswarm jobs ...`` (the typer app of labswarm/cli/jobs.py) against a real manager."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml
from typer.testing import CliRunner

from jobs.manager import manager
from jobs.test_lifecycle import _UNTIL
from jobs.tiny import tiny_manifest
from labswarm.cli.jobs import jobs_app


def test_submit_follow_show_list_logs_metrics_and_refusals(tmp_path: Path) -> None:
    (tmp_path / "release").touch()  # the program ends at once
    manifest = tiny_manifest(tmp_path, framework={
        "name": "command", "command": [sys.executable, "-c", _UNTIL, str(tmp_path / "release"), "99"],
        "metrics": {"regex": {"epoch": r"attempt (\d+) started", "train_loss": r"attempt (\d+) started"}}})
    path = tmp_path / "job.yml"
    path.write_text(yaml.safe_dump(manifest))
    bad = tmp_path / "bad.yml"
    bad.write_text(yaml.safe_dump({**manifest, "restart": {"backoff_s": -1}}))
    runner = CliRunner()
    with manager(tmp_path) as m:
        env = {"LABSWARM_MANAGER_URL": m.server.url, "COLUMNS": "160"}

        def run(*args: str):
            return runner.invoke(jobs_app, list(args), env=env)

        followed = run("submit", str(path), "--follow")
        assert followed.exit_code == 0, followed.output
        assert "COMPLETED" in followed.output and "done" in followed.output and "metrics  epoch 1" in followed.output
        job_id = followed.output.split()[1]
        shown = json.loads(run("show", job_id[:5], "--json").output)  # a unique prefix will do
        assert shown["id"] == job_id
        assert shown["status"] == "completed" and shown["attempts"][0]["exit_code"] == 0
        assert job_id in run("list").output
        assert json.loads(run("list", "--json", "--status", "failed").output)["total"] == 0
        assert "done" in run("logs", job_id).output
        assert json.loads(run("metrics", job_id, "--json").output)[0]["epoch"] == 1
        followed_logs = run("logs", job_id, "-f")  # the log, then the stream after it to the terminal status
        assert followed_logs.exit_code == 0 and followed_logs.output.splitlines().count("done") == 1
        assert "COMPLETED" in followed_logs.output
        plotted = run("plot", job_id, "--output", str(tmp_path / "curves.png"))
        assert plotted.exit_code == 0 and (tmp_path / "curves.png").stat().st_size > 1000, plotted.output
        refused = run("halt", job_id)
        assert refused.exit_code == 2 and "completed" in refused.output  # a refused change: usage
        invalid = run("validate", str(bad))
        assert invalid.exit_code == 2 and "restart.backoff_s" in invalid.output
        assert run("delete", job_id).exit_code == 0
        assert run("show", job_id).exit_code == 2  # no such job
