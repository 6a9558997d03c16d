"""Local workers forked from one warm parent started ahead of their session (:mod:`labswarm.deploy.standby`): a
real manager's session forks its worker from it, a worker killed with SIGKILL is forked again and nothing is lost,
the forked workers' exit statuses come back through the parent, and a launcher whose warm parent is gone spawns
its workers itself; a worker not yet forked is stopped without waiting for it, a worker whose parent died is still
supervised, and the parent's own errors are logged; real processes throughout."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx
import psutil
import pytest
import yaml
from helpers import experiment_dict, wait_until, write_dataset

from labswarm.config.experiment import parse_experiment
from labswarm.deploy import standby as standby_module
from labswarm.deploy.lifeline import PARENT_ENV
from labswarm.deploy.local import LocalLauncher
from labswarm.deploy.standby import EXIT_UNKNOWN, LOG_NAME, ForkedWorker, StandbyWorkers, worker_env
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


def launched_here(since: float) -> list[int]:
    """The running processes (zombies excluded) started since ``since`` (``time.time()``) whose lifeline names
    this process (:data:`PARENT_ENV`): a warm parent or a worker this test launched, still there."""
    found = []
    for process in psutil.process_iter(["status", "create_time"]):
        try:
            if (process.info["status"] != psutil.STATUS_ZOMBIE and process.info["create_time"] >= since - 1.0
                    and process.environ().get(PARENT_ENV) == str(os.getpid())):
                found.append(process.pid)
        except psutil.Error:
            continue
    return found


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
    started = time.time()
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
            first_log = tmp_path / "home" / "logs" / f"worker-{session['id']}-0.log"
            # forked once the parent's warm-up is done; its log is opened after its setsid (a kill in between, the
            # child preempted there under load, left no log: 1 run in ~30)
            while not (forked := forked_by(parent)) or not first_log.is_file():
                assert time.monotonic() < deadline, f"the warm parent forked no worker logging to {first_log}"
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
    # nor the second forked worker, nor its pool: nothing that names this process as its launcher is left
    wait_until(lambda: not launched_here(started), f"no process launched by {os.getpid()} left", 30)


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


def test_a_worker_not_yet_forked_is_stopped_at_once_and_the_parents_errors_are_logged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A warm parent held (SIGSTOP) before its warm-up: the launcher's worker is not forked yet (pid -1 at once),
    scaled away and stopped without waiting for it (the supervisor and stop() once waited up to 300 s for its
    pid), and killed at its fork; the parent's warm-up error (a broken config) is in its ``standby.log``; killed
    while a worker is asked for and not forked, its end is logged with its status and that worker ends
    :data:`EXIT_UNKNOWN`."""
    logs = tmp_path / "logs"
    # a manager that never answers: the forked worker waits for its config (10 s) instead of exiting 3 at once on a
    # refused connection, ~0.2 s after its fork, before the queued signals reach it when this reader runs late
    silent = socket.create_server(("127.0.0.1", 0))
    standby = StandbyWorkers(1, {"name": "broken"}, log_dir=logs)
    [parent] = standby.pids
    os.kill(parent, signal.SIGSTOP)  # nothing it is asked for is forked until SIGCONT
    launcher = LocalLauncher("broken", f"http://127.0.0.1:{silent.getsockname()[1]}", log_dir=logs,
                             stop_grace_s=0.0, standby=standby)
    try:
        launcher.scale(1)
        [worker] = launcher.processes
        assert isinstance(worker, ForkedWorker) and worker.pid == -1 and launcher.workers == 1
        launcher.scale(0)  # SIGTERM queued; the supervisor's SIGKILL after the grace (0 s) queued too
        stopper = threading.Thread(target=launcher.stop, args=(1.0,), daemon=True)
        stopper.start()
        stopper.join(DEADLINE / 2)
        assert not stopper.is_alive(), "stop() waited for a worker that the warm parent has not forked"
        os.kill(parent, signal.SIGCONT)
        assert worker.wait(DEADLINE) in (-signal.SIGTERM, -signal.SIGKILL)  # killed at its fork
        assert worker.pid > 0 and not running(worker.pid)
        assert "ValidationError" in (logs / LOG_NAME).read_text()  # the warm-up's error, written before the fork
        os.kill(parent, signal.SIGSTOP)
        pending = standby.take(["--help"], worker_env(), None)
        assert pending is not None
        with caplog.at_level(logging.WARNING, logger=standby_module.__name__):
            os.kill(parent, signal.SIGKILL)
            assert pending.wait(DEADLINE) == EXIT_UNKNOWN and pending.pid == -1
        assert "warm parent ended (rc -9) with 1 worker(s) not forked" in caplog.text
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(parent, signal.SIGCONT)
        launcher.stop(1.0)
        standby.close()
        silent.close()
    assert standby.pids == []


