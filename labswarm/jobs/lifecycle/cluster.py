"""What a distributed job (``learners: N`` with a distributed framework) runs beside its learners: its
coordinator, hosted by the manager, and its parameter-server shards: local processes (:class:`LocalShards`), or
docker swarm services with ``LABSWARM_JOB_LAUNCHER=swarm`` (:class:`~labswarm.deploy.swarm_shards.SwarmShards`).

Per job the lifecycle keeps one :class:`JobCluster`:

- the :class:`~labswarm.train.distributed.launch.JobCoordinator` (a ``TCPStore`` server in the manager's process: the
  learners' rendezvous and the global cursor's state). It outlives a learner restarted alone (asynchronous
  frameworks: the cursor's leases of the dead learner expire and are taken over). A new attempt (a synchronous
  restart, a resume) gets a fresh coordinator, into which the cursor of the checkpoint it starts from is restored
  (:meth:`JobCluster.new_attempt`): the passes after the checkpoint start clean, so every sample of a pass is
  trained once. Its port is in the attempt's ``started`` event. Its store listens on every interface of the
  manager: local learners are told the loopback address, swarm learners the manager's address on the overlay
  network (the host of ``swarm_manager_url``);
- the shards (``python -m labswarm.train.distributed.ps``, from
  :func:`~labswarm.train.distributed.launch.plan_attempt`), started before the learners, which are given the
  addresses they serve on (a local shard binds a port the kernel picks and writes it to its ready file: a port
  chosen first and bound later could be taken meanwhile by another process of the machine; a service name on a
  swarm), checkpointing into ``<home>/<job>/ps`` (on a swarm, a folder of the shared data volume): a shard that dies
  is started again at its address and resumes from its checkpoint (:meth:`JobCluster.revive`); shards stopped with
  their attempt (:meth:`JobCluster.close`) and started by the next take new ports.

The cluster lives in the manager's memory: a manager that restarts loses it, the learners lose their store and
fail, and the job restarts them (a new attempt) within its platform budget; shards a dead manager left behind are
not adopted (local ones: their pids are in the attempt's event; swarm services: the restarted manager's first pass
removes them). :meth:`JobCluster.close` kills the shards and closes the
coordinator (the attempt or the job ended); ``close(discard=True)`` (a delete) removes the shards' checkpoints too.
The environment of each learner (:attr:`JobCluster.envs`, from ``plan_attempt``: its place in the job, and what
else the plan gives, e.g. a per-job parameter-server secret) is kept for a learner restarted alone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Protocol

from labswarm.errors import DeployError
from labswarm.train.distributed.launch import JobCoordinator, ProcessPlan, plan_attempt
from labswarm.train.distributed.ps.auth import new_secret

log = logging.getLogger(__name__)

#: Seconds a shard may take to listen after it starts (import of torch included) before the deploy fails.
SHARD_START_S = 60.0


class ShardRunner(Protocol):
    """Where a job's shards run (:class:`LocalShards`, :class:`~labswarm.deploy.swarm_shards.SwarmShards`).

    Attributes:
        bind_host: the address the coordinator's store is created with in the manager.
        master_host: the coordinator's address as the learners reach it (``MASTER_ADDR``).
        checkpoint_dir: the shards' checkpoint folder, as the shards see it.
    """

    bind_host: str
    master_host: str
    checkpoint_dir: Path

    def address(self, index: int) -> tuple[str, int]:
        """Shard ``index``'s ``(host, port)`` as the learners reach it once :meth:`start` returned (a swarm's: fixed
        for the job; a local shard's port: the one it bound, 0 before it was started)."""

    def start(self, index: int, argv: list[str], env: dict[str, str], wait: bool = True) -> None:
        """Start shard ``index`` (``wait``: until it serves). Raises DeployError or OSError."""

    def running(self, index: int) -> bool:
        """Whether shard ``index`` was started and has not ended."""

    def dead(self) -> list[int]:
        """The started shards that ended."""

    def exit_code(self, index: int) -> int | None:
        """How the ended shard ``index`` exited (``None``: unknown)."""

    def stop(self) -> None:
        """Stop every shard."""

    def discard(self) -> None:
        """Remove the shards' checkpoints."""

    def handles(self) -> dict[str, Any]:
        """What the attempt's ``started`` event records of the shards."""


