"""The networks (torch modules) behind the registered models."""

from __future__ import annotations

import torch
from torch import nn


class MelCNN(nn.Module):
    """A small CNN on a (log-)mel spectrogram.

    An input BatchNorm standardizes the dB values; then blocks of 3×3 convolution, BatchNorm and ReLU (the
    first with stride 2, the middle ones followed by 2×2 max pooling); adaptive average pooling to ``bands``
    frequency bands × 1 (averaging over time makes any number of frames valid, while the bands keep where in
    frequency a pattern lies: a low tone and a high tone look alike to a fully global pooling); dropout; a
    linear classifier. The shape follows the small VGG-like audio taggers of
    Choi et al., "Automatic tagging using deep convolutional neural networks" (ISMIR 2016), scaled down.

    Args:
        n_classes: output classes.
        channels: output channels of each convolution block.
        dropout: dropout probability before the classifier.
        bands: frequency bands kept by the final pooling.

    Input: float32 ``(batch, n_mels, frames)``. Output: logits ``(batch, n_classes)``.
    """

    def __init__(self, n_classes: int, channels: list[int], dropout: float, bands: int = 4) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.BatchNorm2d(1)]
        previous = 1
        for i, width in enumerate(channels):
            layers += [nn.Conv2d(previous, width, 3, stride=2 if i == 0 else 1, padding=1), nn.BatchNorm2d(width),
                       nn.ReLU()]
            if 0 < i < len(channels) - 1:
                layers.append(nn.MaxPool2d(2))
            previous = width
        layers.append(nn.AdaptiveAvgPool2d((bands, 1)))
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(dropout), nn.Linear(previous * bands, n_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x.unsqueeze(1)))


class StatsMLP(nn.Module):
    """An MLP on per-coefficient statistics over time (mean and standard deviation of each MFCC), the classic
    "bag of frames" audio classifier (Aucouturier & Pachet 2004).

    Args:
        n_bins: coefficients per frame (e.g. ``n_mfcc``).
        n_classes: output classes.
        hidden: widths of the hidden layers.
        dropout: dropout probability after each hidden layer.

    Input: float32 ``(batch, n_bins, frames)``. Output: logits ``(batch, n_classes)``.
    """

    def __init__(self, n_bins: int, n_classes: int, hidden: list[int], dropout: float) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.BatchNorm1d(2 * n_bins)]
        previous = 2 * n_bins
        for width in hidden:
            layers += [nn.Linear(previous, width), nn.ReLU(), nn.Dropout(dropout)]
            previous = width
        layers.append(nn.Linear(previous, n_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        stats = torch.cat([x.mean(dim=2), x.std(dim=2)], dim=1)
        return self.net(stats)
