"""Training frameworks, registered by name. Importing this package registers the built-ins."""

from labswarm.learners.frameworks.allreduce import AllReduce, AllReduceConfig
from labswarm.learners.frameworks.base import FRAMEWORKS, CommStats, Framework, FrameworkConfig, register_framework
from labswarm.learners.frameworks.model_averaging import ModelAveraging, ModelAveragingConfig

__all__ = [
    "FRAMEWORKS",
    "AllReduce",
    "AllReduceConfig",
    "CommStats",
    "Framework",
    "FrameworkConfig",
    "ModelAveraging",
    "ModelAveragingConfig",
    "register_framework",
]
