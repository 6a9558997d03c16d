"""Learners as local processes: the embedded default launcher of training jobs.

Each learner runs ``python -m labswarm.jobs.learner SPEC.json`` in a session (and process group) of its own, so
it outlives a manager that stops or restarts, and its data-loading children can be killed with it. A learner is
identified by its pid together with its process start time (psutil's ``create_time``), so a pid reused by another
program is never taken for the learner: a restarted manager re-attaches to a learner that is still alive and never
starts a second copy of it.

A halt signals the learner's pid only (SIGTERM: it checkpoints and exits; its process group holds the
data-loading processes, which must not be stopped under it); a kill (watchdog, grace over, delete) sends SIGKILL
to the whole group.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import psutil

#: The file in its working folder a learner writes its exit code to (``{"code": N}``), read by a manager that is
#: not its parent (it restarted).
EXIT_FILE = "exit.json"


class LocalLearners:
    """Starts, watches and stops learner processes on this machine."""

    def __init__(self) -> None:
        self._children: dict[int, subprocess.Popen] = {}

    def start(self, spec: Path, out: Path, env: Mapping[str, str]) -> tuple[int, float]:
        """Start a learner on ``spec``, its raw output (what it prints before and after capturing its own) into
        ``out``.

        Returns:
            ``(pid, create_time)``, create time in Unix seconds.

        Raises:
            OSError: the process could not be started.
        """
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "ab") as handle:
            process = subprocess.Popen([sys.executable, "-m", "labswarm.jobs.learner", str(spec)],
                                       stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       env=dict(env), start_new_session=True)
        self._children[process.pid] = process
        try:
            created = psutil.Process(process.pid).create_time()
        except psutil.Error:  # already gone: its exit is found by poll
            created = 0.0
        return process.pid, created

    def poll(self, pid: int, created: float | None, workdir: Path) -> tuple[bool, int | None]:
        """Whether the learner is alive and, when it ended, its exit code (``None``: unknown, e.g. killed while
        this manager was not its parent). A negative code is the signal that killed it."""
        child = self._children.get(pid)
        if child is not None:
            code = child.poll()
            if code is None:
                return True, None
            del self._children[pid]
            return False, code
        if self._alive(pid, created):
            return True, None
        try:
            return False, int(json.loads((workdir / EXIT_FILE).read_text())["code"])
        except (OSError, ValueError, KeyError, TypeError):
            return False, None

    def terminate(self, pid: int, created: float | None) -> None:
        """SIGTERM to the learner only (a cooperative halt)."""
        if self._alive(pid, created):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def kill(self, pid: int, created: float | None) -> None:
        """SIGKILL to the learner's whole process group (its data-loading children too); also cleans up what a
        dead learner left behind in its group."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)  # its session's group: pgid == pid
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)

    def _alive(self, pid: int, created: float | None) -> bool:
        try:
            process = psutil.Process(pid)
            if created and abs(process.create_time() - created) > 0.05:
                return False  # the pid now belongs to another process
            return process.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False
