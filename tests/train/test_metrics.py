"""Classification metrics against values worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from labswarm.train.metrics import accuracy, confusion, f1_per_class


def test_confusion_rows_are_true_classes() -> None:
    matrix = confusion(np.array([0, 0, 1, 2, 2, 2]), np.array([0, 1, 1, 2, 0, 2]), 3)
    assert matrix.tolist() == [[1, 1, 0], [0, 1, 0], [1, 0, 2]]
    assert accuracy(matrix) == pytest.approx(4 / 6)


def test_f1_per_class() -> None:
    matrix = confusion(np.array([0, 0, 1, 2, 2, 2]), np.array([0, 1, 1, 2, 0, 2]), 3)
    f1 = f1_per_class(matrix, ["a", "b", "c"])
    # a: precision 1/2, recall 1/2; b: precision 1/2, recall 1; c: precision 1, recall 2/3
    assert f1 == pytest.approx({"a": 0.5, "b": 2 / 3, "c": 0.8})


def test_absent_class_scores_zero_and_empty_accuracy_is_nan() -> None:
    matrix = confusion(np.array([0, 0]), np.array([0, 0]), 2)
    assert f1_per_class(matrix, ["a", "b"]) == {"a": 1.0, "b": 0.0}
    assert math.isnan(accuracy(np.zeros((2, 2), dtype=np.int64)))


def test_bad_input_is_rejected() -> None:
    with pytest.raises(ValueError, match="labels but"):
        confusion(np.array([0, 1]), np.array([0]), 2)
    with pytest.raises(ValueError, match="outside"):
        confusion(np.array([0, 2]), np.array([0, 1]), 2)
