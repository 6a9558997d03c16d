"""Distributed learners: training frameworks (a hook on the trainer), the global cursor, the parameter server.

Torch is imported where used: importing this package needs none.
"""

from labswarm.train.distributed.context import LearnerContext
from labswarm.train.distributed.frameworks.base import (
    FRAMEWORKS,
    CommStats,
    Framework,
    FrameworkConfig,
    register_framework,
)
from labswarm.train.distributed.launch import JobCoordinator, ProcessPlan, plan_attempt, restart_scope

__all__ = [
    "FRAMEWORKS",
    "CommStats",
    "Framework",
    "FrameworkConfig",
    "JobCoordinator",
    "LearnerContext",
    "ProcessPlan",
    "plan_attempt",
    "register_framework",
    "restart_scope",
]
