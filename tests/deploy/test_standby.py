"""Local workers started ahead of their session (:mod:`labswarm.deploy.standby`): a real manager's session takes
them through its local launcher, a dead one is skipped, those not taken are stopped, a start failing halfway stops
those already started; real processes throughout."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import time
import types
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from helpers import experiment_dict, write_dataset

from labswarm.config.experiment import parse_experiment
from labswarm.deploy import standby as standby_module
from labswarm.deploy.standby import StandbyWorkers
from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer
from labswarm.run import FINAL
from labswarm.settings import Settings

#: Seconds a condition may take (a worker imports the audio libraries: seconds on a busy CPU).
DEADLINE = 180.0


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow  # a real worker's session: ~10 s quiet, ~40 s at load 8
def test_a_session_takes_a_standby_worker_skips_a_dead_one_and_the_rest_are_stopped(tmp_path: Path) -> None:
    config = parse_experiment(experiment_dict(write_dataset(tmp_path / "data"), tmp_path / "store"))
    standby = StandbyWorkers(3, config.model_dump(mode="json"))
    dead, taken, spare = standby.pids
    assert all(psutil.Process(pid).cmdline()[-3:] == ["worker", "--experiment", "tones"] for pid in standby.pids)
    os.killpg(dead, signal.SIGKILL)  # one that died before its session: the launcher must skip it
    deadline = time.monotonic() + DEADLINE
    while running(dead):
        assert time.monotonic() < deadline, "SIGKILL did not end the standby"
        time.sleep(0.05)
    app = create_app(Settings(home=tmp_path / "home"))
    server = EmbeddedServer(app)
    app.state.sessions.launchers.host = replace(app.state.sessions.launchers.host, standby=standby)
    server.start()
    try:
        with httpx.Client(base_url=server.url, timeout=30.0) as http:
            assert http.post("/experiments", json=config.model_dump(mode="json")).status_code == 201
            response = http.post("/experiments/tones/sessions", json={"launcher": "local", "workers": 1})
            assert response.status_code == 201, response.text
            session = response.json()
            deadline = time.monotonic() + DEADLINE
            while (progress := http.get(f"/sessions/{session['id']}").json())["status"] not in FINAL:
                assert time.monotonic() < deadline, f"session not completed in {DEADLINE:.0f} s: {progress}"
                time.sleep(0.2)
        # the standby computed every sample, as the worker the launcher would have spawned, logging where it would
        assert progress["status"] == "completed" and progress["done"] == progress["total"] == 8, progress
        assert standby.taken == 1 and standby.pids == [spare]
        assert (tmp_path / "home" / "logs" / f"worker-{session['id']}-0.log").is_file()
        assert running(spare)
    finally:
        server.stop()  # the session's worker stops with its manager
        standby.close()
    assert not running(taken) and not running(spare) and not running(dead)


def test_a_start_that_fails_halfway_stops_the_standby_workers_already_started(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The second of three starts is refused (as a fork refused with EAGAIN would be): the constructor raises that
    error, and the first, a real interpreter, is already stopped and reaped when it does; no third is started."""
    spawn = subprocess.Popen
    started: list[subprocess.Popen] = []

    def second_refused(*args: Any, **kwargs: Any) -> subprocess.Popen:
        if started:
            raise OSError(errno.EAGAIN, "fork refused")
        started.append(spawn(*args, **kwargs))
        return started[-1]

    # the standby module's own subprocess, not the module every thread of this process starts processes through
    monkeypatch.setattr(standby_module, "subprocess",
                        types.SimpleNamespace(**{**vars(subprocess), "Popen": second_refused}))
    with pytest.raises(OSError, match="fork refused"):
        StandbyWorkers(3)
    [first] = started
    assert first.returncode is not None, "the started standby was left running"  # reaped before the raise
    assert not running(first.pid)
    deadline = time.monotonic() + DEADLINE
    while True:  # nothing of its process group (its own session) is left either
        try:
            os.killpg(first.pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, f"process group {first.pid} still has processes"
        time.sleep(0.05)
