"""Local workers forked from one warm parent started ahead of their session (:mod:`labswarm.deploy.standby`): a
real manager's session forks its worker from it, a worker killed with SIGKILL is forked again and nothing is lost,
the forked workers' exit statuses come back through the parent, and a launcher whose warm parent is gone spawns
its workers itself; real processes throughout."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import replace
from pathlib import Path

import httpx
import psutil
import pytest
from helpers import experiment_dict, write_dataset

from labswarm.config.experiment import parse_experiment
from labswarm.deploy.local import LocalLauncher
from labswarm.deploy.standby import StandbyWorkers, worker_env
from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer
from labswarm.run import FINAL
from labswarm.settings import Settings

#: Seconds a condition may take (the warm parent imports the audio libraries: seconds on a busy CPU).
DEADLINE = 180.0


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def forked_by(parent: int) -> list[int]:
    """The running children of ``parent`` that lead a process group of their own (a forked worker, once it has
    called ``setsid``)."""
    found = []
    for child in psutil.Process(parent).children() if running(parent) else []:
        try:
            if running(child.pid) and os.getpgid(child.pid) == child.pid:
                found.append(child.pid)
        except ProcessLookupError:
            continue
    return found


@pytest.mark.slow  # a real worker's session with a worker killed: ~10 s quiet, ~40 s at load 8
def test_a_session_forks_its_worker_from_the_warm_parent_and_forks_a_killed_one_again(tmp_path: Path) -> None:
    config = parse_experiment(experiment_dict(write_dataset(tmp_path / "data"), tmp_path / "store"))
    standby = StandbyWorkers(2, config.model_dump(mode="json"))
    [parent] = standby.pids  # one warm parent, whatever the number of workers
    assert psutil.Process(parent).cmdline()[-3:] == ["worker", "--experiment", "tones"]
    app = create_app(Settings(home=tmp_path / "home"))
    server = EmbeddedServer(app)
    app.state.sessions.launchers.host = replace(app.state.sessions.launchers.host, standby=standby)
    server.start()
    killed = None
    try:
        with httpx.Client(base_url=server.url, timeout=30.0) as http:
            assert http.post("/experiments", json=config.model_dump(mode="json")).status_code == 201
            response = http.post("/experiments/tones/sessions", json={"launcher": "local", "workers": 1})
            assert response.status_code == 201, response.text
            session = response.json()
            launcher = app.state.sessions.launchers.get(session["id"])  # until the session's end
            assert isinstance(launcher, LocalLauncher)
            deadline = time.monotonic() + DEADLINE
            while not (forked := forked_by(parent)):  # forked once the parent's warm-up is done
                assert time.monotonic() < deadline, "the warm parent forked no worker"
                time.sleep(0.02)
            [killed] = forked
            os.killpg(killed, signal.SIGKILL)  # kill -9 of the worker and its pool: the launcher forks another
            while (progress := http.get(f"/sessions/{session['id']}").json())["status"] not in FINAL:
                assert time.monotonic() < deadline, f"session not completed in {DEADLINE:.0f} s: {progress}"
                time.sleep(0.2)
            [restart] = list(launcher.restarts)  # the parent reported the killed worker's status
        # every sample computed, by the second worker forked from the same warm parent, logging where it would
        assert progress["status"] == "completed" and progress["done"] == progress["total"] == 8, progress
        assert (restart.pid, restart.returncode) == (killed, -signal.SIGKILL)
        assert standby.taken == 2  # the second worker forked too, not spawned
        logs = tmp_path / "home" / "logs"
        assert (logs / f"worker-{session['id']}-0.log").is_file() and (logs / f"worker-{session['id']}-1.log").is_file()
    finally:
        server.stop()  # the session's worker stops with its manager
        standby.close()
    assert not running(parent) and killed is not None and not running(killed)


def test_forked_commands_exit_statuses_come_back_and_a_gone_parent_is_not_used(tmp_path: Path) -> None:
    """Two commands forked from a warm parent that warmed up nothing (imports only): their exit statuses (0, and
    2 for a usage error) come back through the parent, each output in its log file; once the parent is killed, a
    take says so (``None``: the launcher then spawns its worker itself)."""
    standby = StandbyWorkers(1)
    try:
        help_ = standby.take(["--help"], worker_env(), tmp_path / "help.log")
        wrong = standby.take(["no-such-command"], worker_env(), tmp_path / "wrong.log")
        assert help_ is not None and wrong is not None
        assert help_.wait(DEADLINE) == 0 and wrong.wait(DEADLINE) == 2
        assert "Usage" in (tmp_path / "help.log").read_text()
        assert "no-such-command" in (tmp_path / "wrong.log").read_text()
        assert StandbyWorkers(0).take(["--help"], {}, None) is None  # none started: nothing to take
        [parent] = standby.pids
        os.kill(parent, signal.SIGKILL)
        deadline = time.monotonic() + DEADLINE
        while standby.take(["--help"], worker_env(), None) is not None:
            assert time.monotonic() < deadline, "a killed warm parent still takes commands"
            time.sleep(0.05)
    finally:
        standby.close()
    assert standby.pids == []
