"""Trainer hooks: every step and epoch seen, a stop between steps checkpoints mid-epoch, and a resume from that
checkpoint trains the very model an uninterrupted run trains."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from three_classes import training_experiment

from labswarm.config.experiment import parse_experiment
from labswarm.train import checkpoint
from labswarm.train.trainer import Trainer, TrainerHooks, load_model


class Recorder(TrainerHooks):
    """Records what the trainer calls; stops after ``stop_at`` = (epoch from 0, step) when given."""

    def __init__(self, stop_at: tuple[int, int] | None = None) -> None:
        self.stop_at = stop_at
        self.calls: list[tuple[Any, ...]] = []
        self.last: tuple[int, int] | None = None

    def before_fit(self, trainer: Trainer, start_epoch: int) -> None:
        self.calls.append(("fit", start_epoch))

    def after_step(self, trainer: Trainer, epoch: int, step: int, loss: float) -> None:
        assert loss > 0
        self.last = (epoch, step)
        self.calls.append(("step", epoch, step))

    def should_stop(self, trainer: Trainer) -> bool:
        return self.last == self.stop_at

    def after_checkpoint(self, trainer: Trainer, path: Path, epochs_done: int, step: int | None) -> None:
        assert path == trainer.checkpoint_path and path.is_file()
        self.calls.append(("checkpoint", epochs_done, step))

    def after_epoch(self, trainer: Trainer, record: dict[str, Any]) -> None:
        self.calls.append(("epoch", record["epoch"]))


def _config(three_classes: Path, tmp_path: Path):
    return parse_experiment(training_experiment(three_classes, tmp_path / "store",
                                                training={"epochs": 2, "validation": 0.25, "threads": 1}))


def test_hooks_see_every_step_checkpoint_and_epoch_in_order(three_classes: Path, tmp_path: Path) -> None:
    hooks = Recorder()
    Trainer(_config(three_classes, tmp_path), tmp_path / "home", hooks=[hooks]).fit()
    steps = [c for c in hooks.calls if c[0] == "step"]
    per_epoch = len(steps) // 2
    assert per_epoch >= 3 and steps == [("step", e, s) for e in (0, 1) for s in range(1, per_epoch + 1)]
    assert [c for c in hooks.calls if c[0] != "step"] == [
        ("fit", 0), ("checkpoint", 1, None), ("epoch", 1), ("checkpoint", 2, None), ("epoch", 2)]


def test_a_stop_checkpoints_mid_epoch_and_the_resume_trains_the_same_model(three_classes: Path,
                                                                          tmp_path: Path) -> None:
    config = _config(three_classes, tmp_path)
    whole = Trainer(config, tmp_path / "whole").fit()

    stopper = Recorder(stop_at=(1, 2))
    trainer = Trainer(config, tmp_path / "home", hooks=[stopper])
    stopped = trainer.fit()
    assert stopped.stopped and [r["epoch"] for r in stopped.metrics] == [1]
    assert not trainer.model_path.exists()
    assert stopper.calls[-1] == ("checkpoint", 1, 2)
    state = checkpoint.load(trainer.checkpoint_path)
    assert state["epoch"] == 1 and state["partial"]["steps"] == 2

    resumer = Recorder()
    result = Trainer(config, tmp_path / "home", hooks=[resumer]).fit(resume=True)
    assert not result.stopped and result.resumed_from == 1
    assert resumer.calls[0] == ("fit", 1) and resumer.calls[1] == ("step", 1, 3)  # it goes on counting
    assert [r["epoch"] for r in checkpoint.read_metrics(trainer.metrics_path)] == [1, 2]
    # the same batches in the same order with the same random state: the same weights and the same epoch sums
    assert result.final["samples"] == whole.final["samples"]
    assert result.final["train_loss"] == whole.final["train_loss"]
    resumed, reference = load_model(result.model_path)[0].state_dict(), load_model(whole.model_path)[0].state_dict()
    assert all(torch.equal(resumed[k], reference[k]) for k in reference)
