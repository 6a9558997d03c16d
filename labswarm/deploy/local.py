"""Workers as local processes: ``labswarm worker`` subprocesses on this machine, supervised as the replicas of a
swarm service are.

Supervision runs in a thread of the process that owns the launcher (the manager for a session started with
``launcher: local``, or ``labswarm run --manager URL``). A worker that exits without being asked to (a crash,
``kill -9``, the OOM killer) is replaced, after a delay given by :class:`RestartPolicy`: 1 s for the first
replacement of a worker slot, doubling with each further one up to 30 s; a worker that lived 60 s resets its
slot's delay. A worker that dies at once again and again is thus restarted at most every 30 s, never in a tight
loop, and one that crashes once a day comes back after 1 s.

Every worker runs in its own session and process group, which its pool processes share: what is left of a dead
worker (its orphaned pool processes) is killed before it is replaced, and :meth:`LocalLauncher.stop` kills each
group after the warm-shutdown grace, so no process is left behind. Scaling down asks the surplus workers for a
warm shutdown (SIGTERM: they finish their running tasks) and returns at once; the supervisor kills them after
``stop_grace_s``. A worker also ends when the process that launched it ends, however that ends
(:mod:`labswarm.deploy.lifeline`): ``kill -9`` of a ``labswarm run`` leaves no worker behind.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from labswarm.deploy.base import Host, Launcher
from labswarm.deploy.standby import StandbyWorkers, WorkerProcess, worker_env
from labswarm.errors import DeployError

log = logging.getLogger(__name__)

#: Seconds between two looks of the supervisor at its workers.
POLL_S = 0.2


@dataclass(frozen=True)
class RestartPolicy:
    """When a worker that died is replaced: exponential backoff with a cap, reset by a long enough life.

    Attributes:
        initial_s: delay before the first replacement of a worker slot, in s.
        max_s: the cap of the delay, in s.
        factor: the delay is multiplied by this at each further replacement.
        reset_after_s: a worker that lived this long (s) resets its slot's delay to ``initial_s``.
    """

    initial_s: float = 1.0
    max_s: float = 30.0
    factor: float = 2.0
    reset_after_s: float = 60.0

    def delay(self, failures: int) -> float:
        """The delay in s before the replacement that follows ``failures`` (>= 1) early deaths in a row."""
        return min(self.max_s, self.initial_s * self.factor ** max(0, failures - 1))


@dataclass(frozen=True)
class Restart:
    """One worker death the supervisor saw, and the replacement it scheduled.

    Attributes:
        slot: the worker slot (0-based).
        pid: the dead worker's process id.
        returncode: its exit status (negative: the signal that killed it, e.g. -9).
        lived_s: how long it ran, in s.
        delay_s: the delay before its replacement starts, in s.
        at: when the death was seen (``time.monotonic()``).
    """

    slot: int
    pid: int
    returncode: int
    lived_s: float
    delay_s: float
    at: float


@dataclass
class _Slot:
    process: WorkerProcess | None = None
    started: float = 0.0
    failures: int = 0  # early deaths in a row
    restart_at: float = 0.0


@dataclass
class _Retiring:
    process: WorkerProcess
    deadline: float


class LocalLauncher(Launcher):
    """Runs and supervises N ``labswarm worker`` processes for one experiment.

    Args:
        experiment: the experiment name, or several: each worker then consumes all their queues.
        manager_url: the manager's URL, passed to each worker; ``None`` until :meth:`bind` sets it.
        broker_url: the workers' broker, passed through the environment (``LABSWARM_BROKER_URL``, never the
            command line, which ``ps`` shows); ``None``: theirs (inherited), else the manager's when it has no
            password (the embedded broker).
        concurrency: pool processes per worker.
        token: the manager's API token, passed through the environment.
        log_dir: folder for each worker's stdout/stderr (``<log_name>-<n>.log``, n counting every start, so a
            replacement's log sits beside its predecessor's); ``None`` discards them.
        log_name: prefix of the log files.
        restart: when dead workers are replaced; ``None``: never (they stay dead until the next :meth:`scale`).
        stop_grace_s: seconds a worker scaled away gets to finish its running tasks before it is killed.
        standby: worker interpreters started ahead of the session (:mod:`labswarm.deploy.standby`), taken before
            any worker is spawned; the host's (:meth:`bind`) when it has some.
    """

    outlives_owner = False

    def __init__(self, experiment: str | list[str], manager_url: str | None, *, broker_url: str | None = None,
                 concurrency: int = 1, token: str | None = None, log_dir: Path | None = None,
                 log_name: str = "worker", restart: RestartPolicy | None = RestartPolicy(),
                 stop_grace_s: float = 30.0, standby: StandbyWorkers | None = None) -> None:
        self.experiment = experiment
        self.manager_url = manager_url
        self.broker_url = broker_url
        self.concurrency = concurrency
        self.token = token
        self.log_dir = log_dir
        self.log_name = log_name
        self.restart = restart
        self.stop_grace_s = stop_grace_s
        #: the deaths seen and replacements scheduled, oldest first (the last 1,000)
        self.restarts: deque[Restart] = deque(maxlen=1000)
        self._slots: list[_Slot] = []
        self._retiring: list[_Retiring] = []
        self._started = 0
        self._lock = threading.RLock()
        self._stop_lock = threading.Lock()  # one stop() at a time: a second one waits for the first
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        #: interpreters started ahead of the session that :meth:`_spawn` takes first (:mod:`labswarm.deploy.standby`)
        self.standby: StandbyWorkers | None = standby

    def bind(self, host: Host) -> None:
        """Take the manager's URL, the pool size and the log folder from the process that serves the manager."""
        self.manager_url = host.manager_url or self.manager_url
        self.concurrency = host.concurrency
        if host.log_dir is not None:
            self.log_dir = host.log_dir
        self.standby = host.standby or self.standby

    def command(self) -> list[str]:
        """The command line of one worker.

        Raises:
            DeployError: no manager URL (a launcher built by the manager before its host set it).
        """
        if not self.manager_url:
            raise DeployError("the local launcher needs the manager's own URL: serve the manager with "
                              "`labswarm manager` or EmbeddedServer, which set it")
        names = [self.experiment] if isinstance(self.experiment, str) else list(self.experiment)
        cmd = [sys.executable, "-m", "labswarm.cli", "worker"]
        for name in names:
            cmd += ["--experiment", name]
        cmd += ["--manager", self.manager_url, "--concurrency", str(self.concurrency)]
        return cmd  # secrets (broker URL, token) go through the environment: see _spawn

    def _spawn(self) -> WorkerProcess:
        env = worker_env()  # the worker ends with this process, however it ends (its own session hides it)
        if self.token:
            env["LABSWARM_API_TOKEN"] = self.token
        if self.broker_url:
            env["LABSWARM_BROKER_URL"] = self.broker_url
        command = self.command()
        n, self._started = self._started, self._started + 1
        log_file = None if self.log_dir is None else self.log_dir / f"{self.log_name}-{n}.log"
        if self.standby is not None:  # forked by a warm parent started ahead of the session
            if log_file is not None:
                log_file.parent.mkdir(parents=True, exist_ok=True)
            process = self.standby.take(command[3:], env, log_file)
            if process is not None:
                return process
        if self.log_dir is None:
            return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # the child gets its own copy of the descriptor; ours is closed once it is started
        with open(self.log_dir / f"{self.log_name}-{n}.log", "ab") as out:
            return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def _fill(self, slot: _Slot) -> None:
        slot.process = self._spawn()
        slot.started = time.monotonic()

    # the Launcher interface
    def start(self, workers: int) -> None:
        """Start ``workers`` workers and their supervision.

        Raises:
            DeployError: no manager URL.
            ValueError: ``workers`` < 0.
        """
        self.scale(workers)

    def scale(self, workers: int) -> None:
        """Run ``workers`` workers from now on: new ones start now; the surplus ones (the newest) get a warm
        shutdown and are killed ``stop_grace_s`` later by the supervisor. Returns without waiting.

        Raises:
            DeployError: no manager URL.
            ValueError: ``workers`` < 0.
        """
        if workers < 0:
            raise ValueError(f"workers must be >= 0, got {workers}")
        with self._lock:
            self._stopping.clear()
            while len(self._slots) > workers:
                self._retire(self._slots.pop())
            if self.restart is None:  # dead workers are replaced here only
                for slot in self._slots:
                    if slot.process is not None and slot.process.poll() is not None:
                        self._reap(slot.process)
                        slot.process = None
                    if slot.process is None:
                        self._fill(slot)
            while len(self._slots) < workers:
                slot = _Slot()
                self._fill(slot)
                self._slots.append(slot)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._supervise, name="labswarm-local-workers", daemon=True)
                self._thread.start()
        self._wake.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the supervision, then every worker: SIGTERM (a warm shutdown), SIGKILL to each worker's process
        group after ``timeout`` s; returns once none of their processes is left (a stop() under way in another
        thread included)."""
        with self._stop_lock:
            self._stopping.set()
            self._wake.set()
            thread = self._thread
            if thread is not None and thread is not threading.current_thread():
                thread.join()
            with self._lock:
                procs = [s.process for s in self._slots if s.process is not None]
                procs += [r.process for r in self._retiring]
                self._slots, self._retiring = [], []
            _terminate(procs, timeout)

    @property
    def workers(self) -> int:
        """Worker processes alive now (not counting those scaled away and still finishing)."""
        with self._lock:
            return sum(s.process is not None and s.process.poll() is None for s in self._slots)

    @property
    def processes(self) -> list[WorkerProcess]:
        """The main process of each worker slot (one may be dead, waiting for its replacement)."""
        with self._lock:
            return [s.process for s in self._slots if s.process is not None]

    # supervision
    def _retire(self, slot: _Slot) -> None:
        process = slot.process
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        self._retiring.append(_Retiring(process, time.monotonic() + self.stop_grace_s))

    @staticmethod
    def _reap(process: WorkerProcess | None) -> None:
        """Kill what is left of a dead worker's process group (orphaned pool processes)."""
        if process is not None:
            _kill(process)

    def _supervise(self) -> None:
        while not self._stopping.is_set():
            with self._lock:
                if self._stopping.is_set():
                    return
                next_due = self._look(time.monotonic())
            self._wake.wait(min(POLL_S, max(0.0, next_due - time.monotonic())))
            self._wake.clear()

    def _look(self, now: float) -> float:
        """One look at the workers (under the lock): replace the dead, kill the retired; when to look next."""
        next_due = now + POLL_S
        for index, slot in enumerate(self._slots):
            process = slot.process
            if process is not None and process.poll() is not None:
                self._reap(process)
                slot.process = None
                if self.restart is None:
                    slot.restart_at = float("inf")  # left dead until the next scale()
                    continue
                lived = now - slot.started
                slot.failures = 1 if lived >= self.restart.reset_after_s else slot.failures + 1
                delay = self.restart.delay(slot.failures)
                slot.restart_at = now + delay
                self.restarts.append(Restart(index, process.pid, process.returncode, lived, delay, now))
                log.warning("worker %d (pid %d) of %s exited with %s after %.1f s; replaced in %.1f s",
                            index, process.pid, self.experiment, process.returncode, lived, delay)
            if slot.process is None and slot.restart_at < float("inf"):
                if now >= slot.restart_at:
                    try:
                        self._fill(slot)
                    except (OSError, DeployError) as exc:
                        slot.failures += 1
                        slot.restart_at = now + self.restart.delay(slot.failures) if self.restart else now + 1
                        log.error("worker %d of %s could not be started: %s", index, self.experiment, exc)
                next_due = min(next_due, slot.restart_at)
        for retiring in list(self._retiring):
            if retiring.process.poll() is not None:
                self._reap(retiring.process)
                self._retiring.remove(retiring)
            elif now >= retiring.deadline:
                _kill(retiring.process)
        return next_due


