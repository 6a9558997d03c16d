"""Learning-rate scaling with gradual warm-up for the larger global batch of ``N`` synchronous learners.

Goyal et al., "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour" (2017, arXiv 1706.02677): **linear
scaling rule**, "when the minibatch size is multiplied by k, multiply the learning rate by k"; **gradual warm-up**,
"start from a learning rate of η and increment it by a constant amount at each iteration such that it reaches
η̂ = kη after 5 epochs" (their 5 of 90 epochs). Here ``k`` is how many times the experiment's batch one update
averages (:meth:`~labswarm.train.distributed.frameworks.base.Framework.batch_factor`): the world size when each
learner steps on a whole batch (``batch: per_learner``), 1 when the learners split the experiment's batch
(``batch: global``, ``allreduce``'s default: the global batch is unchanged, so is the rate), and the learning
rate of optimizer step ``t`` (counted from 0 over the whole run, the framework's step count, so a resumed run
continues the ramp) is::

    lr(t) = η · (1 + (k - 1) · min(1, t / W))        W: the warm-up in steps (0: k·η from the first step)

``sqrt`` uses ``√k`` for ``k`` (the square-root rule for adaptive optimizers such as Adam: Malladi et al., "On the
SDEs and Scaling Rules for Adaptive Gradient Algorithms", NeurIPS 2022); ``none`` leaves the rate alone.

The scaling is a pair of optimizer hooks, separate from the trainer's schedule and from any other change of the
rate: before each ``optimizer.step()`` it multiplies every parameter group's ``lr`` by the factor of that step,
after it puts the group's own value back. Between steps ``lr`` is the base rate ``η`` the trainer's epoch
schedule (``LambdaLR``, ``ReduceLROnPlateau``) or a live change set; the scaling applies on top of whatever they
set. The settings are the framework's (``lr_scaling``, ``lr_warmup_epochs``, ``lr_warmup_steps``:
:class:`~labswarm.train.distributed.frameworks.base.LrScalingConfig`); the trainer's distributed mode installs it
(:func:`install`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

#: The rules: the factor of ``k`` learners' averaged batches.
RULES: dict[str, Callable[[int], float]] = {"linear": float, "sqrt": math.sqrt, "none": lambda _k: 1.0}


class LrScaling:
    """The hooks on one optimizer (see the module docstring).

    Args:
        optimizer: a ``torch.optim.Optimizer``.
        factor: the rate's factor after the warm-up (``k`` for the linear rule); >= 1 in use, any > 0 accepted.
        warmup_steps: steps of the linear ramp from 1 to ``factor`` (0: ``factor`` from the first step).
        steps: the optimizer steps taken so far in the run (the framework's count, restored on resume).
    """

    def __init__(self, optimizer: Any, factor: float, warmup_steps: int, steps: Callable[[], int]) -> None:
        if factor <= 0 or warmup_steps < 0:
            raise ValueError(f"factor must be > 0 and warmup_steps >= 0; got {factor}, {warmup_steps}")
        self.optimizer, self.factor, self.warmup_steps, self._steps = optimizer, factor, warmup_steps, steps
        self._base: list[float] = []
        #: the factor of the last step taken (1 before the first)
        self.last = 1.0
        self._handles = [optimizer.register_step_pre_hook(lambda _o, _a, _k: self._scale()),
                         optimizer.register_step_post_hook(lambda _o, _a, _k: self._restore())]

    def multiplier(self, step: int) -> float:
        """The factor of the base rate at optimizer step ``step`` (from 0): ``1 + (factor - 1) · min(1, step /
        warmup_steps)``."""
        if self.warmup_steps == 0:
            return self.factor
        return 1.0 + (self.factor - 1.0) * min(1.0, step / self.warmup_steps)

    def _scale(self) -> None:
        m = self.last = self.multiplier(self._steps())
        self._base = [group["lr"] for group in self.optimizer.param_groups]
        for group, base in zip(self.optimizer.param_groups, self._base, strict=True):
            group["lr"] = base * m

    def _restore(self) -> None:
        for group, base in zip(self.optimizer.param_groups, self._base, strict=True):
            group["lr"] = base

    def remove(self) -> None:
        """Remove the hooks (the rates stay the base ones)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []


def steps_per_pass(samples: int, chunk: int, world_size: int) -> int:
    """A learner's optimizer steps in one pass of the cursor when the learners claim in lockstep: every learner
    takes ``ceil(ceil(samples / chunk) / world_size)``."""
    return math.ceil(math.ceil(samples / chunk) / world_size)


def warmup_steps(config: Any, steps_per_epoch: int) -> int:
    """The warm-up in optimizer steps: ``lr_warmup_steps`` when given, else ``lr_warmup_epochs × steps_per_epoch``
    (rounded)."""
    if config.lr_warmup_steps is not None:
        return int(config.lr_warmup_steps)
    return round(config.lr_warmup_epochs * steps_per_epoch)


def install(framework: Any, optimizer: Any, world_size: int, steps_per_epoch: int) -> LrScaling | None:
    """Install the scaling a framework's config asks for on ``optimizer``; ``None`` when it asks for none (its
    rule is ``none``, one learner, ``batch: global`` (the global batch is the experiment's: ``k`` = 1), or a
    framework without the settings: the parameter-server ones, whose updates the shards apply with the optimizer
    settings the learners sent at the start).

    Args:
        framework: the learner's :class:`~labswarm.train.distributed.frameworks.base.Framework` (its ``config``
            and its step count ``steps``).
        optimizer: the learner's optimizer.
        world_size: the learners whose batches one update averages; ``k`` is
            ``framework.batch_factor(world_size)``.
        steps_per_epoch: this learner's optimizer steps in one pass (for ``lr_warmup_epochs``).
    """
    rule = getattr(framework.config, "lr_scaling", "none")
    factor = RULES[rule](framework.batch_factor(world_size))
    if factor == 1.0:
        return None
    return LrScaling(optimizer, factor, warmup_steps(framework.config, steps_per_epoch), lambda: framework.steps)
