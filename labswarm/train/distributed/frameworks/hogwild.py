"""``distributed_hogwild``: SINGA's Distributed Hogwild. Every worker group (a learner, or ``group_size`` of them)
has its own server group in its processes (its replica and optimizer); it updates that replica without waiting
for anyone, and every ``sync_period`` steps exchanges with its neighbour group on a ring, asynchronously.

Sources: Ooi et al., "SINGA: A Distributed Deep Learning Platform" (ACM MM 2015) and SINGA's "Distributed Training
Framework" page: "Each node contains a complete server group and a complete worker group. Parameter updates are
done locally [...]. However, the server group must periodically synchronize with neighboring groups to improve the
training convergence" (the figure "Training frameworks in SINGA", panel (d)). The exchange is a gossip average with
the ring neighbour (Boyd et al., "Randomized Gossip Algorithms", IEEE Trans. Inf. Theory 2006; asynchronous and
decentralised as in Lian et al., "Asynchronous Decentralized Parallel SGD", ICML 2018, arXiv 1710.06952). Worker
groups of more than one learner (``group_size``) are the hybrid of SINGA's topology the paper leaves to its users
(issue 23: 2 worker groups of 2 with 2 server groups): AllReduce inside a group (its colocated server group's
shards, one per worker), Distributed Hogwild between the groups.
"""

from __future__ import annotations

import struct
from typing import Any

from pydantic import Field

from labswarm.errors import ConfigError
from labswarm.train.distributed.frameworks.base import Framework, FrameworkConfig, register_framework, tensor_bytes

#: The job store's keys of the published replicas: ``<prefix>/<worker group>`` (kept across a learner's restart).
KEY_PREFIX = "labswarm/hogwild"
#: A published replica: the publisher's step count (int64, little-endian), then its parameters (float32).
_HEADER = struct.Struct("<q")


class HogwildConfig(FrameworkConfig):
    """Parameters of :class:`DistributedHogwild`.

    Attributes:
        sync_period: steps between two exchanges with the ring neighbour (>= 1; default 4); the topology's
            ``sync_period``.
        mix: the neighbour's weight in the average, in (0, 1] (default 0.5: both replicas' midpoint).
        group_size: learners per worker group (default 1: SINGA's Distributed Hogwild); the topology's
            ``workers_per_group``. It must divide the number of learners.
    """

    sync_period: int = Field(4, ge=1, le=10**9)
    mix: float = Field(0.5, gt=0.0, le=1.0)
    group_size: int = Field(1, ge=1, le=1024)


