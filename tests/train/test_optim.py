"""Optimizers and schedules by name (issue 25, item 2): validated without torch at submission, built with torch."""

from __future__ import annotations

import inspect
import math
from pathlib import Path

import pytest
import torch
from three_classes import training_experiment

from labswarm.config.experiment import parse_experiment
from labswarm.config.optim import OPTIMIZERS, CosineSchedule, OneCycleSchedule, StepSchedule
from labswarm.config.training import TrainingConfig
from labswarm.errors import ConfigError
from labswarm.train import checkpoint
from labswarm.train.optim import EpochSchedule, build_optimizer, lr_factor
from labswarm.train.trainer import Trainer

#: torch.optim's optimizers the table leaves out, and why (config/optim.py).
LEFT_OUT = {"LBFGS", "SparseAdam", "Muon"}


def test_the_table_of_optimizers_is_torch_s() -> None:
    """A torch upgrade that adds, removes or changes an optimizer's arguments fails here."""
    installed = {n for n in torch.optim.__all__ if isinstance(c := getattr(torch.optim, n), type)
                 and issubclass(c, torch.optim.Optimizer) and c is not torch.optim.Optimizer}
    assert {cls for cls, _, _ in OPTIMIZERS.values()} == installed - LEFT_OUT
    for name, (cls, kwargs, decay) in OPTIMIZERS.items():
        params = set(inspect.signature(getattr(torch.optim, cls).__init__).parameters) - {"self", "params", "lr"}
        assert kwargs == params - {"weight_decay"}, name
        assert decay == ("weight_decay" in params), name


@pytest.mark.parametrize(("training", "words"), [
    ({"optimizer": {"name": "sgdd"}}, "unknown optimizer 'sgdd'"),
    ({"optimizer": {"name": "sgd", "momentun": 0.9}}, "momentun: not an argument of SGD"),
    ({"optimizer": {"name": "adam", "lr": 0.1}}, "lr: set training.learning_rate"),
    ({"optimizer": {"name": "adam", "betas": {"a": 1}}}, "betas"),
    ({"optimizer": "rprop"}, "weight_decay: optimizer 'rprop' has none"),
    ({"schedule": {"name": "step", "gama": 0.5}}, "gama"),
    ({"schedule": "exponential"}, "exponential"),
    ({"schedule": "plateau", "validation": 0.0}, "'val_loss' needs a validation split"),
    ({"early_stopping": {"metric": "val_accuracy"}, "validation": 0.0}, "needs a validation split"),
])
def test_a_bad_optimizer_or_schedule_is_refused_naming_the_field(three_classes: Path, tmp_path: Path,
                                                                 training: dict, words: str) -> None:
    data = training_experiment(three_classes, tmp_path / "store")
    data["training"] = {**data["training"], **training}
    with pytest.raises(ConfigError) as caught:
        parse_experiment(data)
    assert any(path.startswith("training") and words in reason for path, reason in caught.value.errors), \
        caught.value.errors


def test_names_and_spellings() -> None:
    config = TrainingConfig(optimizer={"name": "SGD", "momentum": 0.9, "nesterov": True}, schedule="one-cycle")
    assert config.optimizer.name == "sgd" and config.optimizer.kwargs == {"momentum": 0.9, "nesterov": True}
    assert config.schedule.name == "one_cycle"
    assert TrainingConfig(schedule="reduce-on-plateau").schedule.name == "reduce_on_plateau"
    assert TrainingConfig(optimizer="rprop", weight_decay=0).optimizer.takes_weight_decay is False
    assert TrainingConfig.model_validate(config.model_dump()) == config  # a manifest's resolved form loads back


def test_an_optimizer_is_built_with_its_arguments_and_torch_s_refusal_names_the_field() -> None:
    params = [torch.nn.Parameter(torch.zeros(3))]
    sgd = build_optimizer(torch, params, TrainingConfig(learning_rate=0.05, weight_decay=0.01,
                                                        optimizer={"name": "sgd", "momentum": 0.9}))
    assert isinstance(sgd, torch.optim.SGD)
    assert sgd.defaults["momentum"] == 0.9 and sgd.defaults["lr"] == 0.05 and sgd.defaults["weight_decay"] == 0.01
    adam = build_optimizer(torch, params, TrainingConfig(optimizer={"name": "adam", "betas": [0.8, 0.9]}))
    assert adam.defaults["betas"] == (0.8, 0.9)
    with pytest.raises(ConfigError) as caught:
        build_optimizer(torch, params, TrainingConfig(optimizer={"name": "sgd", "momentum": -1.0}))
    assert caught.value.errors[0][0] == "training.optimizer" and "momentum" in caught.value.errors[0][1]


def test_the_schedules_factors() -> None:
    assert [lr_factor(StepSchedule(step_size=2, gamma=0.5), e, 6, 1.0) for e in range(6)] == [1, 1, .5, .5, .25, .25]
    cosine = [lr_factor(CosineSchedule(eta_min=0.1), e, 4, 1.0) for e in range(5)]
    assert cosine[0] == 1.0 and cosine[2] == pytest.approx(0.55) and cosine[4] == pytest.approx(0.1)
    cycle = [lr_factor(OneCycleSchedule(pct_start=0.25, div_factor=10, final_div_factor=100), e, 9, 1.0)
             for e in range(9)]
    assert cycle[0] == pytest.approx(0.1) and cycle[2] == pytest.approx(1.0) and max(cycle) == cycle[2]
    assert cycle[-1] == pytest.approx(0.1 / 100) and cycle == sorted(cycle[:3]) + sorted(cycle[3:], reverse=True)


def test_reduce_on_plateau_decays_when_the_metric_stalls_and_needs_it() -> None:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    schedule = EpochSchedule(torch, optimizer, TrainingConfig(
        learning_rate=1.0, schedule={"name": "plateau", "patience": 1, "factor": 0.5, "threshold": 0.0}))
    rates = []
    for loss in (1.0, 0.5, 0.5, 0.5, 0.4, 0.4, 0.4):
        schedule.step({"val_loss": loss})
        rates.append(optimizer.param_groups[0]["lr"])
    assert rates == [1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.25]
    with pytest.raises(ConfigError, match="val_loss"):
        schedule.step({"train_loss": 1.0})
    assert math.isclose(EpochSchedule(torch, optimizer, TrainingConfig()).state_dict()["base_lrs"][0], 0.25)


def test_the_trainer_uses_the_named_optimizer_and_schedule(three_classes: Path, tmp_path: Path) -> None:
    config = parse_experiment(training_experiment(three_classes, tmp_path / "store", training={
        "epochs": 3, "learning_rate": 0.02, "validation": 0.25, "threads": 1,
        "optimizer": {"name": "sgd", "momentum": 0.9}, "schedule": {"name": "step", "gamma": 0.5}}))
    trainer = Trainer(config, tmp_path / "home")
    result = trainer.fit()
    assert [r["lr"] for r in result.metrics] == [0.02, 0.01, 0.005]
    state = checkpoint.load(trainer.checkpoint_path)
    assert state["optimizer"]["param_groups"][0]["momentum"] == 0.9
    assert "momentum_buffer" in next(iter(state["optimizer"]["state"].values()))
