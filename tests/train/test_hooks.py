"""Trainer hooks: every step and epoch seen, a stop between steps checkpoints mid-epoch, and a resume from that
checkpoint trains the very model an uninterrupted run trains; the loop hooks (the distributed mode's shape) are
called once per run, epoch and validation, and their state rides in the checkpoint."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from three_classes import training_experiment

from labswarm.config.experiment import parse_experiment
from labswarm.train import checkpoint
from labswarm.train.loop import EpochSteps, LoopHooks
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


class CountingLoop(LoopHooks):
    """The single-process loop hooks, recording the trainer's calls and keeping a state in its checkpoints."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, ...]] = []
        self.restored: dict[str, Any] | None = None

    def attach(self, torch: Any, model: Any, optimizer: Any, train: Any, output: str, run_dir: Path) -> Any:
        self.calls.append(("attach", output, run_dir.name))
        return super().attach(torch, model, optimizer, train, output, run_dir)

    @contextmanager
    def epoch(self, torch: Any, epoch: int, device: Any,
              partial: Mapping[str, Any] | None = None) -> Iterator[EpochSteps]:
        with super().epoch(torch, epoch, device, partial) as steps:
            self.calls.append(("epoch", epoch))
            yield steps

    def validation_start(self, torch: Any, model: Any) -> None:
        self.calls.append(("validate",))

    def state_dict(self) -> dict[str, Any]:
        return {"epochs": sum(c[0] == "epoch" for c in self.calls)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.restored = dict(state)

    def finish(self) -> None:
        self.calls.append(("finish",))


def test_loop_hooks_are_called_per_run_epoch_and_validation_and_their_state_is_checkpointed(
        three_classes: Path, tmp_path: Path) -> None:
    config = _config(three_classes, tmp_path)
    loop = CountingLoop()
    trainer = Trainer(config, tmp_path / "home", distributed=loop)
    result = trainer.fit()
    assert trainer.distributed is loop and result.model_path.is_file()
    assert loop.calls == [("attach", "mel", trainer.run_dir.name), ("epoch", 0), ("validate",), ("epoch", 1),
                          ("validate",), ("finish",)]
    assert checkpoint.load(trainer.checkpoint_path)["distributed"] == {"epochs": 2}
    again = CountingLoop()
    Trainer(config, tmp_path / "home", distributed=again).fit(resume=True)  # every epoch done: none trained
    assert again.restored == {"epochs": 2} and [c[0] for c in again.calls] == ["attach", "finish"]
    plain = Trainer(config, tmp_path / "plain")
    plain.fit()
    assert "distributed" not in checkpoint.load(plain.checkpoint_path)  # the single process keeps no loop state
