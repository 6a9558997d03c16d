"""The launchers a manager session can ask for by name (``POST /experiments/{name}/sessions`` ``launcher``):
``local`` (supervised worker processes on the manager's machine), ``swarm`` (a docker swarm service), or
``none`` (workers run by someone else)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from labswarm.deploy.base import Launcher
from labswarm.deploy.local import LocalLauncher
from labswarm.deploy.swarm import SwarmLauncher, service_spec
from labswarm.deploy.swarm_secrets import secret_values
from labswarm.errors import ConfigError

if TYPE_CHECKING:
    from labswarm.settings import Settings


def _swarm(experiment: str, session_id: str, settings: Settings) -> Launcher:
    return SwarmLauncher(service_spec(experiment, session_id, settings), secrets=secret_values(settings))


def _local(experiment: str, session_id: str, settings: Settings) -> Launcher:
    # the manager's URL, the pool size and the log folder come from the serving process (Launcher.bind)
    return LocalLauncher(experiment, None, broker_url=settings.resolved_broker_url(), token=settings.api_token,
                         log_dir=settings.home / "logs", log_name=f"worker-{session_id}")


#: name -> factory(experiment, session id, settings) of the launcher of one session's workers; the manager then
#: binds it to the process serving it (:meth:`~labswarm.deploy.base.Launcher.bind`) before starting it.
SESSION_LAUNCHERS: dict[str, Callable[[str, str, Settings], Launcher]] = {"local": _local, "swarm": _swarm}
#: The launcher name of a session whose workers someone else runs.
NONE = "none"


def session_launcher(name: str, experiment: str, session_id: str, settings: Settings) -> Launcher | None:
    """The launcher ``name`` for one session of ``experiment`` (``None`` for ``none``); nothing is started yet.

    Raises:
        ConfigError: unknown name (the message lists the known ones), or invalid ``swarm_*`` settings.
    """
    if name == NONE:
        return None
    factory = SESSION_LAUNCHERS.get(name)
    if factory is None:
        known = ", ".join([NONE, *sorted(SESSION_LAUNCHERS)])
        raise ConfigError([("launcher", f"unknown launcher {name!r}; known: {known}")])
    try:
        return factory(experiment, session_id, settings)
    except ValueError as exc:
        raise ConfigError([("launcher", str(exc))]) from exc