class LocalShards:
    """A job's shards as processes of this machine (``python -m labswarm.train.distributed.ps``), each in a session of
    its own. A shard started with port 0 binds one the kernel picks and writes it to its ready file, which
    :meth:`start` reads (:meth:`address`); one started again with the port it had (a revived shard, whose learners
    know it) takes it back; :meth:`stop` forgets the ports, so the next attempt's shards take new ones (a port
    another process took meanwhile is not the job's for its whole life).

    Args:
        job_id: the job.
        home: the job's local folder; the shards checkpoint into ``home/ps`` (removed with the job's folder).
        host: the address the shards and the coordinator listen on (and the learners are given).
    """

    def __init__(self, job_id: str, home: Path, host: str = "127.0.0.1") -> None:
        self.job_id, self.home = job_id, home
        self.bind_host = self.master_host = host
        self.checkpoint_dir = home / "ps"
        self.procs: dict[int, subprocess.Popen] = {}
        self._ports: dict[int, int] = {}  # each started shard's port, from its ready file

    def address(self, index: int) -> tuple[str, int]:
        """``(host, the port shard index serves on)``: 0 before it was started (the shard then binds a free one below
        the kernel's ephemeral range: :func:`labswarm.ports.listen_free`), and again after :meth:`stop`."""
        return self.bind_host, self._ports.get(index, 0)

    def start(self, index: int, argv: list[str], env: dict[str, str], wait: bool = True) -> None:
        """Start shard ``index`` (its output into ``home/ps/shard-<k>.out``) on the port ``argv`` names (``--port``;
        0: a free one below the kernel's ephemeral range, :func:`labswarm.ports.listen_free`); with ``wait``, until
        it listens, its port read from its ready file (without: a revived shard on the port it had, which it fails
        to bind if that was taken meanwhile: it exits, found dead at the next pass).

        Raises:
            DeployError: it exited (its port taken, say) or did not listen within :data:`SHARD_START_S`.
            OSError: the process could not be started.
        """
        ready = self.checkpoint_dir / f"shard-{index}.port"
        ready.parent.mkdir(parents=True, exist_ok=True)
        ready.unlink(missing_ok=True)
        with open(self.checkpoint_dir / f"shard-{index}.out", "ab") as out:
            proc = subprocess.Popen([*argv, "--ready-file", str(ready)], stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1", **env},
                                    start_new_session=True)
        self.procs[index] = proc
        deadline = time.monotonic() + SHARD_START_S
        while wait and not ready.exists():  # the DLaaS order: the server listens before the learners start
            if proc.poll() is not None or time.monotonic() > deadline:
                _kill(proc)
                raise DeployError(f"parameter-server shard {index} of job {self.job_id} did not start (exit code "
                                  f"{proc.poll()}); see {ready.with_suffix('.out')}")
            time.sleep(0.05)
        if wait:
            self._ports[index] = int(ready.read_text())
        log.info("job %s: parameter-server shard %d listens on %s:%d (pid %d)", self.job_id, index,
                 *self.address(index), proc.pid)

    def running(self, index: int) -> bool:
        """Whether shard ``index``'s process runs."""
        return index in self.procs and self.procs[index].poll() is None

    def dead(self) -> list[int]:
        """The shards whose process exited."""
        return [k for k, proc in self.procs.items() if proc.poll() is not None]

    def exit_code(self, index: int) -> int | None:
        """Shard ``index``'s exit status (``None``: it runs, or was never started)."""
        proc = self.procs.get(index)
        return None if proc is None else proc.poll()

    def stop(self) -> None:
        """Kill the shards (their process groups) and wait for them; their ports are forgotten (the next shards
        take new ones)."""
        for proc in self.procs.values():
            _kill(proc)
        self.procs.clear()
        self._ports.clear()

    def discard(self) -> None:
        """Nothing: the checkpoints are in the job's folder, which a delete removes."""

    def handles(self) -> dict[str, Any]:
        """The shards' process ids (``ps_pids``)."""
        return {"ps_pids": [proc.pid for proc in self.procs.values()]}


