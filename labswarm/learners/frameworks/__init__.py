"""Training frameworks, registered by name. Importing this package registers the built-ins."""

from labswarm.learners.frameworks.allreduce import AllReduce, AllReduceConfig
from labswarm.learners.frameworks.base import FRAMEWORKS, CommStats, Framework, FrameworkConfig, register_framework
from labswarm.learners.frameworks.downpour import Downpour, DownpourConfig
from labswarm.learners.frameworks.easgd import EASGD, EASGDConfig
from labswarm.learners.frameworks.model_averaging import ModelAveraging, ModelAveragingConfig
from labswarm.learners.frameworks.sandblaster import Sandblaster

__all__ = [
    "EASGD",
    "FRAMEWORKS",
    "AllReduce",
    "AllReduceConfig",
    "CommStats",
    "Downpour",
    "DownpourConfig",
    "EASGDConfig",
    "Framework",
    "FrameworkConfig",
    "ModelAveraging",
    "ModelAveragingConfig",
    "Sandblaster",
    "register_framework",
]
