"""Early stopping and plateaus (issue 25, item 3) on a scripted sequence of the watched metric."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from three_classes import training_experiment

from labswarm.config.experiment import parse_experiment
from labswarm.train import checkpoint
from labswarm.train.trainer import Trainer


def _scripted(monkeypatch: pytest.MonkeyPatch, losses: list[float]) -> list[dict[str, Any]]:
    """Make the trainer's validation answer ``losses`` in turn; returns the weights it was given, one per epoch."""
    weights: list[dict[str, Any]] = []

    def validate(self: Trainer, torch_: Any, model: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        weights.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        return {"val_samples": 1, "val_loss": losses[len(weights) - 1], "val_accuracy": 0.5}

    monkeypatch.setattr(Trainer, "_validate", validate)
    return weights


def _trainer(three_classes: Path, tmp_path: Path, epochs: int, **training: Any) -> Trainer:
    config = parse_experiment(training_experiment(three_classes, tmp_path / "store", training={
        "epochs": epochs, "learning_rate": 0.01, "validation": 0.25, "threads": 1, **training}))
    return Trainer(config, tmp_path / "home")


def test_early_stopping_stops_at_the_right_epoch_and_keeps_the_best_model(
        three_classes: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # best at epoch 2; 3 (0.5 - 0.45 = 0.05 is not past min_delta 0.1) and 4 do not improve: patience 2 ends it
    weights = _scripted(monkeypatch, [1.0, 0.5, 0.45, 0.9, 0.1, 0.1, 0.1, 0.1])
    trainer = _trainer(three_classes, tmp_path, 8,
                       early_stopping={"metric": "val_loss", "mode": "min", "patience": 2, "min_delta": 0.1})
    result = trainer.fit()
    assert [r["epoch"] for r in result.metrics] == [1, 2, 3, 4] and not result.stopped
    assert [r["best_epoch"] for r in result.metrics] == [1, 2, 2, 2]
    last = result.metrics[-1]
    assert last["early_stop"] is True and last["plateau"] == {
        "metric": "val_loss", "mode": "min", "best": 0.5, "best_epoch": 2, "epochs_without_improvement": 2,
        "early_stop": True}
    assert all("plateau" not in r for r in result.metrics[:-1])
    saved = checkpoint.load(result.model_path)
    assert saved["metrics"]["epoch"] == 2
    assert saved["state_dict"].keys() == weights[1].keys()
    assert all(torch.equal(saved["state_dict"][k], weights[1][k]) for k in weights[1])  # epoch 2's weights
    assert not all(torch.equal(saved["state_dict"][k], weights[3][k]) for k in weights[3])  # not the last ones
    again = trainer.fit(resume=True)  # a resumed run of a stopped training trains no more
    assert len(again.metrics) == 4 and len(weights) == 4


def test_a_plateau_is_recorded_without_early_stopping_and_training_goes_on(
        three_classes: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _scripted(monkeypatch, [0.5, 0.6, 0.7, 0.8, 0.4, 0.9])  # the default watch: val_loss, patience 3
    result = _trainer(three_classes, tmp_path, 6).fit()
    assert [r["epoch"] for r in result.metrics] == [1, 2, 3, 4, 5, 6]
    assert [bool(r.get("plateau")) for r in result.metrics] == [False, False, False, True, False, False]
    assert result.metrics[3]["plateau"]["best_epoch"] == 1 and result.metrics[3]["plateau"]["early_stop"] is False
    assert [r["best_epoch"] for r in result.metrics] == [1, 1, 1, 1, 5, 5]


def test_max_mode_watches_an_accuracy(three_classes: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _scripted(monkeypatch, [1.0] * 5)  # val_accuracy is always 0.5: no improvement after epoch 1
    result = _trainer(three_classes, tmp_path, 5,
                      early_stopping={"metric": "val_accuracy", "mode": "max", "patience": 1}).fit()
    assert [r["epoch"] for r in result.metrics] == [1, 2] and result.metrics[-1]["early_stop"] is True
