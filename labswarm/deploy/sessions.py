"""The launchers a manager session can ask for by name (``POST /experiments/{name}/sessions`` ``launcher``): a
platform of :data:`~labswarm.registry.LAUNCHERS` (``local``: supervised worker processes on the manager's machine;
``swarm``: a docker swarm service; see :mod:`labswarm.deploy.platforms`), or ``none`` (workers run by someone
else)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from labswarm.deploy.base import Launcher
from labswarm.errors import ConfigError
from labswarm.registry import LAUNCHERS

if TYPE_CHECKING:
    from labswarm.settings import Settings

#: The launcher name of a session whose workers someone else runs.
NONE = "none"


def session_launcher(name: str, experiment: str, session_id: str, settings: Settings) -> Launcher | None:
    """The launcher ``name`` for one session of ``experiment`` (``None`` for ``none``); nothing is started yet.
    The manager then binds it to the process serving it (:meth:`~labswarm.deploy.base.Launcher.bind`) before
    starting it.

    Raises:
        ConfigError: unknown name (the message lists the known ones), or invalid ``swarm_*`` settings.
    """
    if name == NONE:
        return None
    if name not in LAUNCHERS:
        known = ", ".join([NONE, *LAUNCHERS.names()])
        raise ConfigError([("launcher", f"unknown launcher {name!r}; known: {known}")])
    try:
        return LAUNCHERS.get(name).workers(experiment, session_id, settings)
    except ValueError as exc:
        raise ConfigError([("launcher", str(exc))]) from exc
