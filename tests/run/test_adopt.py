"""A ``labswarm run`` killed with ``kill -9`` mid-session (issue 27): its local workers end with it (none is left
polling the embedded broker), and the next run of the same experiment on the same home takes over the session it
left running and completes it with nothing lost; while a run lasts, its lock refuses a second one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest
import yaml
from helpers import experiment_dict, wait_until, write_dataset

from labswarm.config.experiment import parse_experiment
from labswarm.errors import LabswarmError
from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer
from labswarm.pipeline.features import FeaturesBlock
from labswarm.run.adopt import RunLock
from labswarm.sample import iter_samples
from labswarm.settings import Settings
from labswarm.store import FeatureStore


def workers_of(home: Path) -> list[psutil.Process]:
    """The ``labswarm worker`` processes (and their pool processes) of runs on ``home`` that are not zombies (each
    one's parent read as it was found: ``info["ppid"]``)."""
    found = []
    for process in psutil.process_iter(["cmdline", "status", "ppid"]):  # read here, where an end is caught
        try:
            if (process.info["status"] != psutil.STATUS_ZOMBIE and "worker" in (process.info["cmdline"] or [])
                    and process.environ().get("LABSWARM_HOME") == str(home)):
                found.append(process)
        except psutil.Error:
            continue
    return found


@pytest.mark.slow  # two console-script runs with 2 workers each (~35 s quiet, ~2 min at load 10)
def test_a_killed_run_leaves_no_worker_and_the_next_run_completes_its_session(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data", n_per_label=10)  # 40 samples, 2 features each
    config = experiment_dict(data, tmp_path / "store", name="killed")
    (tmp_path / "killed.yml").write_text(yaml.safe_dump(config))
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LABSWARM_")}
    env.update(COLUMNS="160", LABSWARM_HOME=str(home))
    command = [sys.executable, "-m", "labswarm.cli", "run", str(tmp_path / "killed.yml"), "--workers", "2",
               "--no-health"]
    # 0.25 samples/s: still publishing when the workers (started after the session) compute their first sample
    first = subprocess.Popen([*command, "--rate", "0.25"], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    store = FeatureStore(tmp_path / "store")
    try:
        wait_until(lambda: store.stats().entries or first.poll() is not None, "the first sample computed", 240)
        assert first.poll() is None, first.communicate()[0]
        with pytest.raises(LabswarmError, match=f"another labswarm run .*process {first.pid}"):
            RunLock(home, "killed").__enter__()
        # the run's warm parent (its child, labelled a worker), the 2 workers it forked, and their pools
        launched = [(p.pid, p.info["ppid"]) for p in workers_of(home)]
        first.kill()
        out = first.communicate(timeout=30)[0]
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    [warm] = [pid for pid, parent in launched if parent == first.pid]
    assert [parent for _, parent in launched].count(warm) == 2, out
    at_kill = store.stats().entries
    assert 0 < at_kill < 80
    wait_until(lambda: not workers_of(home), "the killed run's workers to end", 60)
    second = subprocess.run([*command, "--rate", "1000"], env=env, cwd=tmp_path, capture_output=True, text=True,
                            timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "left running by a run that did not end it, taken over" in second.stdout, second.stdout
    assert not workers_of(home)
    server = EmbeddedServer(create_app(Settings(home=home, data_roots=[str(tmp_path)]))).start()
    try:
        with httpx.Client(base_url=server.url) as http:
            sessions = http.get("/sessions").json()
    finally:
        server.stop()
    assert len(sessions) == 1, sessions  # the killed run's session, completed; none started beside it
    (session,) = sessions
    assert session["status"] == "completed" and session["total"] == 40 and session["failed"] == 0, session
    assert session["done"] + session["cached"] == 40 and session["pending"] == 0, session
    parsed = parse_experiment(config)
    block = FeaturesBlock(parsed)
    expected = sorted(key for sample in iter_samples(parsed) for key in block.keys(sample).values())
    assert len(expected) == 80 and sorted(store.keys()) == expected  # each sample's features, once
    assert sorted((tmp_path / "store").rglob("*.tmp")) == []
