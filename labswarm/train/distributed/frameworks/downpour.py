"""``downpour``: asynchronous parameter server: learners pull every ``n_fetch`` steps and push every ``n_push``
steps without waiting for each other; learners may form synchronous worker groups (``group_size``).

Sources: Dean et al., "Large Scale Distributed Deep Networks" (NIPS 2012: Downpour SGD, its ``n_fetch`` and
``n_push``); SINGA's Downpour framework and its worker groups (Wang et al., "SINGA: Putting Deep Learning in the
Hands of Multimedia Users", ACM MM 2015; Ooi et al., "SINGA: A Distributed Deep Learning Platform", ACM MM 2015:
the workers of one group share a model replica and compute its gradient synchronously; the groups exchange with
the parameter server asynchronously).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from labswarm.errors import ConfigError
from labswarm.train.distributed.frameworks._ps import ParameterServerFramework
from labswarm.train.distributed.frameworks.base import FrameworkConfig, register_framework, tensor_bytes


class DownpourConfig(FrameworkConfig):
    """Parameters of :class:`Downpour`.

    Attributes:
        n_fetch: steps between two pulls of the server's parameters (Dean et al.'s ``n_fetch``; default 1).
        n_push: steps between two pushes of the gradients accumulated since the last push (``n_push``;
            default 1).
        group_size: learners per synchronous worker group (SINGA's worker groups; default 1: every learner is
            its own group, Dean et al.'s Downpour). Groups are ``group_size`` consecutive ranks; it must divide
            the number of learners.
    """

    n_fetch: int = Field(1, ge=1)
    n_push: int = Field(1, ge=1)
    group_size: int = Field(1, ge=1)


@register_framework
class Downpour(ParameterServerFramework):
    """Each learner steps its own replica with its own optimizer, sums its gradients, pushes the sum every
    ``n_push`` steps (the shards apply it at once with the learner's optimizer class and settings) and replaces
    its replica with the server's parameters every ``n_fetch`` steps. Staleness (``CommStats.staleness``): per
    push, the updates the server applied since this learner's last pull.

    Worker groups (``group_size`` > 1, SINGA): the learners are cut into groups of ``group_size`` consecutive
    ranks, and each group is a gloo process group of its own (:meth:`LearnerContext.join_group`, with the job's
    collective timeout): no collective spans two groups. Inside a group the gradients are all-reduced (averaged)
    every step through DDP, so the members apply the same update and hold one replica. The group's first rank,
    its **leader**, alone talks to the server: it pushes the group's gradient every ``n_push`` steps and pulls
    every ``n_fetch`` steps, then broadcasts the pulled parameters to its group. The group's process group is
    joined here when the caller has not (the trainer joins it, :attr:`group_size`). :meth:`finish` is collective
    inside a group: every member calls it.

    Failure semantics: asynchronous between groups. The trainer claims chunks in lockstep inside a group only
    (one chunk per member per step); groups never wait for each other, at the server or at the cursor, so a slow
    group does not hold the others back. A dead learner (``group_size`` 1) or a dead group is restarted alone
    (``restart_scope`` is ``"learner"``): a dead member fails its group's next all-reduce at once (a hung one
    within the collective timeout), so its peers end too and the job restarts each; they meet again in the
    group's next process-group generation, resume from their own checkpoints, pull the current parameters and
    take over their predecessors' chunks. A shard that restarts loses the updates after its last checkpoint.
    """

    name = "downpour"
    config_model = DownpourConfig
    config: DownpourConfig
    synchronous = False

    def __init__(self, config: DownpourConfig | None = None) -> None:
        super().__init__(config)
        #: this learner's worker group: the default process group of its process (:meth:`_attach`)
        self.group: Any = None
        self._collective_bytes = 0
        self._acc: list[Any] | None = None

    def check_learners(self, learners: int) -> None:
        """``group_size`` must divide the number of learners.

        Raises:
            ConfigError: it does not (the error names ``framework.group_size``).
        """
        size = self.config.group_size
        if learners % size:
            raise ConfigError([("framework.group_size", f"must divide the number of learners ({learners}); got "
                                                        f"{size}")])

    @property
    def group_size(self) -> int:
        """``group_size``: the trainer steps in lockstep inside a group, the groups asynchronously."""
        return self.config.group_size

    @property
    def leader(self) -> bool:
        """This learner talks to the server for its group (its group's first rank; every learner without
        groups)."""
        return self.context.rank % self.config.group_size == 0

    def _attach(self) -> Any:
        if self.config.group_size == 1:
            return super()._attach()
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        self.check_learners(self.context.world_size)
        self._join_own_group()  # the group's own process group: its members only
        self.group = dist.group.WORLD
        self._leader_rank = 0  # the leader is the group's first rank: rank 0 of its process group
        if self.leader:
            super()._attach()  # connect, offer the start, pull it
        # DDP broadcasts the group rank 0's (the leader's) parameters at construction: the group starts as one
        self._ddp = DistributedDataParallel(self.model, process_group=self.group)
        self._grad_bytes = tensor_bytes(self._params())
        return self._ddp

    def _count(self) -> None:
        self.stats.bytes_sent = self._collective_bytes + (self.client.bytes_sent if self.leader else 0)

    def _broadcast(self) -> None:
        """The leader's parameters to its group, in one flattened tensor (collective inside the group)."""
        import torch
        import torch.distributed as dist

        params = self._params()
        flat = torch.cat([p.detach().reshape(-1) for p in params])
        dist.broadcast(flat, src=self._leader_rank, group=self.group)
        if self.leader:
            self._collective_bytes += (self.config.group_size - 1) * flat.numel() * flat.element_size()
        else:
            offset = 0
            for p in params:
                p.data.copy_(flat[offset:offset + p.numel()].reshape(p.shape))
                offset += p.numel()
        self.stats.syncs += 1

    def _push(self) -> None:
        assert self._acc is not None
        self.stats.staleness.append(self.client.push(self._acc))
        self._acc = None
        self.stats.syncs += 1

    def after_step(self) -> None:
        """Accumulate; push every ``n_push`` steps; pull every ``n_fetch`` steps (with groups: the step's
        gradients were all-reduced in the group; the leader pushes and pulls, then broadcasts to the group)."""
        grouped = self.config.group_size > 1
        if grouped:  # the backward pass's in-group all-reduce: a ring sends 2 (g - 1) / g of the gradient bytes
            size = self.config.group_size
            self._collective_bytes += int(2 * (size - 1) / size * self._grad_bytes)
            self.stats.syncs += 1
        if self.leader:
            grads = self._grads()
            acc = self._acc
            self._acc = [g.clone() for g in grads] if acc is None else [a.add_(g) for a, g in zip(acc, grads,
                                                                                                    strict=True)]
            if self.steps % self.config.n_push == 0:
                self._push()
        if self.steps % self.config.n_fetch == 0:
            if self.leader:
                self._load(self.client.pull())
                self.stats.syncs += 1
            if grouped:
                self._broadcast()
        self._count()

    def finish(self) -> None:
        """Push the gradients accumulated since the last push (fewer than ``n_push`` steps' worth), then pull
        the server's parameters: the last steps count in the model the job delivers. With groups the leader
        does both and broadcasts to its group (every member must call this)."""
        if self.leader:
            if self._acc is not None:
                self._push()
            self._load(self.client.pull())
        if self.config.group_size > 1:
            self._broadcast()
        self._count()
