"""Classification metrics against values worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from labswarm.train.metrics import accuracy, confusion, f1_per_class, macro_f1


def test_confusion_rows_are_true_classes() -> None:
    matrix = confusion(np.array([0, 0, 1, 2, 2, 2]), np.array([0, 1, 1, 2, 0, 2]), 3)
    assert matrix.tolist() == [[1, 1, 0], [0, 1, 0], [1, 0, 2]]
    assert accuracy(matrix) == pytest.approx(4 / 6)


def test_f1_per_class() -> None:
    matrix = confusion(np.array([0, 0, 1, 2, 2, 2]), np.array([0, 1, 1, 2, 0, 2]), 3)
    f1 = f1_per_class(matrix, ["a", "b", "c"])
    # a: precision 1/2, recall 1/2; b: precision 1/2, recall 1; c: precision 1, recall 2/3
    assert f1 == pytest.approx({"a": 0.5, "b": 2 / 3, "c": 0.8})


def test_an_absent_class_has_no_f1_and_stays_out_of_the_macro_average() -> None:
    matrix = confusion(np.array([0, 0, 1]), np.array([0, 1, 1]), 3)
    f1 = f1_per_class(matrix, ["a", "b", "c"])
    assert f1 == pytest.approx({"a": 2 / 3, "b": 2 / 3, "c": None})
    assert macro_f1(f1) == pytest.approx(2 / 3)
    wrong = f1_per_class(confusion(np.array([0]), np.array([1]), 2), ["a", "b"])
    assert wrong == {"a": 0.0, "b": 0.0}  # present or predicted but never right: 0, and it counts
    assert math.isnan(accuracy(np.zeros((2, 2), dtype=np.int64)))
    assert math.isnan(macro_f1({"a": None}))


def test_bad_input_is_rejected() -> None:
    with pytest.raises(ValueError, match="labels but"):
        confusion(np.array([0, 1]), np.array([0]), 2)
    with pytest.raises(ValueError, match="outside"):
        confusion(np.array([0, 2]), np.array([0, 1]), 2)
