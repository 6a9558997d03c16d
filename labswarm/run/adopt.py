"""A session left running by a ``labswarm run`` that did not end it (killed with ``kill -9``, the machine lost),
taken over by the next ``labswarm run`` of the same experiment on the same home.

The embedded manager lives as long as its run: a session of its database still running when the next run's
manager opens it was left by a run that died. That manager resumes it as after any restart (publishing what its
ledger has not yet published, reconciliation publishing again what the killed workers had taken and not computed:
:mod:`labswarm.sessions.reconcile`); the run then only scales its workers again and waits for its end, instead of
failing on the experiment's one active session (HTTP 409). Its workers ended with the killed run
(:mod:`labswarm.deploy.lifeline`).

Two runs of one experiment on one home at once would otherwise take the same session: while it lasts, a run holds
an exclusive lock on ``<home>/runs/<experiment>.lock`` (``flock``: released by the kernel however the process
ends), and a second run is refused with the first one's process id.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Any

from labswarm.client import ManagerClient
from labswarm.errors import LabswarmError

#: Where a run's lock lives, under the run's home.
LOCK_FILE = "runs/{experiment}.lock"


class RunLock:
    """The exclusive lock of one experiment's runs on one home (see the module); a context manager.

    Args:
        home: the run's home (``LABSWARM_HOME``).
        experiment: the experiment's name (``[a-z0-9][a-z0-9_.-]*``).

    Raises:
        LabswarmError: on entry, another run of the experiment holds the lock (its process id named).
        OSError: the lock file cannot be created.
    """

    def __init__(self, home: Path, experiment: str) -> None:
        self.path = home / LOCK_FILE.format(experiment=experiment)
        self.experiment = experiment
        self._fd: int | None = None

    def __enter__(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise LabswarmError(f"experiment {self.experiment!r} is being run by another labswarm run on this home "
                                f"(process {holder}; lock {self.path})") from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        self._fd = fd
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)  # releases the lock
            self._fd = None


def left_running(client: ManagerClient, experiment: str) -> dict[str, Any] | None:
    """The running session of ``experiment`` in the manager (``GET /sessions/{id}``'s progress), or ``None``.

    Only for a manager this run started, under its :class:`RunLock`: the session is then one that a killed run
    left (see the module).

    Raises:
        ManagerError: the manager cannot be reached.
    """
    for progress in client.sessions("running", limit=1000):
        if progress.get("experiment") == experiment:
            return progress
    return None
