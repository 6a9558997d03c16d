"""Local workers forked from one warm parent started before their session, while the manager starts.

A local worker's start is mostly its own: a fresh interpreter imports Celery and the audio libraries and warms
them up (~1.8 s of CPU on the 2-core benchmark machine, docs/benchmarks/distributed.md), and only then consumes.
``labswarm run`` knows its experiment before its manager serves, so it starts its workers' warm parent first
(:class:`StandbyWorkers`): one interpreter (``python -m labswarm.cli.standby``) imports what a worker imports and
warms up the experiment's transformations and features while the manager imports, migrates and starts the session,
then waits for command lines on its stdin. When the session's :class:`~labswarm.deploy.local.LocalLauncher` starts
a worker it asks the warm parent for one (:meth:`StandbyWorkers.take`) instead of spawning a new interpreter: the
parent forks, and the child runs the same ``labswarm worker`` command line (with the launcher's environment and log
file) the launcher would have spawned. The imports and the warm-up are paid once for all the workers, and again
for none that replaces a dead one (a fork, milliseconds). On a quiet 2-core machine the one warm-up runs beside
the manager's start; on a loaded one it gets one process's share of the CPU where N standbys got N shares (the
seventh session's trial, 14f0cf3, reverted in ddf21f5 on a machine at load ~30): CPU-seconds, not a loaded
machine's wall time, decide here (issue 27).

A forked worker runs in a session and process group of its own (the launcher kills a worker as a group), with
the launcher's lifeline (:mod:`labswarm.deploy.lifeline`, which accepts the launcher as its grandparent); it is
the warm parent's child, not the launcher's: the parent reports its end and exit status (:class:`ForkedWorker`
gives the launcher the part of :class:`subprocess.Popen` it supervises with). The warm parent ends when its stdin
closes (:meth:`StandbyWorkers.close`, or this process's end, however it ends); its workers go on until their
launcher stops them or ends. Secrets (the API token, a broker URL) travel through the pipe, never a command line.
Its own errors (a warm-up that failed, a crash) go to ``standby.log`` in the run's log folder.

Linux only (:func:`forking_supported`): a forked worker's lifeline finds its launcher as its grandparent through
``/proc``, and the parent's end is seen through pidfds. Elsewhere no warm parent starts and the launcher spawns
each worker as before.

The protocol, one JSON object a line. On the warm parent's stdin: first ``{"config": {...}}`` (the experiment to
warm up, or ``{}``), then for each worker ``{"argv": [...], "env": {...}, "log": path | null}``: the ``labswarm``
arguments to run, environment entries to set, and the file its stdout and stderr go to (``null``: nowhere). On its
stdout: ``{"pid": N}`` for each worker, in the order asked, and ``{"exit": N, "code": C}`` when one ended (``C``:
its exit status, ``-S`` for a signal S).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, Protocol

from labswarm.deploy.lifeline import lifeline_env

log = logging.getLogger(__name__)

#: The module a standby process runs.
MODULE = "labswarm.cli.standby"
#: Where a forked worker's lifeline reads its parent's parent (:func:`~labswarm.deploy.lifeline.launched_by`).
PROC_STAT = "/proc/self/stat"
#: The warm parent's own stdout and stderr, in the run's log folder (its workers' output goes to their own logs).
LOG_NAME = "standby.log"
#: A forked worker's exit status when the warm parent ended before it could report it (the worker was forked, or
#: asked for, and its end was seen without a status).
EXIT_UNKNOWN = 1
#: Maths libraries' thread counts, set before they are imported: one thread a pool process (see RUNBOOK, "Audio").
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def forking_supported() -> bool:
    """Whether workers may be forked from a warm parent here: Linux with ``/proc`` (:data:`PROC_STAT`), which a
    forked worker's lifeline needs to accept its grandparent as its launcher (without it the lifeline would end
    every forked worker at once, and the launcher fork another, for ever)."""
    return sys.platform.startswith("linux") and os.path.exists(PROC_STAT)


def worker_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a local worker before its secrets: ``base`` (default ``os.environ``), one maths thread
    (:data:`THREAD_VARS`, unless set) and the lifeline to this process."""
    env = dict(os.environ if base is None else base)
    for var in THREAD_VARS:
        env.setdefault(var, "1")
    env.update(lifeline_env())
    return env


