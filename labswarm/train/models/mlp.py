"""``mlp``: a multilayer perceptron on MFCC statistics."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from labswarm.train.models.base import Model, ModelConfig, import_torch, register_model


class MLPConfig(ModelConfig):
    """Parameters of the ``mlp`` model.

    Attributes:
        input: the feature to read, ``(n_bins, frames)`` (default ``mfcc``); the model takes its mean and
            standard deviation over frames.
        hidden: widths of the hidden layers.
        dropout: dropout probability after each hidden layer.
    """

    input: str = "mfcc"
    hidden: list[int] = Field(default_factory=lambda: [128, 64], min_length=1)
    dropout: float = Field(0.3, ge=0.0, lt=1.0)


@register_model
class MLP(Model[MLPConfig]):
    """:class:`~labswarm.train.models.nets.StatsMLP` built from :class:`MLPConfig`."""

    name = "mlp"
    config_model = MLPConfig

    def build(self, n_bins: int, n_classes: int) -> Any:
        import_torch()
        from labswarm.train.models.nets import StatsMLP

        return StatsMLP(n_bins, n_classes, list(self.config.hidden), self.config.dropout)
