"""Local workers forked from one warm parent instead of each started as a fresh interpreter (issue 27, item 2).

A ``labswarm worker`` started as a new process pays its own start: the interpreter, the imports of Celery and the
audio libraries, and their first calls (numba's functions, filter banks): ~2.9 s of CPU (1.5 s of imports, 1.4 s
of warm-up), measured 2026-11-26 on the 2-core machine under load. Here the launcher's workers are forked from a
multiprocessing *forkserver* whose preload (:mod:`labswarm.deploy.zygote`) did that once: a forked worker's own
warm-up of its experiment then took 0.09 s of CPU. The forkserver is a fresh interpreter started by exec (not a
fork of the launcher, which runs threads: the manager's), it starts no thread and opens no connection before it
forks (see :mod:`labswarm.deploy.zygote`), and it lives as long as the launcher's process: later sessions' workers
fork from it warm at once.

A forked worker then runs the command line of a started one (``labswarm worker ...``, the same code), in a session
and process group of its own, its stdout and stderr in the launcher's log file, its environment the one it was given;
:class:`ForkedWorker` gives the launcher the part of :class:`subprocess.Popen` that it supervises with. The worker
is the forkserver's child, not the launcher's: it ends with the launcher through its lifeline
(:mod:`labswarm.deploy.lifeline`), which names the launcher.
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)

#: The forkserver's preload.
PRELOAD = "labswarm.deploy.zygote"

_lock = threading.Lock()
_context: multiprocessing.context.ForkServerContext | None = None


def _forkserver() -> multiprocessing.context.ForkServerContext:
    global _context
    with _lock:
        if _context is None:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload([PRELOAD])
            _context = context
        return _context


def prestart() -> None:
    """Start the warm parent now, without waiting for its preload: a run calls it first thing, so that the
    preload's ~3 s of CPU overlap the manager's start instead of following the session's start."""
    _forkserver()
    multiprocessing.forkserver.ensure_running()


class ForkedWorker:
    """A worker forked from the warm parent, as much of :class:`subprocess.Popen` as a launcher uses.

    The fork is asked for in a thread of its own: the warm parent answers once its preload is done (seconds after
    its start: the caller, a request that starts a session, does not wait for it). Until then the worker counts as
    running (:meth:`poll` is ``None``); :attr:`pid` and :meth:`wait` wait for the fork; a signal sent meanwhile is
    delivered once it is forked. A fork that fails (the warm parent could not start) ends the worker with status 1
    and :attr:`pid` 0 (no process: nothing is signalled).

    Args:
        args: the ``labswarm`` command line's arguments (``["worker", "--experiment", ...]``).
        env: the worker's whole environment.
        log: the file its stdout and stderr append to; ``None``: discarded.
    """

    def __init__(self, args: list[str], env: Mapping[str, str], log: Path | None) -> None:
        self.args = list(args)
        self.returncode: int | None = None
        self._pid = 0
        self._pending: list[int] = []
        self._lock = threading.Lock()
        self._forked = threading.Event()
        self._process = _forkserver().Process(target=_main, args=(self.args, dict(env), str(log) if log else None),
                                              name="labswarm-worker")
        threading.Thread(target=self._fork, name="labswarm-fork", daemon=True).start()

    def _fork(self) -> None:
        try:
            self._process.start()
        except Exception as exc:  # the warm parent did not start (its preload failed, no resources)
            log.error("a worker could not be forked from the warm parent: %s", exc)
            with self._lock:
                self.returncode = 1
            self._forked.set()
            return
        with self._lock:
            self._pid = self._process.pid or 0
            pending, self._pending = self._pending, []
        self._forked.set()
        for sig in pending:
            self.send_signal(sig)

    @property
    def pid(self) -> int:
        """The worker's process id, once forked (waits for it); 0 when the fork failed."""
        self._forked.wait()
        return self._pid

    def poll(self) -> int | None:
        """The exit status once it has exited (negative: the signal that ended it), else ``None``."""
        with self._lock:
            if self.returncode is None and self._pid and not self._process.is_alive():
                self.returncode = self._process.exitcode
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit; its status.

        Raises:
            subprocess.TimeoutExpired: still running (or not yet forked) after ``timeout`` s.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._forked.wait(timeout) and self._pid:
            self._process.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        code = self.poll()
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the worker: now, or once it is forked; nothing once it has exited."""
        with self._lock:
            if not self._forked.is_set():
                self._pending.append(sig)
                return
        if self.poll() is None and self._pid > 0:
            os.kill(self._pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _main(args: list[str], env: dict[str, str], log: str | None) -> None:
    """In the forked worker: a session of its own, its output in ``log``, its environment, then the command line."""
    os.setsid()
    fd = os.open(log or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for std in (1, 2):
        os.dup2(fd, std)
    os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.argv = ["labswarm", *args]
    main = importlib.import_module("labswarm.cli.main")  # the command line's entry, as `python -m labswarm.cli`
    main.app(args=args, prog_name="labswarm")
