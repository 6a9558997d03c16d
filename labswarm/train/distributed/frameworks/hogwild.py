"""``distributed_hogwild``: SINGA's Distributed Hogwild. Every learner is a worker group of one with its own server
group in its process (its replica and optimizer); it updates that replica without waiting for anyone, and every
``sync_period`` steps exchanges with its neighbour on a ring, asynchronously.

Sources: Ooi et al., "SINGA: A Distributed Deep Learning Platform" (ACM MM 2015) and SINGA's "Distributed Training
Framework" page: "Each node contains a complete server group and a complete worker group. Parameter updates are
done locally [...]. However, the server group must periodically synchronize with neighboring groups to improve the
training convergence" (the figure "Training frameworks in SINGA", panel (d)). The exchange is a gossip average with
the ring neighbour (Boyd et al., "Randomized Gossip Algorithms", IEEE Trans. Inf. Theory 2006; asynchronous and
decentralised as in Lian et al., "Asynchronous Decentralized Parallel SGD", ICML 2018, arXiv 1710.06952).
"""

from __future__ import annotations

import struct
from typing import Any

from pydantic import Field

from labswarm.train.distributed.frameworks.base import Framework, FrameworkConfig, register_framework, tensor_bytes

#: The job store's keys of the published replicas: ``<prefix>/<rank>`` (kept across a learner's restart).
KEY_PREFIX = "labswarm/hogwild"
#: A published replica: the publisher's step count (int64, little-endian), then its parameters (float32).
_HEADER = struct.Struct("<q")


class HogwildConfig(FrameworkConfig):
    """Parameters of :class:`DistributedHogwild`.

    Attributes:
        sync_period: steps between two exchanges with the ring neighbour (>= 1; default 4); the topology's
            ``sync_period``.
        mix: the neighbour's weight in the average, in (0, 1] (default 0.5: both replicas' midpoint).
    """

    sync_period: int = Field(4, ge=1, le=10**9)
    mix: float = Field(0.5, gt=0.0, le=1.0)


@register_framework
class DistributedHogwild(Framework):
    """After every ``sync_period``-th step, learner ``r`` of ``N``, when its left neighbour ``(r - 1) mod N`` has
    published a replica it has not mixed in yet, moves to ``(1 - mix) · own + mix · neighbour``, then publishes its
    replica in the job's store (``labswarm/hogwild/<r>``: its step count and its parameters). Nobody waits:
    a neighbour that has not published (slower, dead, restarting) is skipped until it has. The averaging matrix
    of each exchange is doubly stochastic, so the replicas contract toward one another (gossip averaging) while
    each trains on its own chunks. Measured (:class:`~labswarm.train.distributed.frameworks.base.CommStats`): per
    exchange, the staleness (own steps less the neighbour's at its publication, at least 0) and the divergence
    (the root-mean-square difference of the two replicas' parameters before the average, and after it in
    ``divergence_after``). Optimizer state stays each learner's own; only parameters travel.

    Failure semantics: asynchronous, no process group: a dead learner is restarted alone from its own checkpoint
    and picks up its neighbour's replica at its next exchange; the others never wait for it.
    """

    name = "distributed_hogwild"
    config_model = HogwildConfig
    config: HogwildConfig
    synchronous = False

    def __init__(self, config: HogwildConfig | None = None) -> None:
        super().__init__(config)
        self._seen = -1  # the neighbour's step count at the publication last mixed in
        self.divergence_after: list[float] = []

    def _attach(self) -> Any:
        self._store = self.context.store() if self.context.world_size > 1 else None
        self._param_bytes = tensor_bytes(self._params())
        return self.model

    def after_step(self) -> None:
        """On the schedule: mix in the neighbour's fresh replica, then publish."""
        if self.steps % self.config.sync_period == 0:
            self.exchange()

    def exchange(self) -> bool:
        """Mix in the neighbour's replica, if it published one not yet mixed in, then publish this replica (the
        freshest state it has). Returns whether it mixed (a one-learner job has no neighbour)."""
        import torch

        if self._store is None:
            return False
        params = self._params()
        flat = torch.cat([p.detach().reshape(-1).to(torch.float32) for p in params])
        mixed = self._mix(flat)
        if mixed is not None:
            flat = mixed
            offset = 0
            with torch.no_grad():
                for p in params:
                    p.copy_(flat[offset:offset + p.numel()].reshape(p.shape))
                    offset += p.numel()
        self._store.set(f"{KEY_PREFIX}/{self.context.rank}", _HEADER.pack(self.steps) + flat.numpy().tobytes())
        self.stats.bytes_sent += flat.numel() * 4
        return mixed is not None

    def _mix(self, flat: Any) -> Any:
        """``(1 - mix) · flat + mix · neighbour`` when the neighbour published a replica not mixed in yet (its
        staleness and divergence counted), else ``None``."""
        import torch

        store = self._store
        key = f"{KEY_PREFIX}/{(self.context.rank - 1) % self.context.world_size}"
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
        """A last exchange (not waited for): the replica the job delivers has its neighbour's latest steps in it."""
        self.exchange()

    def state_dict(self) -> dict[str, Any]:
        """Adds the neighbour's step count last mixed in."""
        return {**super().state_dict(), "seen": self._seen}

    def load_state_dict(self, state: Any) -> None:
        """Restores it too."""
        super().load_state_dict(state)
        self._seen = int(state.get("seen", -1))
