"""The launcher interface: how a session gets its workers."""

from __future__ import annotations

from abc import ABC, abstractmethod


class Launcher(ABC):
    """Starts, scales and stops the workers of one experiment.

    Implementations: :class:`~labswarm.deploy.local.LocalLauncher` (processes on this machine) and
    :class:`~labswarm.deploy.swarm.SwarmLauncher` (a docker swarm service per experiment session).
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
