"""What a distributed job (``learners: N`` with a distributed framework) runs beside its learners: its
coordinator and its parameter-server shards, hosted by the manager (local processes only).

Per job the lifecycle keeps one :class:`JobCluster`:

- the :class:`~labswarm.learners.launch.JobCoordinator` (a ``TCPStore`` server in the manager's process: the
  learners' rendezvous and the global cursor's state). It outlives a learner restarted alone (asynchronous
  frameworks: the cursor's leases of the dead learner expire and are taken over). A new attempt (a synchronous
  restart, a resume) gets a fresh coordinator, into which the cursor of the checkpoint it starts from is restored
  (:meth:`JobCluster.new_attempt`): the passes after the checkpoint start clean, so every sample of a pass is
  trained once. Its port is in the attempt's ``started`` event;
- the shards (``python -m labswarm.learners.ps``, from :func:`~labswarm.learners.launch.plan_attempt`), started
  before the learners on ports chosen once per job and kept, checkpointing into ``<home>/<job>/ps``: a shard that
  dies is started again on its port and resumes from its checkpoint (:meth:`JobCluster.revive`).

The cluster lives in the manager's memory: a manager that restarts loses it, the learners lose their store and
fail, and the job restarts them (a new attempt) within its platform budget; shards a dead manager left behind are
not adopted (their pids are in the attempt's event). :meth:`JobCluster.close` kills the shards and closes the
coordinator (the job ended, or was deleted).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from labswarm.errors import DeployError
from labswarm.learners.launch import JobCoordinator, ProcessPlan, plan_attempt

log = logging.getLogger(__name__)

#: Seconds a shard may take to listen after it starts (import of torch included) before the deploy fails.
SHARD_START_S = 60.0


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now (the kernel's choice)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class JobCluster:
    """The coordinator and shards of one distributed job (see the module docstring).

    Args:
        job_id: the job.
        home: the job's local folder (``<job home>/<job_id>``); shards checkpoint into ``home/ps``.
        framework: the manifest's ``framework`` spec.
        learners: ``N``.
        shards: parameter-server shards (0: the framework needs none).
        host: where the coordinator and shards listen (loopback: local learners only).
    """

    def __init__(self, job_id: str, home: Path, framework: dict[str, Any], learners: int, shards: int,
                 host: str = "127.0.0.1") -> None:
        self.job_id = job_id
        self.home = home
        self.framework = framework
        self.learners = learners
        self.host = host
        self.coordinator: JobCoordinator | None = None
        self.ps_addresses = [(host, free_port(host)) for _ in range(shards)]
        self.shards: dict[int, subprocess.Popen] = {}
        self._argv: dict[int, list[str]] = {}

    @property
    def port(self) -> int | None:
        """The coordinator's port (``None`` before the first attempt)."""
        return None if self.coordinator is None else self.coordinator.port

    def new_attempt(self, attempt: int, cursor: dict[str, Any] | None) -> list[ProcessPlan]:
        """A fresh coordinator for ``attempt`` (the previous one closed) with ``cursor`` restored into it, the shards
        started (or kept while they run) and listening; returns the learners' plans (their environments).

        Raises:
            DeployError: a shard did not start listening within :data:`SHARD_START_S`.
            ConfigError: the framework or its parameters are invalid.
        """
        self.coordinator = None  # its TCPStore server closes with it
        self.coordinator = JobCoordinator(self.host)
        if cursor is not None:
            try:
                self.coordinator.restore_cursor(cursor)
            except Exception as exc:  # a cursor of another layout: the passes after the checkpoint start clean
                log.warning("job %s: the checkpoint's cursor was not restored: %s", self.job_id, exc)
        plans = plan_attempt(self.framework, self.learners, attempt, (self.host, self.coordinator.port),
                             self.ps_addresses, self.home / "ps")
        for plan in plans:
            if plan.kind == "ps" and plan.argv is not None:
                self._argv[plan.index] = plan.argv
                if plan.index not in self.shards or self.shards[plan.index].poll() is not None:
                    self._start_shard(plan.index)
        return [p for p in plans if p.kind == "learner"]

    def _start_shard(self, index: int, wait: bool = True) -> None:
        ready = self.home / "ps" / f"shard-{index}.port"
        ready.parent.mkdir(parents=True, exist_ok=True)
        ready.unlink(missing_ok=True)
        with open(self.home / "ps" / f"shard-{index}.out", "ab") as out:
            proc = subprocess.Popen([*self._argv[index], "--ready-file", str(ready)], stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
        self.shards[index] = proc
        deadline = time.monotonic() + SHARD_START_S
        while wait and not ready.exists():  # the DLaaS order: the server listens before the learners start
            if proc.poll() is not None or time.monotonic() > deadline:
                self._kill(proc)
                raise DeployError(f"parameter-server shard {index} of job {self.job_id} did not start (exit code "
                                  f"{proc.poll()}); see {ready.with_suffix('.out')}")
            time.sleep(0.05)
        log.info("job %s: parameter-server shard %d listens on %s:%d (pid %d)", self.job_id, index,
                 *self.ps_addresses[index], proc.pid)

    def dead_shards(self) -> list[int]:
        """The shards that have exited."""
        return [k for k, proc in self.shards.items() if proc.poll() is not None]

    def revive(self, index: int) -> int | None:
        """Start shard ``index`` again on its port (it resumes from its checkpoint) without waiting for it to
        listen (the learners' clients reconnect and retry meanwhile; the manager's lock is not held that long);
        returns the exit code of the one that died. One that fails to start is found dead at the next pass."""
        code = self.shards[index].poll()
        self._start_shard(index, wait=False)
        return code

    @property
    def shard_pids(self) -> list[int]:
        """The shards' process ids."""
        return [proc.pid for proc in self.shards.values()]

    def stop_shards(self) -> None:
        """Kill the shards (their process groups) and wait for them."""
        for proc in self.shards.values():
            self._kill(proc)
        self.shards.clear()

    def close(self) -> None:
        """Kill the shards and close the coordinator (its port is free afterwards)."""
        self.stop_shards()
        self.coordinator = None

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
