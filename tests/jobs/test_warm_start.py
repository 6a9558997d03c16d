"""Local learners forked by the warm process (``learner_warm_start``, labswarm/jobs/learner/warm.py and
labswarm/deploy/warm.py) through a real manager: a training job trains and stores its model; a ``command`` learner
runs under the warm process (its parent's parent), pinned and in its cgroup or fallback as a new interpreter
would be; a learner's exit status comes back through the warm process's report (a learner killed by SIGKILL, which
writes no exit file, ends its attempt with -9, not an unknown status)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers import require

from jobs.manager import manager, read_events, statuses
from jobs.tiny import tiny_manifest

require("torch")  # skips here, fails in CI (tests/helpers.py)

#: The learner's program: the command line of its learner's parent, its cores and its cgroup variable.
_REPORT = ("import json, os, psutil; learner = psutil.Process(os.getppid()); print('seen', json.dumps({"
           "'grandparent': psutil.Process(learner.ppid()).cmdline(), 'cores': sorted(os.sched_getaffinity(0)), "
           "'session': os.getsid(learner.pid) == learner.pid}), flush=True)")


#: The learner's program: kills its learner (SIGKILL: no exit file; its status only the warm process sees).
_KILL = "import os, signal, time; os.kill(os.getppid(), signal.SIGKILL); time.sleep(5)"


def _lines(m, job_id: str) -> list[str]:
    return [line["line"] for line in m.http.get(f"/v1/jobs/{job_id}/logs", params={"pagesize": 5000}).json()["lines"]]


@pytest.mark.slow
def test_warm_started_learners_train_run_commands_and_report_their_exit_codes(tmp_path: Path) -> None:
    import json

    command = tiny_manifest(tmp_path, name="seen", resources={"cpus": 1},
                            framework={"name": "command", "command": [sys.executable, "-c", _REPORT]})
    failing = tiny_manifest(tmp_path, name="killed", restart={"max_restarts_platform": 0, "max_restarts_user": 0},
                            framework={"name": "command", "command": [sys.executable, "-c", _KILL]})
    with manager(tmp_path, job_slots=2, learner_warm_start=True) as m:
        try:
            trained = m.submit(tiny_manifest(tmp_path, name="trained", epochs=1))
            seen, killed = m.submit(command), m.submit(failing)
            assert statuses(read_events(m.http, trained["id"]))[-1] == "completed"
            assert statuses(read_events(m.http, seen["id"]))[-1] == "completed"
            assert statuses(read_events(m.http, killed["id"]))[-1] == "failed"
            shown = m.show(killed["id"])
            lines = _lines(m, seen["id"])
        finally:
            m.jobs.lifecycle.learners.close()  # the warm process (it ends with its manager's process otherwise)
    assert (tmp_path / "results" / "jobs" / trained["id"] / "model" / "model.pt").is_file()
    assert shown["attempts"][0]["exit_code"] == -9, shown  # heard from the warm process (no exit file)
    [line] = [line for line in lines if line.startswith("seen ")]
    report = json.loads(line.removeprefix("seen "))
    assert "labswarm.jobs.learner.warm" in report["grandparent"], report  # forked by the warm process
    assert report["session"], report  # a session of its own, as a new interpreter's
    assert len(report["cores"]) == 1, report  # pinned to ceil(cpus) cores
