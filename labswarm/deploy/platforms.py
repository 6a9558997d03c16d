"""The built-in platforms of the launcher family, registered in :data:`~labswarm.registry.LAUNCHERS` (the
registry imports this module on its first look-up):

- ``local``: a session's workers are supervised processes on the manager's machine
  (:class:`~labswarm.deploy.local.LocalLauncher`), a job's learners local processes
  (:class:`~labswarm.deploy.local_learners.LocalLearners`);
- ``swarm``: a docker swarm service per session (:class:`~labswarm.deploy.swarm.SwarmLauncher`) and per learner
  (:class:`~labswarm.deploy.swarm_learners.SwarmLearners`, with its parameter-server shards).

The docker SDK itself is imported on first use (:func:`~labswarm.deploy.swarm_spec.docker_sdk`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from labswarm.deploy.base import Launcher, Platform, register_launcher
from labswarm.deploy.learners import LearnerLauncher
from labswarm.deploy.local import LocalLauncher
from labswarm.deploy.local_learners import LocalLearners
from labswarm.deploy.swarm import SwarmLauncher, service_spec
from labswarm.deploy.swarm_learners import SwarmLearners
from labswarm.deploy.swarm_secrets import secret_values

if TYPE_CHECKING:
    from labswarm.settings import Settings


@register_launcher
class LocalPlatform(Platform):
    """Processes on the manager's machine: supervised workers, learners in process groups of their own."""

    name = "local"

    @classmethod
    def workers(cls, experiment: str, session_id: str, settings: Settings) -> Launcher:
        """:class:`~labswarm.deploy.local.LocalLauncher`; the manager's URL, the pool size and the log folder come
        from the serving process (:meth:`~labswarm.deploy.base.Launcher.bind`)."""
        return LocalLauncher(experiment, None, broker_url=settings.resolved_broker_url(), token=settings.api_token,
                             log_dir=settings.home / "logs", log_name=f"worker-{session_id}")

    @classmethod
    def learners(cls, settings: Settings) -> LearnerLauncher:
        """:class:`~labswarm.deploy.local_learners.LocalLearners`."""
        return LocalLearners(cgroups=settings.learner_cgroups, warm=settings.learner_warm_start)


@register_launcher
class SwarmPlatform(Platform):
    """A docker swarm: a service per session's workers, per learner and per parameter-server shard."""

    name = "swarm"

    @classmethod
    def workers(cls, experiment: str, session_id: str, settings: Settings) -> Launcher:
        """:class:`~labswarm.deploy.swarm.SwarmLauncher` of the session's service, with the workers' secrets.

        Raises:
            ValueError: invalid ``swarm_*`` settings.
        """
        return SwarmLauncher(service_spec(experiment, session_id, settings), secrets=secret_values(settings))

    @classmethod
    def learners(cls, settings: Settings) -> LearnerLauncher:
        """:class:`~labswarm.deploy.swarm_learners.SwarmLearners`."""
        return SwarmLearners(settings)
