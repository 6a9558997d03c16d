"""``conv_gru``: an example labswarm model plugin (a convolutional GRU on a log-mel spectrogram).

The plugin is two classes: a pydantic config (its parameters, validated when an experiment is submitted, without
torch) and a :class:`~labswarm.train.models.base.Model` whose ``build`` returns the ``torch.nn.Module``. The
network lives in :mod:`labswarm_example_net.net`, imported by ``build`` only: a manager that validates an
experiment need not import torch.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from labswarm.train.models.base import Model, ModelConfig, import_torch

__all__ = ["ConvGRU", "ConvGRUConfig"]


class ConvGRUConfig(ModelConfig):
    """Parameters of ``conv_gru``.

    Attributes:
        input: the feature to read, a log-mel spectrogram ``(n_mels, frames)`` (default ``mel``).
        hidden: channels of the convolution and units of the GRU.
        kernel: width of the convolution over time, in frames (odd).
        dropout: dropout probability before the classifier.
    """

    input: str = "mel"
    hidden: int = Field(32, ge=1, le=1024)
    kernel: int = Field(3, ge=1, le=31)
    dropout: float = Field(0.1, ge=0.0, lt=1.0)


class ConvGRU(Model[ConvGRUConfig]):
    """A 1-D convolution over time, a GRU, the mean of its outputs over time, a linear classifier."""

    name = "conv_gru"
    config_model = ConvGRUConfig

    def build(self, n_bins: int, n_classes: int) -> Any:
        import_torch()
        from labswarm_example_net.net import ConvGRUNet

        config = self.config
        return ConvGRUNet(n_bins, n_classes, hidden=config.hidden, kernel=config.kernel, dropout=config.dropout)
