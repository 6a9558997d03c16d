"""``cnn``: a small convolutional network on a mel spectrogram."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from labswarm.train.models.base import Model, ModelConfig, import_torch, register_model


class CNNConfig(ModelConfig):
    """Parameters of the ``cnn`` model.

    Attributes:
        input: the feature to read; a spectrogram-like ``(n_bins, frames)`` array (default ``mel``).
        channels: output channels of each convolution block (the first block has stride 2).
        bands: frequency bands the last feature maps are averaged into (time is averaged out).
        dropout: dropout probability before the classifier layer.
    """

    input: str = "mel"
    channels: list[int] = Field(default_factory=lambda: [16, 32, 64, 64], min_length=1)
    bands: int = Field(4, ge=1)
    dropout: float = Field(0.3, ge=0.0, lt=1.0)


@register_model
class CNN(Model[CNNConfig]):
    """:class:`~labswarm.train.models.nets.MelCNN` built from :class:`CNNConfig`."""

    name = "cnn"
    config_model = CNNConfig

    def build(self, n_bins: int, n_classes: int) -> Any:
        import_torch()
        from labswarm.train.models.nets import MelCNN

        return MelCNN(n_classes, list(self.config.channels), self.config.dropout, self.config.bands)