def test_a_worker_whose_warm_parent_was_killed_is_still_supervised_then_ended(tmp_path: Path) -> None:
    """The warm parent killed while its forked command runs (``labswarm watch``, which runs until stopped): the
    worker goes on, still running as far as its launcher knows; terminated, its end is seen (through its pidfd)
    with the status :data:`EXIT_UNKNOWN` and it is gone."""
    experiment = tmp_path / "tones.yml"
    experiment.write_text(yaml.safe_dump(experiment_dict(write_dataset(tmp_path / "data"), tmp_path / "store")))
    standby = StandbyWorkers(1)
    [parent] = standby.pids
    worker = standby.take(["watch", str(experiment), "--interval", "5"], worker_env(), tmp_path / "watch.log")
    assert worker is not None
    try:
        wait_until(lambda: worker.pid > 0, "the watch command forked", DEADLINE)
        os.kill(parent, signal.SIGKILL)
        standby.close()  # reaps the parent; its reader has seen its end
        assert worker.poll() is None and running(worker.pid), (tmp_path / "watch.log").read_text()
        worker.terminate()
        assert worker.wait(DEADLINE) == EXIT_UNKNOWN
        wait_until(lambda: not running(worker.pid), "the orphaned worker gone", 30)
    finally:
        if worker.poll() is None:
            worker.kill()
        standby.close()


def test_no_warm_parent_starts_without_proc(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without /proc (another system) a forked worker's lifeline could not find its launcher: no warm parent
    starts, each take says so (the launcher spawns its workers)."""
    monkeypatch.setattr(standby_module, "PROC_STAT", "/no/such/proc/self/stat")
    standby = StandbyWorkers(2)
    assert standby.pids == [] and standby.take(["--help"], worker_env(), None) is None


def test_close_sends_sigterm_two_seconds_after_stdin_closes_not_four(monkeypatch: pytest.MonkeyPatch) -> None:
    """A warm parent that does not exit when its stdin closes (here: stopped, as one busy warming up): close()
    waits 2 s for its stdout's end, then SIGTERMs it at once (rev2 #8: it waited 2 s more in _end first)."""
    standby = StandbyWorkers(1)
    [parent] = standby.pids
    process = standby._process
    assert process is not None
    events: list[tuple[str, float | None]] = []
    wait, killpg = process.wait, os.killpg

    def waited(timeout: float | None = None) -> int:
        events.append(("wait", timeout))
        return wait(timeout)

    def signalled(pgid: int, sig: int) -> None:
        events.append(("signal", sig))
        killpg(pgid, sig)
        if sig == signal.SIGTERM:
            killpg(pgid, signal.SIGCONT)  # stopped: the SIGTERM acts once it runs again

    monkeypatch.setattr(process, "wait", waited)
    monkeypatch.setattr(standby_module.os, "killpg", signalled)
    os.kill(parent, signal.SIGSTOP)
    try:
        standby.close()
    finally:
        monkeypatch.undo()
        with contextlib.suppress(ProcessLookupError):
            os.kill(parent, signal.SIGKILL)
        standby.close()
    before = events[:events.index(("signal", signal.SIGTERM))]
    assert all(t == 0.0 for _, t in before), events  # no wait of its own before the SIGTERM
    assert process.poll() is not None
