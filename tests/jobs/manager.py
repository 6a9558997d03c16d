"""A real manager (uvicorn on loopback) hosting the jobs service, and an SSE reader, for the jobs tests."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
from sqlalchemy import select

from labswarm.client import parse_sse
from labswarm.deploy.cgroups import cgroup_name, existing
from labswarm.jobs.records.models import LearnerRow
from labswarm.jobs.service.service import JobService
from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer
from labswarm.settings import Settings


@dataclass
class Manager:
    """A served manager: its URL, an HTTP client, the job service behind it."""

    server: EmbeddedServer
    http: httpx.Client
    jobs: JobService

    def submit(self, manifest: dict[str, Any]) -> dict[str, Any]:
        response = self.http.post("/v1/jobs", json=manifest)
        assert response.status_code == 201, response.text
        assert response.headers["Location"] == f"/v1/jobs/{response.json()['id']}"
        return response.json()

    def show(self, job_id: str) -> dict[str, Any]:
        response = self.http.get(f"/v1/jobs/{job_id}")
        assert response.status_code == 200, response.text
        return response.json()

    def learner_pids(self) -> list[int]:
        """Pids of the learner processes alive now (the process identity checked)."""
        with self.jobs.db() as db:
            rows = list(db.scalars(select(LearnerRow)))
        return [r.pid for r in rows if r.pid and _alive(r.pid, r.pid_created)]


def _alive(pid: int, created: float | None) -> bool:
    try:
        process = psutil.Process(pid)
        return abs(process.create_time() - (created or 0)) < 0.05 and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@contextlib.contextmanager
def manager(tmp_path: Path, **settings: Any) -> Iterator[Manager]:
    """A manager with its home in ``tmp_path / "home"``; every learner still alive at the end is killed."""
    # data_roots: the experiments' files live in the test's folder (a setting ignored where it does not exist)
    app = create_app(Settings(home=tmp_path / "home", data_roots=[str(tmp_path)], **settings))
    server = EmbeddedServer(app).start()
    http = httpx.Client(base_url=server.url, timeout=30)
    jobs = app.state.jobs
    try:
        yield Manager(server, http, jobs)
    finally:
        pids = Manager(server, http, jobs).learner_pids()
        with jobs.db() as db:  # the learners' cgroups (labswarm.deploy.cgroups), removed with them
            groups = [cgroup_name(r.job_id, r.attempt, r.rank) for r in db.scalars(select(LearnerRow))]
        http.close()
        server.stop()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        for name in groups:
            if (cgroup := existing(name)) is not None:
                cgroup.remove()


def read_events(http: httpx.Client, job_id: str, *, last_event_id: int | None = None,
                until: Callable[[dict[str, Any]], bool] = lambda _e: False,
                timeout: float = 300.0) -> list[dict[str, Any]]:
    """Read the job's event stream from after ``last_event_id``: ``[{id, event, data}]``, up to the first event
    for which ``until`` is true (then the connection is closed), or to the end of the stream."""
    headers = {"Last-Event-ID": str(last_event_id)} if last_event_id is not None else {}
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    with http.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers, timeout=timeout) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")

        def lines() -> Iterator[str]:
            for line in response.iter_lines():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the stream did not end within {timeout} s")
                yield line

        for event in parse_sse(lines()):
            out.append(event)
            if until(event):
                return out
    return out


def statuses(events: list[dict[str, Any]]) -> list[str]:
    """The statuses in a list of events, in order."""
    return [e["data"]["status"] for e in events if e["event"] == "status"]


def wait_until(condition: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    """Call ``condition`` until it returns a truthy value (returned), for at most ``timeout`` seconds.

    Raises:
        TimeoutError: it never did.
    """
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not met within {timeout} s")
        time.sleep(0.05)
    return value


def freeze_until_rank_0_steps(m: Manager, job_id: str, rank: int = 1, timeout: float = 300.0) -> tuple[int, int]:
    """Freeze (SIGSTOP) learner ``rank`` of the job's attempt once it started, and wait for rank 0's first step in
    that same attempt; returns ``(the frozen learner's pid, the attempt's number)``. An attempt that ends first (on
    a loaded machine an attempt can fail before its first step, and the next one has other processes) is passed
    over: the next attempt's learner ``rank`` is frozen instead, so the pid returned belongs to the attempt that
    is running."""
    deadline = time.monotonic() + timeout

    def started(event: dict[str, Any]) -> bool:
        return event["event"] == "attempt" and event["data"]["event"] == "started"

    event = read_events(m.http, job_id, until=started, timeout=timeout)[-1]
    while True:
        number = event["data"]["attempt"]
        [attempt] = [a for a in m.show(job_id)["attempts"] if a["number"] == number]
        victim = next(lr["pid"] for lr in attempt["learners"] if lr["rank"] == rank)  # None: it did not start
        if victim is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGSTOP)
            wait_until(lambda pid=victim: _frozen_or_gone(pid), 30, f"learner {rank} of attempt {number} frozen")

        def stepped_or_next(e: dict[str, Any], number: int = number) -> bool:
            return (started(e) and e["data"]["attempt"] > number) or (
                e["event"] == "log" and e["data"].get("rank") == 0 and e["data"].get("attempt") == number
                and "first step" in e["data"]["line"])

        event = read_events(m.http, job_id, last_event_id=event["id"], until=stepped_or_next,
                            timeout=max(deadline - time.monotonic(), 1))[-1]
        if event["event"] == "log" and victim is not None:
            return victim, number
        if event["event"] == "log":  # rank 0 stepped without the learner: wait for the attempt's end
            event = read_events(m.http, job_id, last_event_id=event["id"], timeout=max(deadline - time.monotonic(), 1),
                                until=lambda e, number=number: started(e) and e["data"]["attempt"] > number)[-1]
        assert stepped_or_next(event), f"the job ended before rank 0 stepped: {event}"


def _frozen_or_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


_SERVE = """
import sys
from pathlib import Path
from labswarm.manager.api import create_app
from labswarm.manager.server import serve
from labswarm.settings import Settings
home = Path(sys.argv[1])
serve(create_app(Settings(home=home, data_roots=[str(home.parent)])), "127.0.0.1", int(sys.argv[2]))
"""


def manager_process(home: Path, port: int, log: Path) -> subprocess.Popen:
    """A manager in a process of its own on ``port`` (to be killed with SIGKILL), once it answers ``/health``."""
    with open(log, "ab") as out:
        process = subprocess.Popen([sys.executable, "-c", _SERVE, str(home), str(port)], stdout=out,
                                   stderr=subprocess.STDOUT)

    def healthy() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"the manager exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(healthy, 60, "the manager answering /health")
    return process


def learner_processes(job_id: str) -> list[psutil.Process]:
    """The processes running a learner of the job (found by their command line: the spec's path names it)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if "labswarm.jobs.learner.entry" in cmdline and any(f"/jobs/{job_id}/" in part for part in cmdline):
            found.append(process)
    return found
