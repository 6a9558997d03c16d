"""The launcher's side of the warm start of local learners (``LABSWARM_LEARNER_WARM_START``): one process,
``python -m labswarm.jobs.learner.warm``, has imported the learner's modules and forks each learner; this module
starts it, sends it a learner to fork and hears which of them ended (the protocol:
:mod:`labswarm.jobs.learner.warm`).

The forked learners are not this process's children: their exit codes come from the warm process's reports
(:meth:`WarmStarter.exit_code`); once it is gone (a manager that restarted), a learner's own exit file tells, as
for any learner a previous manager started.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from typing import IO, Any

log = logging.getLogger(__name__)

#: Seconds a start waits for the warm process's answer (its first one waits for its imports too).
ANSWER_S = 300.0


class WarmStarter:
    """The warm process and its reports.

    Args:
        env: its environment (the manager's less its secrets: it is every learner's until the request's own).
        on_exit: called (from a reader thread) when a learner it forked ended.
    """

    def __init__(self, env: Mapping[str, str], on_exit: Callable[[], None] | None = None) -> None:
        self.on_exit = on_exit
        self._exits: dict[int, int] = {}
        self._answers: queue.Queue[int | None] = queue.Queue()
        self._process = subprocess.Popen([sys.executable, "-m", "labswarm.jobs.learner.warm"], env=dict(env),
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
        assert self._process.stdout is not None
        self._reader = threading.Thread(target=self._read, args=(self._process.stdout,), daemon=True,
                                        name="labswarm-warm-learners")
        self._reader.start()

    def alive(self) -> bool:
        """Whether the warm process still runs."""
        return self._process.poll() is None

    def start(self, request: dict[str, Any]) -> int:
        """Fork a learner (``request``: :mod:`labswarm.jobs.learner.warm`'s fields); returns its pid.

        Raises:
            OSError: the warm process is gone or did not answer within :data:`ANSWER_S` (it is then killed, so
                that no late answer reaches a later start).
        """
        stdin = self._process.stdin
        if stdin is None or not self.alive():
            raise OSError("the warm learner process has ended")
        stdin.write((json.dumps(request) + "\n").encode())
        stdin.flush()
        try:
            pid = self._answers.get(timeout=ANSWER_S)
        except queue.Empty:
            # killed: its late answer would otherwise be taken by the next start (another job's learner), and a
            # learner it forked after this wait would run untracked; the launcher starts a new warm process
            self._process.kill()
            raise OSError(f"the warm learner process did not answer within {ANSWER_S:.0f} s") from None
        if pid is None:
            raise OSError("the warm learner process has ended")
        return pid

    def exit_code(self, pid: int) -> int | None:
        """The exit status of the learner ``pid`` if the warm process reported it ended (once), else ``None``."""
        return self._exits.pop(pid, None)

    def close(self) -> None:
        """End the warm process (its learners go on)."""
        with contextlib.suppress(OSError, ValueError):
            if self._process.stdin is not None:
                self._process.stdin.close()
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._reader.join(10)  # at the end of its output
        if self._process.stdout is not None:
            self._process.stdout.close()

    def _read(self, stdout: IO[bytes]) -> None:
        for raw in stdout:
            try:
                message = json.loads(raw)
            except ValueError:
                log.warning("warm learner process: %r", raw[:200])
                continue
            if "pid" in message:
                self._answers.put(int(message["pid"]))
            elif "exit" in message:
                self._exits[int(message["exit"])] = int(message["code"])
                if self.on_exit is not None:
                    self.on_exit()
        self._answers.put(None)  # gone: a start waiting is told
