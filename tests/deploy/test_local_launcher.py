"""The local launcher supervises its workers as a swarm service would: real processes, real signals, psutil.

The first tests give the launcher a tiny stand-in command (a Python one-liner) to test supervision itself; the
last ones run real ``labswarm worker`` processes for a session of a real manager (embedded, over HTTP).
"""

from __future__ import annotations

import itertools
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from helpers import alive, experiment_dict, write_dataset

from labswarm.deploy.local import LocalLauncher, RestartPolicy
from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer
from labswarm.settings import Settings

#: Seconds a condition may take before the test fails (real workers import librosa: seconds each on a busy CPU).
DEADLINE = 120.0
DEFAULT_POLICY = RestartPolicy()
#: A stand-in worker: starts a child (as a worker starts its pool), ignores SIGTERM, and sleeps.
STUBBORN = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)")


def wait_until(condition: Callable[[], object], what: str, timeout: float = DEADLINE) -> object:
    """Poll ``condition`` until it is truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


class StandIn(LocalLauncher):
    """The launcher with a Python one-liner as its worker command."""

    def __init__(self, code: str, restart: RestartPolicy | None = DEFAULT_POLICY, **kwargs) -> None:
        super().__init__("standin", "http://127.0.0.1:9", restart=restart, **kwargs)
        self.code = code

    def command(self) -> list[str]:
        return [sys.executable, "-c", self.code]


@pytest.fixture
def launchers() -> Iterator[list[LocalLauncher]]:
    """Launchers to stop after the test, whatever happened."""
    made: list[LocalLauncher] = []
    yield made
    for launcher in made:
        launcher.stop(timeout=2.0)


def family(pid: int) -> list[psutil.Process]:
    """A process and its descendants, alive now."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


# supervision, with a stand-in command
def test_a_worker_that_exits_at_once_is_restarted_with_a_growing_capped_backoff(launchers) -> None:
    policy = RestartPolicy(initial_s=0.1, max_s=0.4, reset_after_s=60.0)
    launcher = StandIn("raise SystemExit(3)", restart=policy)
    launchers.append(launcher)
    launcher.start(1)
    wait_until(lambda: len(launcher.restarts) >= 5, "5 restarts")
    restarts = list(launcher.restarts)[:5]
    assert [r.returncode for r in restarts] == [3] * 5
    assert [r.delay_s for r in restarts] == pytest.approx([0.1, 0.2, 0.4, 0.4, 0.4])
    # never before its delay: no tight loop (a lower bound the supervisor guarantees, not a timing measurement)
    for before, after in itertools.pairwise(restarts):
        assert after.at - before.at >= before.delay_s
    assert launcher.stop(timeout=2.0) is None and launcher.workers == 0


def test_a_worker_that_lived_long_enough_resets_its_backoff(launchers) -> None:
    policy = RestartPolicy(initial_s=0.1, max_s=10.0, reset_after_s=0.3)
    launcher = StandIn("import time; time.sleep(0.5); raise SystemExit(1)", restart=policy)
    launchers.append(launcher)
    launcher.start(1)
    wait_until(lambda: len(launcher.restarts) >= 3, "3 restarts")
    restarts = list(launcher.restarts)[:3]
    assert all(r.lived_s >= 0.3 for r in restarts)
    assert [r.delay_s for r in restarts] == pytest.approx([0.1, 0.1, 0.1])


def test_kill_9_of_a_worker_kills_its_orphaned_children_and_replaces_it(launchers) -> None:
    launcher = StandIn(STUBBORN, restart=RestartPolicy(initial_s=0.1))
    launchers.append(launcher)
    launcher.start(2)
    victim = launcher.processes[0]
    orphans = wait_until(lambda: psutil.Process(victim.pid).children(), "the stand-in's child")
    os.kill(victim.pid, signal.SIGKILL)  # the main process only: its child is orphaned
    wait_until(lambda: launcher.workers == 2 and victim not in launcher.processes, "a replacement")
    wait_until(lambda: not alive(orphans), "the orphaned child to be killed", 60)
    assert [r.returncode for r in launcher.restarts] == [-signal.SIGKILL]


def test_stop_leaves_no_process_behind_even_one_that_ignores_sigterm(launchers) -> None:
    launcher = StandIn(STUBBORN)
    launchers.append(launcher)
    launcher.start(3)
    for p in launcher.processes:
        wait_until(lambda p=p: psutil.Process(p.pid).children(), "each stand-in's child")
    seen = [q for p in launcher.processes for q in family(p.pid)]
    assert len(seen) == 6
    launcher.stop(timeout=0.5)
    assert alive(seen) == [] and launcher.processes == [] and launcher.workers == 0


def test_scale_down_returns_at_once_and_the_supervisor_kills_after_the_grace(launchers) -> None:
    launcher = StandIn(STUBBORN, stop_grace_s=0.3)
    launchers.append(launcher)
    launcher.start(3)
    newest = launcher.processes[2]
    launcher.scale(2)
    assert launcher.workers == 2 and newest not in launcher.processes
    gone = family(newest.pid)
    wait_until(lambda: not alive(gone), "the surplus worker (it ignores SIGTERM) to be killed", 60)
    launcher.scale(4)
    assert launcher.workers == 4


