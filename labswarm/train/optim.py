"""The optimizer and the learning-rate schedule a ``training`` section names (:mod:`labswarm.config.optim`).

The schedules are stepped once per epoch, after its validation, with the epoch's record (``reduce_on_plateau``
reads its metric there). ``constant``, ``step``, ``cosine`` and ``one_cycle`` are a factor of the learning rate
per epoch (:func:`lr_factor`, a ``LambdaLR``: their checkpoint state is the epoch count);
``reduce_on_plateau`` is torch's ``ReduceLROnPlateau``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from labswarm.config.optim import (
    OPTIMIZERS,
    ConstantSchedule,
    CosineSchedule,
    OneCycleSchedule,
    PlateauSchedule,
    StepSchedule,
)
from labswarm.config.training import TrainingConfig
from labswarm.errors import ConfigError


def build_optimizer(torch: Any, params: Iterable[Any], training: TrainingConfig) -> Any:
    """``training.optimizer`` over ``params``, at ``training.learning_rate`` (and its weight decay).

    Raises:
        ConfigError: torch refuses an argument or its value (``training.optimizer``).
    """
    config = training.optimizer
    cls = getattr(torch.optim, OPTIMIZERS[config.name][0])
    kwargs = dict(config.kwargs)
    if isinstance(kwargs.get("betas"), list):
        kwargs["betas"] = tuple(kwargs["betas"])
    if config.takes_weight_decay:
        kwargs["weight_decay"] = training.weight_decay
    try:
        return cls(params, lr=training.learning_rate, **kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError([("training.optimizer", f"{cls.__name__} refuses {kwargs}: {exc}")]) from exc


def lr_factor(schedule: ConstantSchedule | StepSchedule | CosineSchedule | OneCycleSchedule, epoch: int,
              epochs: int, lr: float) -> float:
    """The factor of the learning rate ``lr`` in ``epoch`` (from 0) of ``epochs``."""
    if isinstance(schedule, StepSchedule):
        return float(schedule.gamma ** (epoch // schedule.step_size))
    if isinstance(schedule, CosineSchedule):
        floor = schedule.eta_min / lr
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * epoch / epochs))
    if isinstance(schedule, OneCycleSchedule):
        start = 1 / schedule.div_factor
        end = start / schedule.final_div_factor
        peak = schedule.pct_start * (epochs - 1)  # the epoch of the highest rate
        if epoch <= peak:
            return _anneal(start, 1.0, epoch / peak if peak else 1.0, schedule.anneal_strategy)
        return _anneal(1.0, end, (epoch - peak) / (epochs - 1 - peak), schedule.anneal_strategy)
    return 1.0


def _anneal(start: float, end: float, fraction: float, strategy: str) -> float:
    if strategy == "linear":
        return start + (end - start) * fraction
    return end + (start - end) * 0.5 * (1 + math.cos(math.pi * fraction))


class EpochSchedule:
    """The learning-rate schedule of ``training``, stepped at the end of each epoch with its record.

    Args:
        torch: the torch module.
        optimizer: the optimizer whose learning rate it sets.
        training: the training section.
    """

    def __init__(self, torch: Any, optimizer: Any, training: TrainingConfig) -> None:
        config = training.schedule
        self.metric: str | None = None
        if isinstance(config, PlateauSchedule):
            self.metric = config.metric
            self.scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
                optimizer, mode=config.mode, factor=config.factor, patience=config.patience,
                threshold=config.threshold, min_lr=config.min_lr)
        else:
            epochs, lr = training.epochs, training.learning_rate
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(
                optimizer, lambda e: lr_factor(config, e, epochs, lr))

    def step(self, record: Mapping[str, Any]) -> None:
        """The epoch of ``record`` ended.

        Raises:
            ConfigError: the record lacks the metric ``reduce_on_plateau`` watches.
        """
        if self.metric is None:
            self.scheduler.step()
            return
        value = record.get(self.metric)
        if value is None:
            raise ConfigError([("training.schedule.metric", f"the epoch's record has no {self.metric!r}")])
        self.scheduler.step(float(value))

    def state_dict(self) -> dict[str, Any]:
        """The scheduler's state, for the checkpoint."""
        return dict(self.scheduler.state_dict())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.scheduler.load_state_dict(dict(state))
