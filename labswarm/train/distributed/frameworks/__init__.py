"""Training frameworks, registered by name. Importing this package registers the built-ins."""

from labswarm.train.distributed.frameworks.allreduce import AllReduce, AllReduceConfig
from labswarm.train.distributed.frameworks.base import (
    FRAMEWORKS,
    CommStats,
    Framework,
    FrameworkConfig,
    register_framework,
)
from labswarm.train.distributed.frameworks.downpour import Downpour, DownpourConfig
from labswarm.train.distributed.frameworks.easgd import EASGD, EASGDConfig
from labswarm.train.distributed.frameworks.hogwild import DistributedHogwild, HogwildConfig
from labswarm.train.distributed.frameworks.model_averaging import ModelAveraging, ModelAveragingConfig
from labswarm.train.distributed.frameworks.sandblaster import Sandblaster

__all__ = [
    "EASGD",
    "FRAMEWORKS",
    "AllReduce",
    "AllReduceConfig",
    "CommStats",
    "DistributedHogwild",
    "Downpour",
    "DownpourConfig",
    "EASGDConfig",
    "Framework",
    "FrameworkConfig",
    "HogwildConfig",
    "ModelAveraging",
    "ModelAveragingConfig",
    "Sandblaster",
    "register_framework",
]