class WorkerProcess(Protocol):
    """What :class:`~labswarm.deploy.local.LocalLauncher` uses of a worker's process: a :class:`subprocess.Popen`
    it spawned, or a :class:`ForkedWorker`."""

    @property
    def pid(self) -> int: ...

    returncode: Any

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...


class ForkedWorker:
    """A worker forked by the warm parent, as much of :class:`subprocess.Popen` as a launcher uses.

    The parent answers a fork once its warm-up is done (seconds after the run's start: the session's start, which
    asks for the workers, does not wait for it). Until then the worker counts as running (:meth:`poll` is
    ``None``) and a signal sent to it is delivered once it is forked; :attr:`pid` is ``-1`` (it never waits:
    a launcher asks it under its lock). A worker the parent never forked (it ended first) ends with
    :data:`EXIT_UNKNOWN` and :attr:`pid` ``-1`` (no process: nothing is signalled, no group is killed). Signals
    go through a pidfd of the worker while the launcher has one (until the parent reports its end): never to
    another process that reuses its pid.

    Args:
        args: the ``labswarm`` arguments it runs (for :class:`subprocess.TimeoutExpired`).
    """

    def __init__(self, args: list[str]) -> None:
        self.args = list(args)
        self.returncode: int | None = None
        self._pid: int | None = None
        self._pidfd: int | None = None
        self._pending: list[int] = []
        self._lock = threading.Lock()
        self._forked = threading.Event()
        self._ended = threading.Event()

    @property
    def pid(self) -> int:
        """The worker's process id once forked; -1 until then, and for good when it never was (no process:
        nothing to signal, no group to kill: :meth:`send_signal` queues a signal for it instead). Never waits."""
        pid = self._pid
        return -1 if pid is None else pid

    def poll(self) -> int | None:
        """The exit status once it has ended (negative: the signal that ended it), else ``None``."""
        with self._lock:
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for its end; its exit status.

        Raises:
            subprocess.TimeoutExpired: still running (or not yet forked) after ``timeout`` s.
        """
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the worker: now, or once it is forked; nothing once it has ended. Through its pidfd
        where one is open (``signal.pidfd_send_signal``: the process itself, even if it ended and its pid was
        taken by another), else by pid."""
        with self._lock:
            if self.returncode is not None:
                return
            if not self._forked.is_set():
                self._pending.append(sig)
                return
            pid, fd = self._pid, self._pidfd
            with contextlib.suppress(ProcessLookupError):  # ended, not yet reported
                if fd is not None:  # under the lock: _end closes it
                    signal.pidfd_send_signal(fd, sig)
                elif pid is not None:
                    os.kill(pid, sig)

    def terminate(self) -> None:
        """SIGTERM: Celery's warm shutdown."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL."""
        self.send_signal(signal.SIGKILL)

    # the warm parent's reader
    def _fork_seen(self, pid: int | None) -> None:
        with contextlib.suppress(OSError, AttributeError):  # to see its end should the parent end first
            if pid is not None:
                self._pidfd = os.pidfd_open(pid)
        with self._lock:
            self._pid = pid
            pending, self._pending = self._pending, []
            self._forked.set()
        if pid is None:
            self._end(EXIT_UNKNOWN)
            return
        for sig in pending:
            self.send_signal(sig)

    def _end(self, code: int) -> None:
        with self._lock:
            if self.returncode is None:
                self.returncode = code
            if self._pidfd is not None:
                os.close(self._pidfd)
                self._pidfd = None
        self._ended.set()

    def _orphaned(self) -> None:
        """The warm parent ended: its report will not come; wait for the worker's end through its pidfd (where
        none could be opened, its end is taken as now: its group is killed by the launcher's reap)."""
        with self._lock:
            fd = self._pidfd
        if self._pid is None or fd is None:
            self._end(EXIT_UNKNOWN)
            return

        def watch() -> None:
            with contextlib.suppress(OSError, ValueError):
                select.select([fd], [], [])
            self._end(EXIT_UNKNOWN)

        threading.Thread(target=watch, name="labswarm-forked-worker", daemon=True).start()


