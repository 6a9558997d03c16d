"""The local learner launcher (labswarm.deploy.local_learners.LocalLearners) with real processes."""

from __future__ import annotations

import threading
from pathlib import Path

from labswarm.deploy.learners import LearnerLaunch
from labswarm.deploy.local_learners import LocalLearners
from labswarm.jobs.records.models import LearnerRow


def test_a_learner_s_exit_calls_on_exit_and_poll_then_has_its_exit_code(tmp_path: Path) -> None:
    exited = threading.Event()
    launcher = LocalLearners()
    launcher.on_exit = exited.set
    # a spec the learner refuses: it exits at once with an error code
    launch = LearnerLaunch("abc123def456", 1, 0, {"job_id": "abc123def456"}, tmp_path / "learner-0.json",
                           tmp_path / "out", "token")
    handle = launcher.start(launch)
    row = LearnerRow(job_id="abc123def456", attempt=1, rank=0, host="h", workdir=str(tmp_path), pid=handle.pid,
                     pid_created=handle.pid_created)
    assert exited.wait(60), "on_exit was not called"
    status = launcher.poll(row)
    assert not status.alive and status.exit_code not in (None, 0), (status, (tmp_path / "out").read_text())
