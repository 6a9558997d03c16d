"""The network of ``conv_gru`` (imports torch)."""

from __future__ import annotations

import torch
from torch import nn


class ConvGRUNet(nn.Module):
    """A convolutional recurrent classifier of log-mel spectrograms, a small cousin of the CRNNs of
    Choi et al., "Convolutional recurrent neural networks for music classification" (ICASSP 2017).

    Args:
        n_bins: mel bands of the input.
        n_classes: output classes.
        hidden: convolution channels and GRU units.
        kernel: convolution width over time (frames; an even one is made odd).
        dropout: dropout probability before the classifier.

    Input: float32 ``(batch, n_bins, frames)``, dB. Output: logits ``(batch, n_classes)``.
    """

    def __init__(self, n_bins: int, n_classes: int, *, hidden: int = 32, kernel: int = 3,
                 dropout: float = 0.1) -> None:
        super().__init__()
        kernel |= 1
        self.norm = nn.BatchNorm1d(n_bins)  # standardizes each band's dB values
        self.conv = nn.Sequential(nn.Conv1d(n_bins, hidden, kernel, padding=kernel // 2), nn.BatchNorm1d(hidden),
                                  nn.ReLU())
        self.gru = nn.GRU(hidden, hidden, batch_first=True)
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(hidden, n_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        frames = self.conv(self.norm(x))  # (batch, hidden, frames)
        outputs, _ = self.gru(frames.transpose(1, 2))  # (batch, frames, hidden)
        return self.head(outputs.mean(dim=1))
