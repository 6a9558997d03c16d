"""Model base class and registry. Configs are torch-free (an experiment validates without torch installed);
:meth:`Model.build` imports torch."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import numpy as np

from labswarm.audio.features.base import FeatureExtractor
from labswarm.config.experiment import ExperimentConfig
from labswarm.plugin import PluginConfig, build_plugin
from labswarm.registry import MODELS

if TYPE_CHECKING:
    import torch

#: How to install what training needs.
TORCH_HINT = "training needs PyTorch: pip install 'labswarm[train]' (torch==2.13.0)"


class ModelConfig(PluginConfig):
    """Base config of a model: a model's own parameters are the fields of its subclass (unknown keys are
    rejected, each error naming its field).

    Attributes:
        input: the feature output name the model reads (``mel``, ``mfcc``, ...), one of the experiment's.
    """

    input: str


C = TypeVar("C", bound=ModelConfig)


class Model(ABC, Generic[C]):
    """Builds a ``torch.nn.Module`` classifier from its config.

    Class attributes:
        name: the registry name used in YAML.
        config_model: the pydantic model of the parameters.
    """

    name: ClassVar[str]
    config_model: ClassVar[type[ModelConfig]] = ModelConfig

    def __init__(self, config: C) -> None:
        self.config: C = config

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | ModelConfig) -> Model[Any]:
        """The registered model a spec names.

        Raises:
            ConfigError: unknown name or invalid parameters.
        """
        return build_plugin(MODELS, spec)

    @abstractmethod
    def build(self, n_bins: int, n_classes: int) -> torch.nn.Module:
        """The network: input float32 ``(batch, n_bins, frames)`` (any ``frames``), output logits
        ``(batch, n_classes)``.

        Raises:
            ImportError: torch is not installed (with :data:`TORCH_HINT`).
        """


def import_torch() -> Any:
    """``torch``, or an ImportError that says how to install it."""
    try:
        import torch
    except ImportError as exc:
        raise ImportError(TORCH_HINT) from exc
    return torch


register_model = MODELS.decorator()


def feature_bins(experiment: ExperimentConfig, output: str) -> int:
    """Rows (bins or coefficients) of a feature's ``(n_bins, frames)`` array: from its parameters where they fix
    them (:meth:`~labswarm.audio.features.base.FeatureExtractor.bins`: ``mel``, ``mfcc``; no audio library is
    loaded then, ~1 s of a learner's start), else computed from one second of noise.

    Raises:
        FeatureError: the feature's parameters do not fit the dataset's sample rate.
    """
    spec = next(f for f in experiment.features if f.output_name == output)
    sr = experiment.dataset.sample_rate
    known = FeatureExtractor.from_spec(spec).bins(sr)
    if known is not None:
        return known
    y = (0.1 * np.random.default_rng(0).standard_normal(sr)).astype(np.float32)
    return int(FeatureExtractor.from_spec(spec)(y, sr).shape[0])
