"""Live changes of a running training (issue 25 item 5): a new learning rate or early-stopping patience, applied
between two epochs (:meth:`labswarm.train.trainer.TrainerHooks.before_epoch`).

The learning rate given is the training's new ``learning_rate``: the schedule's base from the next epoch on. For a
per-epoch factor schedule (``constant``, ``step``, ``cosine``, ``one_cycle``: a ``LambdaLR``) the rate of epoch
``e`` becomes ``new * factor(e)`` (so a ``constant`` schedule runs at the new rate); for ``reduce_on_plateau`` the
optimizer's rate is set to it and the plateau reductions go on from there. It goes into the checkpoint with the
optimizer's and the schedule's state, so a resumed run keeps it.
"""

from __future__ import annotations

from typing import Any

from labswarm.train.optim import EpochSchedule
from labswarm.train.watch import Watch


def set_learning_rate(optimizer: Any, schedule: EpochSchedule, learning_rate: float) -> float:
    """Make ``learning_rate`` the training's learning rate from now on (see the module docstring).

    Args:
        optimizer: the torch optimizer (every parameter group is changed).
        schedule: its :class:`~labswarm.train.optim.EpochSchedule`.
        learning_rate: the new base learning rate (> 0).

    Returns:
        The optimizer's learning rate now (its first group's ``lr``).

    Raises:
        ValueError: ``learning_rate`` is not positive.
    """
    if not learning_rate > 0:
        raise ValueError(f"learning_rate: must be positive, got {learning_rate}")
    scheduler = schedule.scheduler
    lambdas = getattr(scheduler, "lr_lambdas", None)
    for i, group in enumerate(optimizer.param_groups):
        group["initial_lr"] = learning_rate
        if lambdas is not None:  # LambdaLR: its epoch's factor of the new base
            group["lr"] = learning_rate * lambdas[i](scheduler.last_epoch)
        else:
            group["lr"] = learning_rate
    if lambdas is not None:
        scheduler.base_lrs = [learning_rate] * len(optimizer.param_groups)
        scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]
    return float(optimizer.param_groups[0]["lr"])


def set_patience(watch: Watch, patience: int) -> int:
    """Make ``patience`` the early stopping's (and the plateau events') patience from now on: a run already
    ``patience`` or more epochs without improvement stops after its next epoch that does not improve.

    Raises:
        ValueError: ``patience`` below 1.
    """
    if patience < 1:
        raise ValueError(f"patience: at least 1, got {patience}")
    watch.config = watch.config.model_copy(update={"patience": patience})
    return patience
