"""How learners run: the launcher interface of training jobs, and learners as local processes (the embedded
default launcher); :mod:`labswarm.deploy.swarm_learners` runs them as docker swarm services
(``LABSWARM_JOB_LAUNCHER``, :func:`learner_launcher`).

A local learner runs ``python -m labswarm.jobs.learner.entry SPEC.json`` in a session (and process group) of its own, so
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
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import psutil

from labswarm.errors import ConfigError

if TYPE_CHECKING:
    from labswarm.jobs.service.models import LearnerRow
    from labswarm.settings import Settings

#: The file in its working folder a learner writes its exit code to (``{"code": N}``), read by a manager that is
#: not its parent (it restarted).
EXIT_FILE = "exit.json"
#: What a ``command`` learner writes in its working folder when it starts the user's program, which runs in a
#: process group of its own (a halt's SIGTERM must reach the program's children, not the learner):
#: ``"<pid> <start time>"``, so that killing the learner kills the program too, even once the learner is gone.
PROGRAM_FILE = "program.pid"


@dataclass(frozen=True)
class LearnerLaunch:
    """What the lifecycle hands a launcher to start one learner (:meth:`LearnerLauncher.start`).

    Attributes:
        job_id: the job.
        attempt: the attempt number, from 1.
        rank: the learner's rank in the attempt.
        spec: the learner's spec (:class:`~labswarm.jobs.learner.entry.LearnerSpec` fields, as JSON data); a launcher
            may change where it runs (``workdir``) and how it reaches the manager (``manager_url``).
        spec_path: where the manager keeps the spec as a file (a local learner reads it; written by the launcher).
        out: the file of the learner's raw output (what it prints outside its own capture), on the manager.
        token: the attempt's own API token (:mod:`labswarm.jobs.service.credentials`).
        gpus: the learner's ``CUDA_VISIBLE_DEVICES`` (local GPUs the lifecycle counted), ``None`` without.
        resources: the manifest's ``resources`` per learner (``cpus``, ``gpus``, ``memory_mb``).
        env: variables added to the learner's environment after the manager's secrets are removed: a distributed
            learner's place in the job (:func:`labswarm.train.distributed.launch.plan_attempt`: ``RANK``,
            ``WORLD_SIZE``,
            ``MASTER_ADDR``/``MASTER_PORT``, ``LABSWARM_ATTEMPT``, ``LABSWARM_PS_ADDRS``, ...); none for one.
    """

    job_id: str
    attempt: int
    rank: int
    spec: dict[str, Any]
    spec_path: Path
    out: Path
    token: str
    gpus: str | None = None
    resources: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LearnerHandle:
    """How the database finds a learner again (the columns of ``job_learners`` a launcher fills).

    Attributes:
        pid: a local learner's process id.
        pid_created: its process start time (Unix seconds, psutil's ``create_time``).
        service_id: a swarm learner's service id.
    """

    pid: int | None = None
    pid_created: float | None = None
    service_id: str | None = None


@dataclass(frozen=True)
class LearnerStatus:
    """What :meth:`LearnerLauncher.poll` found.

    Attributes:
        alive: the learner runs (or is being started).
        exit_code: when it ended, its exit status (negative: the signal that killed it); ``None``: unknown.
        deploy_failed: it never started (the platform could not place or start it: a fault ``S105``).
        reason: one line on how it ended, for the job's log (``None``: nothing to add).
    """

    alive: bool
    exit_code: int | None = None
    deploy_failed: bool = False
    reason: str | None = None


class LearnerLauncher(ABC):
    """Starts, watches and stops the learners of training jobs. Every method but :meth:`start` takes the
    learner's row, whose handle columns (``pid``/``pid_created`` or ``service_id``) :meth:`start` returned; a
    launcher keeps nothing that a restarted manager would need.

    :meth:`poll`, :meth:`terminate`, :meth:`kill` and :meth:`output_tail` do not raise: a launcher that cannot
    tell logs why and answers ``alive`` (the watchdog's heartbeats still apply) or nothing.
    """

    #: Whether the lifecycle hands out this machine's GPUs (``CUDA_VISIBLE_DEVICES``); a swarm places GPUs itself.
    local_gpus: ClassVar[bool] = True
    #: Called, from another thread, when a learner this launcher started exits (where the launcher can tell at
    #: once: local processes): the lifecycle wakes then instead of at its next pass.
    on_exit: Callable[[], None] | None = None

    @abstractmethod
    def start(self, launch: LearnerLaunch) -> LearnerHandle:
        """Start one learner.

        Raises:
            OSError: a local process could not be started.
            labswarm.errors.DeployError: the Docker engine refused or could not be reached.
        """

    @abstractmethod
    def poll(self, learner: LearnerRow) -> LearnerStatus:
        """Whether the learner is alive and, when it ended, how."""

    @abstractmethod
    def terminate(self, learner: LearnerRow) -> None:
        """Ask the learner to halt (it checkpoints and exits); the manager's answer to its next report asks too."""

    @abstractmethod
    def kill(self, learner: LearnerRow) -> None:
        """Stop the learner now (watchdog, halt grace over, delete); after it ended, clean up what it left."""

    def output_tail(self, learner: LearnerRow, lines: int) -> list[str]:
        """The last ``lines`` lines the learner printed outside its own capture (a crash before it started
        capturing), read before :meth:`kill` cleans up; none by default."""
        return []

    def sweep(self, live: set[str], owns: Callable[[str], bool]) -> None:  # noqa: B027 (a hook, empty on purpose)
        """Hook of a manager's first pass: remove what a previous manager started and never recorded.

        Args:
            live: the handles (service ids) of the learners the database says have not ended.
            owns: whether a job id is one of this manager's jobs (what is not is never touched).
        """


class LocalLearners(LearnerLauncher):
    """Starts, watches and stops learner processes on this machine."""

    def __init__(self) -> None:
        self._children: dict[int, subprocess.Popen] = {}

    def start(self, launch: LearnerLaunch) -> LearnerHandle:
        """Write the spec to ``launch.spec_path`` and start ``python -m labswarm.jobs.learner.entry SPEC`` with the
        manager's environment less its secrets, plus the attempt's token, ``CUDA_VISIBLE_DEVICES`` and ``launch.env``
        (:func:`~labswarm.jobs.service.credentials.learner_environment`), its raw output into ``launch.out``.

        Returns:
            The pid and the process's create time (Unix seconds).

        Raises:
            OSError: the spec could not be written or the process could not be started.
        """
        from labswarm.jobs.service.credentials import learner_environment  # the learner imports this module: kept light

        launch.spec_path.parent.mkdir(parents=True, exist_ok=True)
        launch.spec_path.write_text(json.dumps(launch.spec))
        env = learner_environment(os.environ, launch.token)  # none of the manager's secrets; the attempt's token
        if launch.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = launch.gpus
        env.update(launch.env)  # a distributed learner's place in the job and the per-job shard secret
        launch.out.parent.mkdir(parents=True, exist_ok=True)
        with open(launch.out, "ab") as handle:
            process = subprocess.Popen([sys.executable, "-m", "labswarm.jobs.learner.entry", str(launch.spec_path)],
                                       stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       env=env, start_new_session=True)
        self._children[process.pid] = process
        if self.on_exit is not None:
            threading.Thread(target=self._wait, args=(process, self.on_exit), daemon=True,
                             name=f"labswarm-learner-{process.pid}-exit").start()
        try:
            created = psutil.Process(process.pid).create_time()
        except psutil.Error:  # already gone: its exit is found by poll
            created = 0.0
        return LearnerHandle(pid=process.pid, pid_created=created)

    @staticmethod
    def _wait(process: subprocess.Popen, on_exit: Callable[[], None]) -> None:
        """Wait for the process to exit (its status stays in ``process``: :meth:`poll` reads it), then call
        ``on_exit``."""
        process.wait()
        on_exit()

    def poll(self, learner: LearnerRow) -> LearnerStatus:
        """Alive, or its exit code (``None``: unknown, e.g. killed while this manager was not its parent)."""
        pid, created = learner.pid, learner.pid_created
        if pid is None:
            return LearnerStatus(False)
        child = self._children.get(pid)
        if child is not None:
            code = child.poll()
            if code is None:
                return LearnerStatus(True)
            del self._children[pid]
            return LearnerStatus(False, code)
        if self._alive(pid, created):
            return LearnerStatus(True)
        try:
            return LearnerStatus(False, int(json.loads((Path(learner.workdir) / EXIT_FILE).read_text())["code"]))
        except (OSError, ValueError, KeyError, TypeError):
            return LearnerStatus(False)

    def terminate(self, learner: LearnerRow) -> None:
        """SIGTERM to the learner only (a cooperative halt)."""
        if learner.pid is not None and self._alive(learner.pid, learner.pid_created):
            with contextlib.suppress(ProcessLookupError):
                os.kill(learner.pid, signal.SIGTERM)

    def kill(self, learner: LearnerRow) -> None:
        """SIGKILL to the learner's whole process group (its data-loading children too) and to the groups of its
        other descendants (a ``command`` learner's program runs in a group of its own: :data:`PROGRAM_FILE`, read
        also when the learner is already gone); also cleans up what a dead learner left behind in its group."""
        if learner.pid is None:
            return
        groups = {learner.pid}  # its session's group: pgid == pid
        if self._alive(learner.pid, learner.pid_created):
            with contextlib.suppress(psutil.Error):
                for child in psutil.Process(learner.pid).children(recursive=True):
                    with contextlib.suppress(psutil.Error, OSError):
                        groups.add(os.getpgid(child.pid))
        if (program := _program(Path(learner.workdir) / PROGRAM_FILE)) is not None:
            with contextlib.suppress(OSError):
                groups.add(os.getpgid(program))
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(learner.pid, signal.SIGKILL)

    def output_tail(self, learner: LearnerRow, lines: int) -> list[str]:
        """The last lines of ``learner-<rank>.out`` beside its working folder."""
        out = Path(learner.workdir).parent / f"learner-{learner.rank}.out"
        try:
            return out.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
        except OSError:
            return []

    def _alive(self, pid: int, created: float | None) -> bool:
        try:
            process = psutil.Process(pid)
            if created and abs(process.create_time() - created) > 0.05:
                return False  # the pid now belongs to another process
            return process.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False


def _swarm(settings: Settings) -> LearnerLauncher:
    from labswarm.deploy.swarm_learners import SwarmLearners  # the docker SDK, imported on first use

    return SwarmLearners(settings)


#: The launchers of learners by ``job_launcher`` name (tests replace an entry to inject a fake engine).
JOB_LAUNCHERS: dict[str, Callable[[Settings], LearnerLauncher]] = {"local": lambda _settings: LocalLearners(),
                                                                  "swarm": _swarm}


def learner_launcher(settings: Settings) -> LearnerLauncher:
    """The launcher ``settings.job_launcher`` names (:data:`JOB_LAUNCHERS`): ``local`` (:class:`LocalLearners`)
    or ``swarm`` (:class:`~labswarm.deploy.swarm_learners.SwarmLearners`).

    Raises:
        ConfigError: an unknown name (with the known ones).
    """
    factory = JOB_LAUNCHERS.get(settings.job_launcher)
    if factory is None:
        raise ConfigError([("job_launcher", f"unknown launcher {settings.job_launcher!r}; known: "
                                            f"{', '.join(sorted(JOB_LAUNCHERS))}")])
    return factory(settings)


def _program(path: Path) -> int | None:
    """The pid of the program :data:`PROGRAM_FILE` names, if that very process (same start time) still runs."""
    try:
        pid, created = path.read_text().split()
        process = psutil.Process(int(pid))
        return process.pid if abs(process.create_time() - float(created)) < 0.01 else None
    except (OSError, ValueError, psutil.Error):
        return None
