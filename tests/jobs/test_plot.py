"""``labswarm jobs plot``'s figure: loss and accuracy (train and validation) against epoch and wall time."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image
import pytest

from labswarm.errors import LabswarmError
from labswarm.jobs.client.plot import plot_metrics, wall_times


def _records() -> list[dict]:
    # epoch 3 was redone by a second attempt after a 20-s pause; epoch 2 has no validation loss
    return [
        {"epoch": 1, "train_loss": 1.2, "val_loss": 1.0, "train_accuracy": 0.4, "val_accuracy": 0.5,
         "epoch_s": 10.0, "time": "2026-11-24T10:00:10+00:00", "attempt": 1},
        {"epoch": 2, "train_loss": 0.8, "train_accuracy": 0.6, "val_accuracy": 0.65, "epoch_s": 9.0,
         "time": "2026-11-24T10:00:20+00:00", "attempt": 1},
        {"epoch": 3, "train_loss": 0.5, "val_loss": 0.6, "train_accuracy": 0.8, "val_accuracy": 0.78,
         "epoch_s": 9.5, "time": "2026-11-24T10:00:52+00:00", "attempt": 2},
        {"epoch": 4, "note": "no curve's metric: no point"},
    ]


def test_the_figure_has_each_curve_s_points_against_epoch_and_wall_time(tmp_path: Path) -> None:
    drawn = plot_metrics(_records(), tmp_path / "figs" / "job.png", title="job x")
    lines = drawn.lines
    assert lines["loss vs epoch/train"] == [(1.0, 1.2), (2.0, 0.8), (3.0, 0.5)]
    assert lines["loss vs epoch/validation"] == [(1.0, 1.0), (3.0, 0.6)]  # a missing metric is no point
    assert lines["accuracy vs epoch/validation"] == [(1.0, 0.5), (2.0, 0.65), (3.0, 0.78)]
    assert lines["accuracy vs epoch/train"] == [(1.0, 0.4), (2.0, 0.6), (3.0, 0.8)]
    # wall time: seconds since training began (first epoch's end less its duration), the pause included
    assert lines["loss vs wall time/train"] == [(10.0, 1.2), (20.0, 0.8), (52.0, 0.5)]
    assert lines["accuracy vs wall time/validation"] == [(10.0, 0.5), (20.0, 0.65), (52.0, 0.78)]
    assert len(lines) == 8
    image = matplotlib.image.imread(drawn.path)
    assert drawn.path == tmp_path / "figs" / "job.png" and image.shape[:2] == (700, 1100)


def test_records_without_time_have_no_wall_time_points_and_nothing_to_plot_is_an_error(tmp_path: Path) -> None:
    records = [{"epoch": 1, "loss": 0.3, "train_loss": 0.3}, {"epoch": 2, "train_loss": 0.2, "time": "soon"}]
    assert wall_times(records) == [None, None]
    drawn = plot_metrics(records, tmp_path / "a.png")
    assert set(drawn.lines) == {"loss vs epoch/train"}
    with pytest.raises(LabswarmError, match="nothing to plot"):
        plot_metrics([{"epoch": 1, "lines": 3}], tmp_path / "b.png")
