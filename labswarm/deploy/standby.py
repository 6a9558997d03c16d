"""Local workers started before their session: interpreters that import and warm up while the manager starts.

A local worker's start is mostly its own: a fresh interpreter imports Celery and the audio libraries and warms
them up (~3 s of CPU on the 2-core benchmark machine, docs/benchmarks/distributed.md), and only then consumes.
``labswarm run`` knows its experiment before its manager serves, so it starts its workers' interpreters first
(:class:`StandbyWorkers`): each one (``python -m labswarm.cli.standby``) imports what a worker imports and warms up
the experiment's transformations and features while the manager imports, migrates and starts the session, then
waits for its command line on its stdin. When the session's :class:`~labswarm.deploy.local.LocalLauncher` starts
a worker it takes a standby process (:meth:`StandbyWorkers.take`) instead of spawning one: the process runs the
same ``labswarm worker`` command line (with the launcher's environment and log file) it would have been given.

Each standby is its own process, as each spawned worker is (one warm parent forking every worker made the start
slower on a loaded machine, where one preload gets one process's share of the CPU: 14f0cf3, reverted in ddf21f5).
It runs in a session and process group of its own (the launcher kills a worker as a group), with the launcher's
lifeline (:mod:`labswarm.deploy.lifeline`); one never taken is stopped by :meth:`close`, and ends by itself when
its stdin closes (this process's end, however it ends). Secrets (the API token, a broker URL) travel through the
pipe, never a command line.

The protocol, one JSON object a line on the standby's stdin: first ``{"config": {...}}`` (the experiment to warm
up, or ``{}``), then ``{"argv": [...], "env": {...}, "log": path | null}``: the ``labswarm`` arguments to run,
environment entries to set, and the file its stdout and stderr go to from then on (``null``: nowhere).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from labswarm.deploy.lifeline import lifeline_env

log = logging.getLogger(__name__)

#: The module a standby process runs.
MODULE = "labswarm.cli.standby"
#: Maths libraries' thread counts, set before they are imported: one thread a pool process (see RUNBOOK, "Audio").
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def worker_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a local worker before its secrets: ``base`` (default ``os.environ``), one maths thread
    (:data:`THREAD_VARS`, unless set) and the lifeline to this process."""
    env = dict(os.environ if base is None else base)
    for var in THREAD_VARS:
        env.setdefault(var, "1")
    env.update(lifeline_env())
    return env


class StandbyWorkers:
    """Worker interpreters started ahead of their session (see the module).

    Args:
        count: how many to start now (>= 0).
        config: the experiment they warm up (``ExperimentConfig.model_dump(mode="json")``); ``None``: imports only.

    Raises:
        OSError: a process could not be started (``subprocess.Popen``'s errors); those already started are stopped
            first (:meth:`close`), so a failed construction leaves no process behind.

    Thread safety: :meth:`take` and :meth:`close` may be called from any thread.
    """

    def __init__(self, count: int, config: Mapping[str, Any] | None = None) -> None:
        self.env = worker_env()
        self.taken = 0
        self._lock = threading.Lock()
        self._idle: list[subprocess.Popen] = []
        line = json.dumps({"config": dict(config) if config is not None else {}}) + "\n"
        # what `ps` shows: a worker of the experiment (the module reads its command from stdin, not these)
        label = ["worker", "--experiment", str(config["name"])] if config and config.get("name") else ["worker"]
        try:
            for _ in range(max(0, count)):
                process = subprocess.Popen([sys.executable, "-m", MODULE, *label], env=self.env,
                                           stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL, start_new_session=True)
                self._idle.append(process)  # first: whatever fails from here on, close() stops it
                assert process.stdin is not None
                try:
                    process.stdin.write(line.encode())
                    process.stdin.flush()
                except OSError:  # it died at once: take() skips it
                    pass
        except BaseException:  # a later start failed (fork or exec refused, interrupted): no half-started set left
            self.close()
            raise

    @property
    def idle(self) -> int:
        """Standby processes not taken yet (some may have died)."""
        with self._lock:
            return len(self._idle)

    @property
    def pids(self) -> list[int]:
        """Process ids of the standby processes not taken yet, oldest first."""
        with self._lock:
            return [process.pid for process in self._idle]

    def take(self, argv: list[str], env: Mapping[str, str], log_file: Path | None) -> subprocess.Popen | None:
        """A standby process, now running ``labswarm <argv>`` with ``env``'s entries that differ from its own and
        its output going to ``log_file``; ``None`` when none is left alive (the caller spawns a worker itself).

        Args:
            argv: the ``labswarm`` arguments (``["worker", "--experiment", ...]``).
            env: the environment the worker would have been spawned with.
            log_file: where its stdout and stderr go (appended), or ``None`` for nowhere.
        """
        changed = {k: v for k, v in env.items() if self.env.get(k) != v}
        line = json.dumps({"argv": list(argv), "env": changed, "log": str(log_file) if log_file else None}) + "\n"
        while True:
            with self._lock:
                if not self._idle:
                    return None
                process = self._idle.pop(0)
            assert process.stdin is not None
            try:
                if process.poll() is not None:
                    raise BrokenPipeError(f"standby {process.pid} exited with {process.returncode}")
                process.stdin.write(line.encode())
                process.stdin.close()
            except OSError as exc:
                log.warning("a standby worker cannot be used (%s): trying the next", exc)
                _end(process)
                continue
            with self._lock:
                self.taken += 1
            return process

    def close(self) -> None:
        """End the standby processes not taken (they hold nothing: no connection, no file of their own)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for process in idle:
            _end(process)


def _end(process: subprocess.Popen) -> None:
    """Stop a standby that was not given its command (SIGTERM to its group, SIGKILL after 5 s) and reap it."""
    with contextlib.suppress(OSError):
        if process.stdin is not None:
            process.stdin.close()
    for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        if process.poll() is not None:
            return
        with contextlib.suppress(OSError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(wait_s)