def test_without_a_restart_policy_a_dead_worker_stays_dead_until_scaled(launchers) -> None:
    launcher = StandIn(STUBBORN, restart=None)
    launchers.append(launcher)
    launcher.start(2)
    victim = launcher.processes[0]
    os.killpg(victim.pid, signal.SIGKILL)
    wait_until(lambda: launcher.workers == 1 and len(launcher.processes) == 1, "the dead worker's slot to empty")
    assert list(launcher.restarts) == []
    launcher.scale(2)
    assert launcher.workers == 2


def test_bad_worker_count_is_refused() -> None:
    with pytest.raises(ValueError, match="workers must be >= 0"):
        StandIn("pass").scale(-1)


# real workers of a real manager's session (embedded manager and broker, over HTTP)
def session_workers(experiment: str) -> list[psutil.Process]:
    """The running ``labswarm worker`` main processes this test process started for ``experiment``."""
    out = []
    for child in alive(psutil.Process().children()):
        try:
            cmdline = child.cmdline()
        except psutil.NoSuchProcess:
            continue
        if "worker" in cmdline and experiment in cmdline:
            out.append(child)
    return out


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[tuple[EmbeddedServer, httpx.Client]]:
    """A manager serving a registered tone experiment (``tones``); stopped after the test."""
    dataset = write_dataset(tmp_path / "data", n_per_label=4)
    server = EmbeddedServer(create_app(Settings(home=tmp_path / "home"))).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30.0) as http:
            assert http.post("/experiments", json=experiment_dict(dataset, tmp_path / "store")).status_code == 201
            yield server, http
    finally:
        server.stop()


def start_local_session(http: httpx.Client, workers: int) -> dict:
    # a rate so low that the session outlives the test: its workers stay wanted
    response = http.post("/experiments/tones/sessions", json={"rate": 0.01, "launcher": "local", "workers": workers})
    assert response.status_code == 201, response.text
    return response.json()


@pytest.mark.slow
def test_a_killed_worker_of_a_session_is_replaced(manager) -> None:
    server, http = manager
    session = start_local_session(http, 1)
    assert session["launcher"] == "local"
    worker = wait_until(lambda: session_workers("tones"), "the worker")[0]
    pool = wait_until(worker.children, "the worker's pool process")
    worker.send_signal(signal.SIGKILL)  # the main process only: its pool process is orphaned
    replacement = wait_until(lambda: [w for w in session_workers("tones") if w.pid != worker.pid], "a replacement")
    assert len(replacement) == 1 and worker not in alive([worker])
    wait_until(lambda: not alive(pool), "the orphaned pool process to be killed", 60)
    assert [r.returncode for r in server.app.state.sessions.launchers.get(session["id"]).restarts] == [-9]


@pytest.mark.slow
def test_put_workers_scales_the_local_workers_and_stop_leaves_none(manager) -> None:
    server, http = manager
    session = start_local_session(http, 2)
    seen: set[psutil.Process] = set()
    for wanted in (2, 3, 1):
        if wanted != 2:
            response = http.put(f"/sessions/{session['id']}/workers", json={"workers": wanted})
            assert response.status_code == 200, response.text
        workers = wait_until(lambda n=wanted: len(session_workers("tones")) == n and session_workers("tones"),
                             f"{wanted} workers")
        for w in workers:
            seen.update(family(w.pid))
    assert server.app.state.sessions.launchers.get(session["id"]).workers == 1
    server.stop()
    assert session_workers("tones") == [] and alive(list(seen)) == []


@pytest.mark.slow
def test_labswarm_run_on_the_embedded_default_runs_its_workers_through_the_session_launcher(tmp_path: Path) -> None:
    from labswarm.config.experiment import parse_experiment
    from labswarm.run import RunOptions, run_experiment

    dataset = write_dataset(tmp_path / "data", n_per_label=2)
    config = parse_experiment(experiment_dict(dataset, tmp_path / "store"))
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    result = run_experiment(config, RunOptions(workers=1, health=False), settings=Settings(home=tmp_path / "home"))
    assert result.progress["status"] == "completed" and result.progress["launcher"] == "local"
    assert result.progress["done"] == result.progress["total"] == 8
    left = [p for p in alive(psutil.Process().children(recursive=True)) if p.pid not in before]
    assert left == [], (os.getpid(), [(p.pid, p.ppid(), p.status(), p.cmdline()[-6:]) for p in left])


@pytest.mark.slow
def test_labswarm_run_against_a_remote_manager_runs_its_own_supervised_workers(manager, tmp_path: Path) -> None:
    from labswarm.config.experiment import parse_experiment
    from labswarm.run import RunOptions, run_experiment

    server, _ = manager
    config = parse_experiment(experiment_dict(tmp_path / "data", tmp_path / "store"))  # the fixture's dataset
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    result = run_experiment(config, RunOptions(workers=1, manager_url=server.url, health=False),
                            settings=Settings(home=tmp_path / "client"))
    # the manager cannot start processes on the client's machine: the session's workers are not the manager's
    assert result.progress["status"] == "completed" and result.progress["launcher"] == "none"
    assert result.progress["done"] == result.progress["total"]
    assert list((tmp_path / "client" / "logs").glob("worker-*.log"))  # the client ran them
    left = [p for p in alive(psutil.Process().children(recursive=True)) if p.pid not in before]
    assert left == [], [p.cmdline() for p in left]


def test_the_local_url_of_a_wildcard_address_is_the_loopback() -> None:
    from labswarm.manager.server import local_url

    assert local_url("0.0.0.0", 8000) == "http://127.0.0.1:8000"
    assert local_url("::", 8000) == "http://[::1]:8000"
    assert local_url("10.0.0.5", 80) == "http://10.0.0.5:80"
