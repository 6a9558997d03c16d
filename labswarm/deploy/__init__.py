"""Launchers: start and stop the workers of a session (local processes, or a docker swarm service)."""

from labswarm.deploy.base import Launcher
from labswarm.deploy.local import LocalLauncher
from labswarm.deploy.swarm import ServiceSpec, SwarmLauncher, service_name, service_spec

__all__ = ["Launcher", "LocalLauncher", "ServiceSpec", "SwarmLauncher", "service_name", "service_spec"]
