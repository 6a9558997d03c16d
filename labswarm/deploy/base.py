"""The launcher family's interfaces: how a session gets its workers (:class:`Launcher`), and the platforms that
give every kind of launcher (:class:`Platform`, registered by name in :data:`~labswarm.registry.LAUNCHERS`); a
job's learners have theirs in :mod:`labswarm.deploy.learners`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from labswarm.registry import LAUNCHERS

if TYPE_CHECKING:
    from labswarm.deploy.learners import LearnerLauncher
    from labswarm.deploy.standby import StandbyWorkers
    from labswarm.settings import Settings


@dataclass(frozen=True)
class Host:
    """What the process serving the manager knows about itself, for launchers that run workers on its machine.

    The serving process sets it before it serves (:class:`~labswarm.manager.server.EmbeddedServer`,
    ``labswarm manager``); the manager hands it to each session's launcher (:meth:`Launcher.bind`).

    Attributes:
        manager_url: the manager's URL as processes on this machine reach it (``http://127.0.0.1:PORT``);
            ``None`` while it is not served.
        concurrency: pool processes per local worker (``labswarm run --concurrency``); 1 by default.
        log_dir: folder of the local workers' logs; ``None``: ``<home>/logs`` (``LABSWARM_HOME``).
        standby: the local workers' warm parent, started ahead of the session (``labswarm run``: while its manager
            starts), which forks the local launcher's workers while it runs (:mod:`labswarm.deploy.standby`).
    """

    manager_url: str | None = None
    concurrency: int = 1
    log_dir: Path | None = None
    standby: StandbyWorkers | None = None


class Launcher(ABC):
    """Starts, scales and stops the workers of one experiment.

    Implementations: :class:`~labswarm.deploy.local.LocalLauncher` (processes on this machine) and
    :class:`~labswarm.deploy.swarm.SwarmLauncher` (a docker swarm service per experiment session).
    """

    #: Whether the workers keep running when the process that started them stops (a swarm service does, and a
    #: restarted manager finds it again; local processes do not: their owner stops them when it stops).
    outlives_owner: ClassVar[bool] = True

    def bind(self, host: Host) -> None:  # noqa: B027 (a hook, empty on purpose)
        """Hook called by the manager before :meth:`start`: what the process serving it knows about itself.

        Nothing by default (a swarm service reaches the manager by its service name).
        """

    @abstractmethod
    def start(self, workers: int) -> None:
        """Start ``workers`` workers."""

    @abstractmethod
    def scale(self, workers: int) -> None:
        """Run ``workers`` workers from now on (start more or stop some)."""

    @abstractmethod
    def stop(self, timeout: float = 30.0) -> None:
        """Stop every worker: a warm shutdown first, a kill after ``timeout`` seconds."""

    @property
    @abstractmethod
    def workers(self) -> int:
        """Workers running now."""


class Platform(ABC):
    """Where labswarm runs processes: one launcher of each kind, a session's workers and a job's learners.

    A platform is registered by its ``name`` in :data:`~labswarm.registry.LAUNCHERS` (:func:`register_launcher`),
    the name a session's ``launcher`` and ``LABSWARM_JOB_LAUNCHER`` give. Built in
    (:mod:`labswarm.deploy.platforms`): ``local`` (processes on the manager's machine) and ``swarm`` (docker swarm
    services); another one is a new module registering its class (or an entry point of ``labswarm.launchers``).
    """

    #: The platform's name (``local``, ``swarm``).
    name: ClassVar[str]

    @classmethod
    @abstractmethod
    def workers(cls, experiment: str, session_id: str, settings: Settings) -> Launcher:
        """The launcher of the workers of one session of ``experiment``; nothing is started yet. The manager then
        binds it to the process serving it (:meth:`Launcher.bind`) before starting it.

        Raises:
            ValueError: invalid settings of the platform (e.g. ``swarm_*``).
        """

    @classmethod
    @abstractmethod
    def learners(cls, settings: Settings) -> LearnerLauncher:
        """The launcher of the learners of every job (:class:`~labswarm.deploy.learners.LearnerLauncher`)."""


#: Registers a :class:`Platform` subclass in :data:`~labswarm.registry.LAUNCHERS` (a class decorator).
register_launcher = LAUNCHERS.decorator()