class JobCluster:
    """The coordinator and shards of one distributed job (see the module docstring).

    Args:
        job_id: the job.
        home: the job's local folder (``<job home>/<job_id>``); local shards checkpoint into ``home/ps``.
        framework: the manifest's ``framework`` spec.
        learners: ``N``.
        shards: parameter-server shards (0: the framework needs none).
        host: where the coordinator and local shards listen (loopback: local learners only).
        runner: where the shards run; default :class:`LocalShards` (``job_id``, ``home``, ``host``).
    """

    def __init__(self, job_id: str, home: Path, framework: dict[str, Any], learners: int, shards: int,
                 host: str = "127.0.0.1", runner: ShardRunner | None = None) -> None:
        self.job_id = job_id
        self.home = home
        self.framework = framework
        self.learners = learners
        self.runner: ShardRunner = runner if runner is not None else LocalShards(job_id, home, host)
        self.host = self.runner.master_host
        self.coordinator: JobCoordinator | None = None
        self.shards = shards
        self.ps_addresses = [self.runner.address(k) for k in range(shards)]
        #: each rank's environment in the current attempt (from ``plan_attempt``), for a learner restarted alone
        self.envs: dict[int, dict[str, str]] = {}
        self._plans: dict[int, ProcessPlan] = {}
        #: the job's parameter-server secret: one per job, so shards kept across attempts and a learner restarted
        #: alone share it; only in the plans' environments (``LABSWARM_PS_SECRET``)
        self._ps_secret = new_secret()

    @property
    def port(self) -> int | None:
        """The coordinator's port (``None`` before the first attempt)."""
        return None if self.coordinator is None else self.coordinator.port

    def new_attempt(self, attempt: int, cursor: dict[str, Any] | None) -> list[ProcessPlan]:
        """A fresh coordinator for ``attempt`` (the previous one closed) with ``cursor`` restored into it, the shards
        started (or kept while they run) and serving; returns the learners' plans (their environments), which name
        the addresses the shards serve on (read once they serve: a local shard's port is the kernel's choice).

        Raises:
            DeployError: a shard did not start (locally: did not listen within :data:`SHARD_START_S`).
            ConfigError: the framework or its parameters are invalid.
        """
        self.coordinator = None  # its TCPStore server closes with it
        self.coordinator = JobCoordinator(self.runner.bind_host)
        if cursor is not None:
            try:
                self.coordinator.restore_cursor(cursor)
            except Exception as exc:  # a cursor of another layout: the passes after the checkpoint start clean
                log.warning("job %s: the checkpoint's cursor was not restored: %s", self.job_id, exc)
        master = (self.host, self.coordinator.port)
        self.ps_addresses = [self.runner.address(k) for k in range(self.shards)]  # 0: stopped, a new port
        for plan in self._plan(attempt, master):
            if plan.kind == "ps" and plan.argv is not None and not self.runner.running(plan.index):
                self.runner.start(plan.index, plan.argv, plan.env)
        self.ps_addresses = [self.runner.address(k) for k in range(self.shards)]
        plans = self._plan(attempt, master)  # the addresses the shards serve on
        self._plans.update({p.index: p for p in plans if p.kind == "ps" and p.argv is not None})  # for revive
        learners = [p for p in plans if p.kind == "learner"]
        self.envs = {p.index: dict(p.env) for p in learners}
        return learners

    def _plan(self, attempt: int, master: tuple[str, int]) -> list[ProcessPlan]:
        """:func:`~labswarm.train.distributed.launch.plan_attempt` for ``attempt`` on the current shard addresses."""
        return plan_attempt(self.framework, self.learners, attempt, master, self.ps_addresses,
                            self.runner.checkpoint_dir, ps_secret=self._ps_secret)

    def dead_shards(self) -> list[int]:
        """The shards that have exited."""
        return self.runner.dead()

    def revive(self, index: int) -> int | None:
        """Start shard ``index`` again at its address (the learners know it; it resumes from its checkpoint; if
        another process took its port meanwhile, it exits and is found dead again, until the platform budget ends
        the attempt and the next one's shards take new ports) without waiting for it to serve (the learners'
        clients reconnect and retry meanwhile; the manager's lock is not held that long); returns the exit code of
        the one that died. One that fails to start is found dead at the next pass.

        Raises:
            OSError: it could not be started (the engine's :class:`DeployError` too, as the lifecycle counts either
                as a failed platform restart).
        """
        code = self.runner.exit_code(index)
        plan = self._plans[index]
        try:
            self.runner.start(index, plan.argv or [], plan.env, wait=False)
        except DeployError as exc:
            raise OSError(str(exc)) from exc
        return code

    @property
    def shard_pids(self) -> list[int]:
        """The local shards' process ids (none on a swarm)."""
        return list(self.runner.handles().get("ps_pids", []))

    def where(self) -> dict[str, Any]:
        """What the attempt's ``started`` event records: the coordinator's address, the shards' and their
        handles (``ps_pids`` or ``ps_services``)."""
        return {"coordinator": f"{self.host}:{self.port}", "coordinator_port": self.port,
                "ps": [f"{h}:{p}" for h, p in self.ps_addresses], **self.runner.handles()}

    def stop_shards(self) -> None:
        """Stop the shards (kill their processes, or remove their services)."""
        self.runner.stop()

    def close(self, discard: bool = False) -> None:
        """Stop the shards and close the coordinator (its port is free afterwards); ``discard`` (a delete):
        remove the shards' checkpoints too."""
        self.stop_shards()
        self.coordinator = None
        if discard:
            self.runner.discard()


def _kill(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