class StandbyWorkers:
    """The warm parent of a run's local workers, started ahead of their session (see the module).

    Args:
        count: the workers it is started for; 0 starts nothing (:meth:`take` then returns ``None``), nor does a
            system where forking is not supported (:func:`forking_supported`).
        config: the experiment they warm up (``ExperimentConfig.model_dump(mode="json")``); ``None``: imports only.
        log_dir: the folder of its own stdout and stderr (:data:`LOG_NAME`, appended: a warm-up error, a crash);
            ``None``: discarded.

    Raises:
        OSError: the process could not be started (``subprocess.Popen``'s errors).

    Thread safety: :meth:`take` and :meth:`close` may be called from any thread.
    """

    def __init__(self, count: int, config: Mapping[str, Any] | None = None, log_dir: Path | None = None) -> None:
        self.env = worker_env()
        self.taken = 0
        self._lock = threading.Lock()
        self._asked: deque[ForkedWorker] = deque()  # asked for, not yet answered, in order
        self._forked: dict[int, ForkedWorker] = {}
        self._exits: dict[int, int] = {}  # reported before their pid's answer was read (not in practice)
        self._process: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None
        if count <= 0 or not forking_supported():
            return
        line = json.dumps({"config": dict(config) if config is not None else {}}) + "\n"
        # what `ps` shows: a worker of the experiment (the module reads its commands from stdin, not these)
        label = ["worker", "--experiment", str(config["name"])] if config and config.get("name") else ["worker"]
        err: IO[bytes] | int = subprocess.DEVNULL
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
            err = open(log_dir / LOG_NAME, "ab")  # noqa: SIM115 - the child's copy outlives ours, closed below
        try:
            self._process = subprocess.Popen([sys.executable, "-m", MODULE, *label], env=self.env,
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                             start_new_session=True)
        finally:
            if not isinstance(err, int):
                err.close()
        assert self._process.stdin is not None and self._process.stdout is not None
        with contextlib.suppress(OSError):  # it died at once: its reader ends, take() returns None
            self._process.stdin.write(line.encode())
            self._process.stdin.flush()
        self._reader = threading.Thread(target=self._read, args=(self._process.stdout,), daemon=True,
                                        name="labswarm-standby")
        self._reader.start()

    @property
    def pids(self) -> list[int]:
        """The warm parent's process id while it runs (a list of one), else ``[]``."""
        process = self._process
        return [process.pid] if process is not None and process.poll() is None else []

    def take(self, argv: list[str], env: Mapping[str, str], log_file: Path | None) -> ForkedWorker | None:
        """A worker forked by the warm parent, running ``labswarm <argv>`` with ``env``'s entries that differ from
        the parent's and its output going to ``log_file``; ``None`` when the warm parent no longer runs (the caller
        spawns a worker itself). Returns at once: the fork follows the parent's warm-up (:class:`ForkedWorker`).

        Args:
            argv: the ``labswarm`` arguments (``["worker", "--experiment", ...]``).
            env: the environment the worker would have been spawned with.
            log_file: where its stdout and stderr go (appended), or ``None`` for nowhere.
        """
        changed = {k: v for k, v in env.items() if self.env.get(k) != v}
        line = json.dumps({"argv": list(argv), "env": changed, "log": str(log_file) if log_file else None}) + "\n"
        process = self._process
        if process is None or process.stdin is None:
            return None
        worker = ForkedWorker(argv)
        with self._lock:
            if process.poll() is not None or self._reader is None or not self._reader.is_alive():
                return None
            try:
                process.stdin.write(line.encode())
                process.stdin.flush()
            except (OSError, ValueError) as exc:
                log.warning("the standby workers' warm parent cannot be used (%s): a worker is spawned", exc)
                return None
            self._asked.append(worker)
            self.taken += 1
        return worker

    def close(self) -> None:
        """End the warm parent and reap it (its stdin closed: it exits at once; SIGTERM then SIGKILL to its group
        if it lingers, SIGTERM 2 s after its stdin closed, e.g. while it still warms up); the workers it forked go
        on (their launcher stops them)."""
        process = self._process
        if process is None:
            return
        with self._lock, contextlib.suppress(OSError, ValueError):
            if process.stdin is not None:
                process.stdin.close()
        grace = 2.0
        if self._reader is not None:  # its stdout ends with it: no polling of its status meanwhile (Popen.wait's
            self._reader.join(grace)  # sleeps, up to 50 ms each, were ~65 ms of a run's end at load ~6)
            grace = 0.0 if self._reader.is_alive() else grace  # those 2 s spent: SIGTERM at once (one deadline)
        _end(process, grace)
        if self._reader is not None:
            self._reader.join(10)
        if process.stdout is not None:
            with contextlib.suppress(OSError):
                process.stdout.close()

    def _read(self, stdout: IO[bytes]) -> None:
        """The warm parent's answers, until it ends; then every worker asked for and not forked ends (logged once:
        the launcher spawns their replacements), and those forked are watched through their pidfds."""
        try:
            for raw in stdout:
                try:
                    message = json.loads(raw)
                except ValueError:
                    log.warning("standby workers' warm parent: %r", raw[:200])
                    continue
                if "pid" in message:
                    self._forked_one(int(message["pid"]))
                elif "exit" in message:
                    self._ended_one(int(message["exit"]), int(message["code"]))
        except (OSError, ValueError):  # closed under this thread by close()
            pass
        with self._lock:
            asked, self._asked = list(self._asked), deque()
            forked, self._forked = list(self._forked.values()), {}
        if asked:
            self._ended_early(len(asked))
        for worker in asked:
            worker._fork_seen(None)
        for worker in forked:
            worker._orphaned()

    def _ended_early(self, pending: int) -> None:
        """Log the warm parent's end with ``pending`` workers asked for and not forked (its status: within 2 s)."""
        process = self._process
        code: int | str = "unknown"
        if process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = process.wait(2.0)
        log.warning("the standby workers' warm parent ended (rc %s) with %d worker(s) not forked: they are spawned "
                    "instead (its errors: %s in the run's log folder)", code, pending, LOG_NAME)

    def _forked_one(self, pid: int) -> None:
        with self._lock:
            worker = self._asked.popleft() if self._asked else None
            if worker is not None:
                self._forked[pid] = worker
            early = self._exits.pop(pid, None)
        if worker is None:
            log.warning("standby workers' warm parent forked pid %d that nobody asked for", pid)
            return
        worker._fork_seen(pid)
        if early is not None:
            self._ended_one(pid, early)

    def _ended_one(self, pid: int, code: int) -> None:
        with self._lock:
            worker = self._forked.pop(pid, None)
            if worker is None:
                self._exits[pid] = code
                return
        worker._end(code)


def _end(process: subprocess.Popen, grace: float = 2.0) -> None:
    """Stop the warm parent, whose stdin is closed (it exits by itself then: ``grace`` s; SIGTERM to its group,
    SIGKILL after 5 s more) and reap it."""
    for sig, wait_s in ((None, grace), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        if process.poll() is not None:
            return
        if sig is not None:
            with contextlib.suppress(OSError):
                os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(wait_s)
