"""``allreduce``: synchronous data parallelism, gradients all-reduced every step.

Sources: PyTorch ``DistributedDataParallel`` (Li et al., "PyTorch Distributed", VLDB 2020, arXiv 2006.15704);
SINGA's AllReduce framework (Wang et al., "SINGA: A Distributed Deep Learning Platform", ACM MM 2015).
"""

from __future__ import annotations

import contextlib
from typing import Any, Literal

from pydantic import Field

from labswarm.train.distributed.frameworks.base import (
    Framework,
    GlobalBatchConfig,
    LrScalingConfig,
    register_framework,
    tensor_bytes,
)


class AllReduceConfig(LrScalingConfig, GlobalBatchConfig):
    """Parameters of :class:`AllReduce`.

    Attributes:
        bucket_cap_mb: DDP's gradient bucket size in MiB (torch's default, 25): gradients are all-reduced in
            buckets of this size, overlapping the backward pass.
        batch: ``global`` (default: each learner steps on the experiment's batch size / N, one update averages
            the experiment's batch) or ``per_learner`` (each learner a whole batch: an N times larger global
            batch); :class:`~labswarm.train.distributed.frameworks.base.GlobalBatchConfig`.
        lr_scaling: default ``linear``: the rate is ``k`` times the one-learner rate after a warm-up of
            ``lr_warmup_epochs`` (1) epoch, ``k`` the global batch over the experiment's batch (Goyal et al.
            2017; :class:`~labswarm.train.distributed.frameworks.base.LrScalingConfig`): N with
            ``batch: per_learner``, 1 (no scaling) with ``batch: global``. ``none``: the step of one learner on
            the concatenated batch at the same rate (the behaviour before issue 23).
    """

    bucket_cap_mb: float = Field(25.0, gt=0)
    lr_scaling: Literal["linear", "sqrt", "none"] = "linear"


@register_framework
class AllReduce(Framework):
    """Every learner computes gradients on its own batch; DDP averages them across learners during the backward
    pass, so every learner applies the same update and the replicas stay identical. With equal per-learner
    batches this is one learner on the concatenated batch (``tests/learners/test_collective.py`` checks it).

    Failure semantics: synchronous; a dead peer fails the others' next step at once ("Connection reset by
    peer"), a hung one within the collective timeout; the learners restart together from the last checkpoint.
    Uneven batch counts per learner hang DDP: run the epoch inside :meth:`join`.
    """

    name = "allreduce"
    equal_replicas = True
    config_model = AllReduceConfig
    config: AllReduceConfig

    def _attach(self) -> Any:
        from torch.nn.parallel import DistributedDataParallel

        self._ddp = DistributedDataParallel(self.model, bucket_cap_mb=self.config.bucket_cap_mb)
        self._grad_bytes = tensor_bytes(self._params())
        return self._ddp

    def after_step(self) -> None:
        """Count what the step's all-reduce sent: a ring all-reduce sends ``2 (N - 1) / N`` of the gradient
        bytes per learner."""
        n = self.context.world_size
        self.stats.bytes_sent += int(2 * (n - 1) / n * self._grad_bytes)
        self.stats.syncs += 1

    def join(self) -> Any:
        """A context manager for an epoch where learners may have different numbers of batches
        (``torch.distributed.algorithms.Join``)."""
        from torch.distributed.algorithms import Join

        return Join([self._ddp]) if self.context.world_size > 1 else contextlib.nullcontext()
