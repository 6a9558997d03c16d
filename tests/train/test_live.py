"""Live changes inside the trainer (labswarm/train/live.py): a new learning rate becomes the schedule's base from
the epoch it lands in, and a new patience moves the early stop; real torch optimizers and schedules."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from labswarm.config.training import TrainingConfig
from labswarm.train.live import set_learning_rate, set_patience
from labswarm.train.optim import EpochSchedule, build_optimizer, lr_factor
from labswarm.train.watch import Watch


def _optimizer(schedule: object, epochs: int = 6) -> tuple[torch.optim.Optimizer, EpochSchedule, TrainingConfig]:
    training = TrainingConfig.model_validate({"epochs": epochs, "learning_rate": 0.01, "schedule": schedule})
    optimizer = build_optimizer(torch, [torch.nn.Parameter(torch.zeros(3))], training)
    return optimizer, EpochSchedule(torch, optimizer, training), training


def _end_epoch(optimizer: torch.optim.Optimizer, schedule: EpochSchedule, record: dict) -> None:
    optimizer.step()  # an epoch's steps (no gradients: nothing moves), then the schedule's step, as the trainer does
    schedule.step(record)


def test_a_constant_schedule_runs_at_the_new_rate_from_then_on() -> None:
    optimizer, schedule, _ = _optimizer("constant")
    _end_epoch(optimizer, schedule, {})
    assert set_learning_rate(optimizer, schedule, 0.003) == pytest.approx(0.003)
    for _ in range(3):
        _end_epoch(optimizer, schedule, {})
        assert optimizer.param_groups[0]["lr"] == pytest.approx(0.003)
    state = schedule.state_dict()  # the checkpoint keeps it
    fresh, again, _ = _optimizer("constant")
    again.load_state_dict(state)
    _end_epoch(fresh, again, {})
    assert fresh.param_groups[0]["lr"] == pytest.approx(0.003)


def test_a_cosine_schedule_goes_on_from_the_new_base_and_plateau_reductions_from_the_new_rate() -> None:
    optimizer, schedule, training = _optimizer("cosine")
    _end_epoch(optimizer, schedule, {})
    _end_epoch(optimizer, schedule, {})  # epoch 2 (from 0) starts
    set_learning_rate(optimizer, schedule, 0.1)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * lr_factor(training.schedule, 2, 6, 0.01))
    _end_epoch(optimizer, schedule, {})
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * lr_factor(training.schedule, 3, 6, 0.01))

    optimizer, schedule, _ = _optimizer({"name": "reduce_on_plateau", "metric": "train_loss", "patience": 1,
                                         "factor": 0.5})
    set_learning_rate(optimizer, schedule, 0.2)
    for loss in (1.0, 1.0, 1.0):
        _end_epoch(optimizer, schedule, {"train_loss": loss})
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1)  # halved once from the new rate
    with pytest.raises(ValueError, match="learning_rate"):
        set_learning_rate(optimizer, schedule, 0.0)


def test_a_smaller_patience_stops_at_the_next_epoch_without_improvement(tmp_path: Path) -> None:
    training = TrainingConfig.model_validate({"epochs": 10, "early_stopping": {"metric": "train_loss",
                                                                              "patience": 5}})
    watch = Watch(training, tmp_path)
    model = torch.nn.Linear(2, 2)
    for epoch, loss in enumerate((1.0, 0.5, 0.6, 0.7, 0.8), start=1):
        watch.update({"epoch": epoch, "train_loss": loss}, model)
    assert watch.since == 3 and not watch.stopped
    set_patience(watch, 2)  # already past it: the next epoch without improvement stops
    record = {"epoch": 6, "train_loss": 0.9}
    watch.update(record, model)
    assert watch.stopped and record["early_stop"] and watch.best_epoch == 2
