"""Launchers: start and stop the workers of a session (local processes; docker swarm in a later issue)."""

from labswarm.deploy.base import Launcher
from labswarm.deploy.local import LocalLauncher

__all__ = ["Launcher", "LocalLauncher"]
