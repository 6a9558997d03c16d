"""The launcher interface: how a session gets its workers."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar


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
    """

    manager_url: str | None = None
    concurrency: int = 1
    log_dir: Path | None = None


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
