"""Local workers forked from the warm parent (issue 27, item 2): a real ``labswarm worker`` forked from the
forkserver computes a real session of an embedded manager, in a session and process group of its own; the
launcher supervises it as a started one (a kill -9 replaced, stop leaves
nothing), and the warm parent runs no thread of its own (fork-safety)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from helpers import experiment_dict, write_dataset

from labswarm.deploy.local import LocalLauncher
from labswarm.deploy.warm import ForkedWorker
from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer
from labswarm.settings import Settings

DEADLINE = 180.0  # a cold warm parent imports and warms the audio libraries: a minute on a busy 2-core machine


def wait_until(condition: Callable[[], object], what: str, timeout: float = DEADLINE) -> object:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)
    return value


def group(pgid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (ProcessLookupError, psutil.Error):
            continue
    return out


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[tuple[EmbeddedServer, httpx.Client]]:
    dataset = write_dataset(tmp_path / "data", n_per_label=4)  # 16 samples
    server = EmbeddedServer(create_app(Settings(home=tmp_path / "home"))).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30.0) as http:
            assert http.post("/experiments", json=experiment_dict(dataset, tmp_path / "store")).status_code == 201
            yield server, http
    finally:
        server.stop()


@pytest.mark.slow  # a forkserver warming the audio libraries, then 2 forked workers (~20 s quiet, ~90 s at load 30)
def test_a_forked_worker_computes_a_session_and_is_supervised_as_a_started_one(manager, tmp_path: Path) -> None:
    server, http = manager
    session = http.post("/experiments/tones/sessions", json={"rate": 1000}).json()
    launcher = LocalLauncher("tones", server.url, warm=True, log_dir=tmp_path / "logs")
    try:
        launcher.start(1)
        (first,) = launcher.processes
        assert isinstance(first, ForkedWorker)
        worker = psutil.Process(first.pid)
        forkserver = worker.parent()
        assert forkserver is not None and forkserver.pid != os.getpid() and forkserver.ppid() == os.getpid()
        wait_until(lambda: os.getsid(first.pid) == first.pid == os.getpgid(first.pid), "its own session and group", 30)
        progress = wait_until(lambda: (p := http.get(f"/sessions/{session['id']}").json())["status"] == "completed"
                              and p, "the session computed by the forked worker")
        assert progress["done"] == progress["total"] == 16 and progress["failed"] == 0
        assert forkserver.num_threads() == 1  # nothing but its main thread: forks copy no other thread's state
        pool = wait_until(worker.children, "the worker's pool process")
        assert (tmp_path / "logs" / "worker-0.log").is_file()  # its stdout and stderr
        worker.send_signal(signal.SIGKILL)
        replacement = wait_until(lambda: [p for p in launcher.processes if p.pid != first.pid and p.poll() is None],
                                 "a replacement")
        assert isinstance(replacement[0], ForkedWorker)
        assert [r.returncode for r in launcher.restarts] == [-9]
        wait_until(lambda: not [p for p in pool if p.is_running() and p.status() != psutil.STATUS_ZOMBIE],
                   "the orphaned pool process to be killed", 30)
        second = replacement[0].pid
    finally:
        launcher.stop(timeout=30)
    assert group(first.pid) == [] and group(second) == []