def _kill(process: WorkerProcess, wait_s: float = 0.0) -> None:
    """SIGKILL a worker's process group (:func:`_kill_group`); a forked worker not yet forked
    (:class:`~labswarm.deploy.standby.ForkedWorker`, pid -1) gets SIGKILL once it is (its queued signals), and
    this does not wait for that."""
    pid = process.pid
    if pid > 0:
        _kill_group(pid, wait_s)
    elif process.poll() is None:
        process.send_signal(signal.SIGKILL)


def _kill_group(pid: int, wait_s: float = 0.0) -> None:
    """SIGKILL the process group ``pid`` leads (a worker and its pool), if any of it is left; with ``wait_s``,
    wait up to that many seconds until none of its processes runs (a signal is delivered asynchronously). A pid
    <= 0 (a forked worker that never was: :class:`~labswarm.deploy.standby.ForkedWorker`) names no group."""
    if pid <= 0:
        return
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and _group_alive(pid):
        time.sleep(0.01)


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` runs (zombies, waiting for their parent to reap them, do not count)."""
    import psutil

    for process in psutil.process_iter(["status"]):
        try:
            if os.getpgid(process.pid) == pgid and process.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.Error):
            continue
    return False


def _terminate(procs: list[WorkerProcess], timeout: float) -> None:
    """SIGTERM each worker, SIGKILL each one's group after ``timeout`` s in all, and reap them (a worker the warm
    parent has not forked yet gets its SIGKILL once it is: not waited for)."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(max(0.0, deadline - time.monotonic()))
        _kill(p)  # the worker if it is still there, its orphaned pool processes if it is not
        if p.pid <= 0:  # not forked yet: killed at its fork
            continue
        p.wait(5)
        _kill(p, wait_s=5.0)  # and those of its processes that were starting meanwhile, until gone
