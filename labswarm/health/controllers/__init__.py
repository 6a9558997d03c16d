"""Publish-rate controllers, registered by name (``pi`` is the default, ``aimd`` the alternative)."""

from labswarm.health.controllers import aimd, pi  # noqa: F401  (registers)
from labswarm.health.controllers.base import (
    CONTROLLERS,
    Controller,
    ControllerConfig,
    Observation,
    make_controller,
    register_controller,
)

__all__ = ["CONTROLLERS", "Controller", "ControllerConfig", "Observation", "make_controller", "register_controller"]