@register_framework
class DistributedHogwild(Framework):
    """After every ``sync_period``-th step, worker group ``g`` of ``G`` (learner ``g`` when ``group_size`` is 1),
    when its left neighbour ``(g - 1) mod G`` has published a replica it has not mixed in yet, moves to
    ``(1 - mix) · own + mix · neighbour``, then publishes its replica in the job's store (``labswarm/hogwild/<g>``:
    its step count and its parameters). Nobody waits: a neighbour that has not published (slower, dead,
    restarting) is skipped until it has. The averaging matrix of each exchange is doubly stochastic, so the
    replicas contract toward one another (gossip averaging) while each group trains on its own chunks. Measured
    (:class:`~labswarm.train.distributed.frameworks.base.CommStats`): per exchange, the staleness (own steps less
    the neighbour's at its publication, at least 0) and the divergence (the root-mean-square difference of the two
    replicas' parameters before the average, and after it in ``divergence_after``). Optimizer state stays each
    group's own; only parameters travel.

    Worker groups (``group_size`` > 1): each group is a gloo process group of its own (joined by the trainer,
    :meth:`LearnerContext.join_group`, or here), its gradients all-reduced every step through DDP, so its members
    hold one replica (SINGA's colocated server group, one shard per worker); the group's first rank, its leader,
    exchanges with the neighbour group's leader, then broadcasts the replica to its group (collective inside the
    group at every ``sync_period``-th step and in :meth:`finish`: every member calls them, as the trainer's
    lockstep inside a group does).

    Failure semantics: asynchronous, no collective between groups: a dead learner (a dead group: its members fail
    their next collective) is restarted alone from its own checkpoint and picks up its neighbour's replica at its
    next exchange; the other groups never wait for it.
    """

    name = "distributed_hogwild"
    config_model = HogwildConfig
    config: HogwildConfig
    synchronous = False

    def __init__(self, config: HogwildConfig | None = None) -> None:
        super().__init__(config)
        self._seen = -1  # the neighbour's step count at the publication last mixed in
        self.divergence_after: list[float] = []
        self._store: Any = None

    @property
    def group_size(self) -> int:
        """``group_size``: the trainer steps in lockstep inside a group, the groups asynchronously."""
        return self.config.group_size

    def check_learners(self, learners: int) -> None:
        """``group_size`` must divide the number of learners.

        Raises:
            ConfigError: it does not (the error names ``framework.group_size``).
        """
        if learners % self.config.group_size:
            raise ConfigError([("framework.group_size", f"must divide the number of learners ({learners}); got "
                                                        f"{self.config.group_size}")])

    @property
    def leader(self) -> bool:
        """This learner exchanges for its group (the group's first rank; every learner without groups)."""
        return self.context.rank % self.config.group_size == 0

    def _attach(self) -> Any:
        size = self.config.group_size
        self.check_learners(self.context.world_size)
        self._groups = self.context.world_size // size
        self._group_index = self.context.rank // size
        if self._groups > 1 and self.leader:
            self._store = self.context.store()
        self._param_bytes = tensor_bytes(self._params())
        if size == 1:
            return self.model
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        if not self._join_own_group() and dist.get_world_size() != size:  # joined: its members only
            raise ConfigError([("framework.group_size", f"the process group joined has {dist.get_world_size()} "
                                                        f"learners, a worker group {size}: join the group's own "
                                                        "(LearnerContext.join_group)")])
        # DDP broadcasts the group rank 0's (the leader's) parameters at construction: the group starts as one
        return DistributedDataParallel(self.model)

    def after_step(self) -> None:
        """On the schedule: mix in the neighbour's fresh replica, then publish (and, in a group, broadcast)."""
        size = self.config.group_size
        if size > 1:  # the backward pass's in-group all-reduce: a ring sends 2 (g - 1) / g of the gradient bytes
            self.stats.bytes_sent += int(2 * (size - 1) / size * self._param_bytes)
            self.stats.syncs += 1
        if self.steps % self.config.sync_period == 0:
            self.exchange()

    def exchange(self) -> bool:
        """Mix in the neighbour's replica, if it published one not yet mixed in, then publish this replica (the
        freshest state it has); in a group, the leader does both and broadcasts the replica to its members
        (collective in the group). Returns whether it mixed (a job of one group has no neighbour)."""
        import torch

        params = self._params()
        flat = torch.cat([p.detach().reshape(-1).to(torch.float32) for p in params])
        mixed = self._mix(flat) if self._store is not None else None
        if mixed is not None:
            flat = mixed
        if self.config.group_size > 1:
            flat = self._broadcast(flat)
        if mixed is not None or not self.leader:
            offset = 0
            with torch.no_grad():
                for p in params:
                    p.copy_(flat[offset:offset + p.numel()].reshape(p.shape))
                    offset += p.numel()
        if self._store is not None:
            self._store.set(f"{KEY_PREFIX}/{self._group_index}", _HEADER.pack(self.steps) + flat.numpy().tobytes())
            self.stats.bytes_sent += flat.numel() * 4
        return mixed is not None

    def _broadcast(self, flat: Any) -> Any:
        """The leader's replica and ``seen`` (the neighbour's step count it last mixed in) to its members, in one
        broadcast (collective in the group): every member's checkpoint then holds the group's ``seen``, so a leader
        resumed from a member's checkpoint (:func:`~labswarm.train.distributed.agree.agree_on_resume`) does not mix
        in a neighbour replica it mixed already. ``seen`` travels as the bits of an int64 (two float32 slots, copied,
        never computed on). Returns the replica (float32, flat)."""
        import torch
        import torch.distributed as dist

        n = flat.numel()
        payload = torch.cat([flat, torch.tensor([self._seen], dtype=torch.int64).view(torch.float32)])
        dist.broadcast(payload, src=0)  # from the leader (its group rank 0)
        self._seen = int(payload[n:].clone().view(torch.int64)[0])
        if self.leader:
            self.stats.bytes_sent += (self.config.group_size - 1) * payload.numel() * 4
        return payload[:n]

    def _mix(self, flat: Any) -> Any:
        """``(1 - mix) · flat + mix · neighbour`` when the neighbour group published a replica not mixed in yet
        (its staleness and divergence counted), else ``None``."""
        import torch

        store = self._store
        key = f"{KEY_PREFIX}/{(self._group_index - 1) % self._groups}"
        if store is None or not store.check([key]):
            return None
        payload = store.get(key)
        (step,) = _HEADER.unpack_from(payload)
        if step == self._seen:  # nothing new: mixing an old replica again would pull toward the past
            return None
        neighbour = torch.frombuffer(bytearray(payload[_HEADER.size:]), dtype=torch.float32)
        mixed = flat + self.config.mix * (neighbour - flat)
        self._seen = step
        self.stats.syncs += 1
        self.stats.staleness.append(max(0, self.steps - step))
        self.stats.divergence.append(float((flat - neighbour).pow(2).mean().sqrt()))
        self.divergence_after.append(float((mixed - neighbour).pow(2).mean().sqrt()))
        return mixed

    def finish(self) -> None:
        """A last exchange (not waited for): the replica the job delivers has its neighbour's latest steps in it.
        Collective inside a group: every member calls it."""
        self.exchange()

    def state_dict(self) -> dict[str, Any]:
        """Adds the neighbour's step count last mixed in."""
        return {**super().state_dict(), "seen": self._seen}

    def load_state_dict(self, state: Any) -> None:
        """Restores it too."""
        super().load_state_dict(state)
        self._seen = int(state.get("seen", -1))
