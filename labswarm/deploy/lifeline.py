"""A local worker's lifeline to the process that launched it: the worker ends when its launcher ends, however that
ends (a crash, ``kill -9``, the OOM killer).

:class:`~labswarm.deploy.local.LocalLauncher` starts each worker in a session and process group of its own (so that
it can kill a worker and its pool processes as one), so the worker gets no signal when the launcher dies: a
``labswarm run`` killed with ``kill -9`` left its workers polling the embedded broker for good (issue 27). The
launcher names itself in each worker's environment (:data:`PARENT_ENV`: its process id; it is the worker's parent,
or the parent of the warm parent that forked the worker, :mod:`labswarm.deploy.standby`) and the worker runs
:func:`end_with_parent`: a thread that waits for that process to end (a pidfd, Linux >= 5.3, woken by the kernel
at its exit; elsewhere the parent's id polled every second, which changes when the parent dies and the worker is
re-parented), then asks the worker for a warm shutdown (SIGTERM: its running tasks finish
and are acknowledged, useful when the manager is another process that still runs) and kills the worker's process
group :data:`GRACE_S` later (a task that waits on a manager that died with the launcher never finishes). Nothing is
lost either way: a task not acknowledged is delivered again (RabbitMQ) or published again from the session's
ledger by the next run (the embedded broker, see :mod:`labswarm.sessions.ledger`).

The prediction endpoint's feature workers end with the server the same way (:mod:`labswarm.serve.features`,
through their multiprocessing parent's sentinel).
"""

from __future__ import annotations

import logging
import os
import select
import signal
import threading
import time
from collections.abc import Mapping

from labswarm.errors import ConfigError

log = logging.getLogger(__name__)

#: The environment variable that carries the launcher's process id to a worker it starts.
PARENT_ENV = "LABSWARM_LAUNCHER_PID"
#: Seconds a worker whose launcher ended gets for its warm shutdown before its process group is killed.
GRACE_S = 5.0
#: Seconds between two looks at the parent's id where no pidfd can be opened.
POLL_S = 1.0


def lifeline_env(pid: int | None = None) -> dict[str, str]:
    """The environment entries that bind a worker to the process ``pid`` (default: this one), which must be the
    worker's parent (the process that starts it) or its parent's parent (:func:`launched_by`)."""
    return {PARENT_ENV: str(os.getpid() if pid is None else pid)}


def end_with_parent(environ: Mapping[str, str] | None = None, grace_s: float = GRACE_S) -> threading.Thread | None:
    """In a worker: end this process (and its process group when it leads one) once the launcher that
    :data:`PARENT_ENV` names has ended; a launcher already gone ends it at once. Does nothing without
    :data:`PARENT_ENV` (a worker started by hand, a container's: they stay until stopped).

    Args:
        environ: where to read :data:`PARENT_ENV` (default ``os.environ``).
        grace_s: seconds between the warm shutdown (SIGTERM to this process) and SIGKILL to its group.

    Returns:
        The watching thread (a daemon), or ``None`` when there is nothing to watch.

    Raises:
        ConfigError: :data:`PARENT_ENV` is not a process id.
    """
    value = (os.environ if environ is None else environ).get(PARENT_ENV)
    if not value:
        return None
    try:
        parent = int(value)
    except ValueError:
        raise ConfigError([(PARENT_ENV, f"not a process id: {value!r}")]) from None
    thread = threading.Thread(target=_watch, args=(parent, grace_s), name="labswarm-lifeline", daemon=True)
    thread.start()
    return thread


def launched_by(pid: int) -> bool:
    """Whether the process ``pid`` started this one: it is this process's parent, or its parent's parent (a worker
    forked by the warm parent its launcher started, :mod:`labswarm.deploy.standby`)."""
    parent = os.getppid()
    if parent == pid:
        return True
    try:
        with open(f"/proc/{parent}/stat", "rb") as stat:
            # pid (comm) state ppid ...: comm may hold spaces and parentheses, the last ")" ends it
            return int(stat.read().rsplit(b")", 1)[1].split()[1]) == pid
    except (OSError, ValueError, IndexError):  # no /proc (another system), the parent gone meanwhile
        return False


def _watch(parent: int, grace_s: float) -> None:
    if launched_by(parent):
        _wait_for_exit(parent)
    log.warning("the launcher (pid %d) of this worker ended: warm shutdown, killed in %.0f s", parent, grace_s)
    os.kill(os.getpid(), signal.SIGTERM)  # Celery's warm shutdown; before Celery runs, the default: an exit
    time.sleep(grace_s)
    if os.getpgid(0) == os.getpid():  # this worker leads its group (the launcher's workers do): its pool too
        os.killpg(0, signal.SIGKILL)
    os._exit(1)


def _wait_for_exit(parent: int) -> None:
    """Return once ``parent``, the process that started this one (:func:`launched_by`), has ended."""
    try:
        fd = os.pidfd_open(parent)
    except (AttributeError, OSError):  # no pidfd here (another system, an old kernel): poll the parent's id
        while launched_by(parent):
            time.sleep(POLL_S)
        return
    try:
        if not launched_by(parent):  # ended before the pidfd was opened: the pidfd may name another process
            return
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while not poller.poll():  # readable once the process has exited
            pass
    finally:
        os.close(fd)
