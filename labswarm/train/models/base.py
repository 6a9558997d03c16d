"""Model base class and registry. Configs are torch-free (an experiment validates without torch installed);
:meth:`Model.build` imports torch."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from pydantic import Field

from labswarm.plugin import PluginConfig, build_plugin
from labswarm.registry import MODELS

if TYPE_CHECKING:
    import torch

#: How to install what training needs.
TORCH_HINT = "training needs PyTorch: pip install 'labswarm[train]' (torch==2.13.0)"


class ModelConfig(PluginConfig):
    """Base config of a model.

    Attributes:
        input: the feature output name the model reads (``mel``, ``mfcc``, ...), one of the experiment's.
        dropout: dropout probability before the classifier layer.
    """

    input: str
    dropout: float = Field(0.3, ge=0.0, lt=1.0)


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
