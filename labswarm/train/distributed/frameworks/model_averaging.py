"""``model_averaging``: every learner trains its own replica; the replicas are averaged every ``period`` steps.

Sources: DLaaS's model averaging (Bhattacharjee et al., "IBM Deep Learning Service", 2017); post-local SGD (Lin
et al., "Don't Use Large Mini-Batches, Use Local SGD", ICLR 2020, arXiv 1808.07217) through PyTorch's
``torch.distributed.algorithms.model_averaging.averagers.PeriodicModelAverager``; SINGA's Distributed Hogwild
exchanges updates periodically in the same spirit.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from labswarm.train.distributed.frameworks.base import Framework, LrScalingConfig, register_framework, tensor_bytes


class ModelAveragingConfig(LrScalingConfig):
    """Parameters of :class:`ModelAveraging`.

    Attributes:
        period: steps between two averages (at least 2: with 1, ``allreduce`` sends the same bytes and keeps
            the optimizers in step; torch's averager warns the same).
        warmup_steps: steps averaged every step before the periodic schedule starts (torch's default, 0).
        lr_scaling: default ``none``: each learner steps on its own batch at the one-learner rate; ``linear``
            scales it by N as for an N times larger batch (Goyal et al. 2017), with ``lr_warmup_epochs`` /
            ``lr_warmup_steps`` (:class:`~labswarm.train.distributed.frameworks.base.LrScalingConfig`).
    """

    period: int = Field(4, ge=2)
    warmup_steps: int = Field(0, ge=0)


@register_framework
class ModelAveraging(Framework):
    """Local SGD with periodic averaging: torch's ``PeriodicModelAverager`` over the whole process group
    averages the parameters (one flattened all-reduce) after step 1 + ``warmup_steps`` + k · ``period``
    (its step counter starts at 0, so the first average also makes the replicas start identical). Optimizer
    state is never averaged (torch's averager does not), nor are parameters without a gradient.

    Failure semantics: synchronous at each average; a dead peer fails the others' next average; the learners
    restart together from the last checkpoint, losing the local steps since it.
    """

    name = "model_averaging"
    config_model = ModelAveragingConfig
    config: ModelAveragingConfig

    def _attach(self) -> Any:
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

        self._averager = None if self.context.world_size == 1 else PeriodicModelAverager(
            period=self.config.period, warmup_steps=self.config.warmup_steps)
        self._param_bytes = tensor_bytes(self._params())
        return self.model

    def after_step(self) -> None:
        """Average if this step is on the schedule (counting ``2 (N - 1) / N`` of the parameter bytes sent)."""
        averager = self._averager
        if averager is None:  # one learner: nothing to average with
            return
        due = (averager.step >= averager.warmup_steps
               and (averager.step - averager.warmup_steps) % averager.period == 0)
        averager.average_parameters(self._params())
        if due and self.context.world_size > 1:
            n = self.context.world_size
            self.stats.bytes_sent += int(2 * (n - 1) / n * self._param_bytes)
            self.stats.syncs += 1

    def state_dict(self) -> dict[str, Any]:
        """Adds the averager's step counter (where the schedule stands)."""
        return {**super().state_dict(), "averager_step": self._averager.step if self._averager else 0}

    def load_state_dict(self, state: Any) -> None:
        """Restores the averager's step counter too."""
        super().load_state_dict(state)
        if self._averager is not None:
            self._averager.step = int(state["averager_step"])
