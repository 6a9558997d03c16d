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


def f1_per_class(matrix: np.ndarray, classes: Sequence[str]) -> dict[str, float | None]:
    """F1 = 2·precision·recall / (precision + recall) = 2·TP / (predicted + actual) per class (van Rijsbergen
    1979); ``None`` for a class neither present nor predicted (undefined: e.g. a class whose only source recording
    stayed in training), 0 for one present or predicted but never right."""
    out: dict[str, float | None] = {}
    for i, name in enumerate(classes):
        tp = float(matrix[i, i])
        predicted, actual = float(matrix[:, i].sum()), float(matrix[i, :].sum())
        out[name] = 2 * tp / (predicted + actual) if predicted + actual else None
    return out


def macro_f1(f1: dict[str, float | None]) -> float:
    """Mean F1 over the classes where it is defined (NaN when none is), as scikit-learn's
    ``f1_score(average="macro")`` over the labels present."""
    defined = [v for v in f1.values() if v is not None]
    return float(np.mean(defined)) if defined else float("nan")
