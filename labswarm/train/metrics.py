"""Classification metrics (numpy): confusion matrix, accuracy, per-class F1."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def confusion(labels: np.ndarray, predictions: np.ndarray, n_classes: int) -> np.ndarray:
    """int64 matrix ``(n_classes, n_classes)``: row = true class, column = predicted class.

    Raises:
        ValueError: the arrays differ in length or hold a class index outside ``[0, n_classes)``.
    """
    labels, predictions = np.asarray(labels, dtype=np.int64), np.asarray(predictions, dtype=np.int64)
    if labels.shape != predictions.shape:
        raise ValueError(f"{labels.shape[0]} labels but {predictions.shape[0]} predictions")
    if labels.size and (min(labels.min(), predictions.min()) < 0 or max(labels.max(), predictions.max()) >= n_classes):
        raise ValueError(f"class index outside [0, {n_classes})")
    return np.bincount(labels * n_classes + predictions, minlength=n_classes * n_classes).reshape(n_classes, n_classes)


def accuracy(matrix: np.ndarray) -> float:
    """Share of correct predictions (NaN for an empty matrix)."""
    total = matrix.sum()
    return float(np.trace(matrix) / total) if total else float("nan")


def f1_per_class(matrix: np.ndarray, classes: Sequence[str]) -> dict[str, float]:
    """F1 = 2·precision·recall / (precision + recall) = 2·TP / (predicted + actual) per class (van Rijsbergen
    1979); 0 for a class neither predicted nor present, as scikit-learn's ``f1_score(zero_division=0)``."""
    out = {}
    for i, name in enumerate(classes):
        tp = float(matrix[i, i])
        predicted, actual = float(matrix[:, i].sum()), float(matrix[i, :].sum())
        out[name] = 2 * tp / (predicted + actual) if predicted + actual else 0.0
    return out
