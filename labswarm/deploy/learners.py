"""How learners run: the launcher interface of training jobs (:class:`LearnerLauncher`), what it is handed and
answers, the environment a learner starts with, and :func:`learner_launcher`, which picks the launcher
``LABSWARM_JOB_LAUNCHER`` names from the one registry of launchers (:data:`labswarm.registry.LAUNCHERS`, see
:mod:`labswarm.deploy.platforms`): learners as local processes (:mod:`labswarm.deploy.local_learners`, the embedded
default) or as docker swarm services (:mod:`labswarm.deploy.swarm_learners`).

A launcher never sees the manager's tables: it reads a learner's record through :class:`LearnerRecord`, the few
columns of ``job_learners`` it fills and reads (the jobs service's ``LearnerRow`` has them). This module is also
imported by the learner process itself (:data:`EXIT_FILE`, :data:`PROGRAM_FILE`): it stays light.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from labswarm.registry import LAUNCHERS

if TYPE_CHECKING:
    from labswarm.settings import Settings

#: The file in its working folder a learner writes its exit code to (``{"code": N}``), read by a manager that is
#: not its parent (it restarted).
EXIT_FILE = "exit.json"
#: The file in its working folder a distributed learner records its trained chunks in (appended, one line a chunk:
#: :mod:`labswarm.train.distributed.record`); the manager stores it for a learner that was killed before it could.
CHUNKS_FILE = "chunks.jsonl"
#: What a ``command`` learner writes in its working folder when it starts the user's program, which runs in a
#: process group of its own (a halt's SIGTERM must reach the program's children, not the learner):
#: ``"<pid> <start time>"``, so that killing the learner kills the program too, even once the learner is gone.
PROGRAM_FILE = "program.pid"
#: The environment variable a learner reads its attempt's API token from (:mod:`labswarm.jobs.learner.entry`; the
#: token itself: :mod:`labswarm.jobs.records.credentials`).
TOKEN_ENV = "LABSWARM_API_TOKEN"
#: The prefix of the manager's own settings (:mod:`labswarm.settings`): broker and database URLs, tokens, the
#: files that hold them. None of them reaches a learner: it runs the user's code.
SETTINGS_PREFIX = "LABSWARM_"


def learner_environment(manager_env: Mapping[str, str], token: str) -> dict[str, str]:
    """The environment a learner starts with: the manager's, less every ``LABSWARM_*`` variable (the broker URL
    with its password, the database URL, the API, scrape and RabbitMQ tokens, and the ``*_FILE`` variables that
    name their files), plus the attempt's own token as :data:`TOKEN_ENV`.

    What stays is the machine's (``PATH``, ``HOME``, locale, ``CUDA_*``, thread counts) and the object stores'
    credentials (``AWS_*``: a job's ``s3`` stores read them from the environment, :mod:`labswarm.storage.s3`).
    """
    env = {name: value for name, value in manager_env.items() if not name.startswith(SETTINGS_PREFIX)}
    env[TOKEN_ENV] = token
    return env


class LearnerRecord(Protocol):
    """What a launcher reads of a learner's record: the columns of ``job_learners`` that say which learner it is
    and how to find it again (the handle :meth:`LearnerLauncher.start` returned).

    Attributes:
        job_id: the job.
        attempt: the attempt number, from 1.
        rank: the learner's rank in the attempt.
        workdir: its local working folder (a local learner writes :data:`EXIT_FILE` there).
        pid: a local learner's process id.
        pid_created: its process start time (Unix seconds, psutil's ``create_time``).
        service_id: a swarm learner's service id.
    """

    @property
    def job_id(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def rank(self) -> int: ...
    @property
    def workdir(self) -> str: ...
    @property
    def pid(self) -> int | None: ...
    @property
    def pid_created(self) -> float | None: ...
    @property
    def service_id(self) -> str | None: ...


@dataclass(frozen=True)
class LearnerLaunch:
    """What the lifecycle hands a launcher to start one learner (:meth:`LearnerLauncher.start`).

    Attributes:
        job_id: the job.
        attempt: the attempt number, from 1.
        rank: the learner's rank in the attempt.
        spec: the learner's spec (:class:`~labswarm.jobs.learner.context.LearnerSpec` fields, as JSON data); a launcher
            may change where it runs (``workdir``) and how it reaches the manager (``manager_url``).
        spec_path: where the manager keeps the spec as a file (a local learner reads it; written by the launcher).
        out: the file of the learner's raw output (what it prints outside its own capture), on the manager.
        token: the attempt's own API token (:mod:`labswarm.jobs.records.credentials`).
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
    learner's record (:class:`LearnerRecord`), whose handle columns (``pid``/``pid_created`` or ``service_id``)
    :meth:`start` returned; a launcher keeps nothing that a restarted manager would need.

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
    def poll(self, learner: LearnerRecord) -> LearnerStatus:
        """Whether the learner is alive and, when it ended, how."""

    @abstractmethod
    def terminate(self, learner: LearnerRecord) -> None:
        """Ask the learner to halt (it checkpoints and exits); the manager's answer to its next report asks too."""

    @abstractmethod
    def kill(self, learner: LearnerRecord) -> None:
        """Stop the learner now (watchdog, halt grace over, delete); after it ended, clean up what it left."""

    def output_tail(self, learner: LearnerRecord, lines: int) -> list[str]:
        """The last ``lines`` lines the learner printed outside its own capture (a crash before it started
        capturing), read before :meth:`kill` cleans up; none by default."""
        return []

    def chunk_record(self, learner: LearnerRecord) -> Path:
        """Where the manager finds a distributed learner's chunk record (to store it when the learner could not):
        by default :data:`CHUNKS_FILE` in its working folder."""
        return Path(learner.workdir) / CHUNKS_FILE

    def collect(self, job_id: str) -> None:  # noqa: B027 (a hook, empty on purpose)
        """Hook of a job's end (completed or failed): remove what its learners left outside their working folders
        (a swarm learner's chunk records on the shared volume); nothing by default."""

    def sweep(self, live: set[str], owns: Callable[[str], bool]) -> None:  # noqa: B027 (a hook, empty on purpose)
        """Hook of a manager's first pass: remove what a previous manager started and never recorded.

        Args:
            live: the handles of the learners the database says have not ended: a swarm learner's service id,
                a local learner's cgroup name (:func:`~labswarm.deploy.cgroups.cgroup_name`).
            owns: whether a job id is one of this manager's jobs (what is not is never touched).
        """


def learner_launcher(settings: Settings) -> LearnerLauncher:
    """The launcher of learners of the platform ``settings.job_launcher`` names in
    :data:`~labswarm.registry.LAUNCHERS`: ``local`` (:class:`~labswarm.deploy.local_learners.LocalLearners`) or
    ``swarm`` (:class:`~labswarm.deploy.swarm_learners.SwarmLearners`).

    Raises:
        ConfigError: an unknown name (with the known ones).
    """
    return LAUNCHERS.get(settings.job_launcher, path="job_launcher").learners(settings)
