"""Launchers: start and stop the processes labswarm runs, a session's workers and a job's learners (local
processes, or docker swarm services), each platform registered by name in :data:`labswarm.registry.LAUNCHERS`."""

from labswarm.deploy.base import Launcher, Platform
from labswarm.deploy.local import LocalLauncher
from labswarm.deploy.swarm import ServiceSpec, SwarmLauncher, service_name, service_spec

__all__ = ["Launcher", "LocalLauncher", "Platform", "ServiceSpec", "SwarmLauncher", "service_name", "service_spec"]
