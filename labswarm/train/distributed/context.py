"""What a learner knows about its place in a distributed job, read from its environment.

This is the seam between the lifecycle manager and a learner: the lifecycle deploys the parameter-server shards
first, then ``N`` learner processes, each with this environment (torchrun's names where torchrun has one):

==============================  =======================================================================
``RANK``, ``WORLD_SIZE``        this learner's rank in ``[0, WORLD_SIZE)``, and the number of learners
``MASTER_ADDR``, ``MASTER_PORT`` the job's rendezvous :class:`torch.distributed.TCPStore`, hosted by the
                                coordinator (the lifecycle manager), not by a learner: it outlives learner
                                restarts, and the global cursor keeps its state there too
``LABSWARM_ATTEMPT``            the attempt number (from 1); the process group's keys live under it, so a
                                restarted attempt never meets the keys of the previous one (the pitfall of
                                pytorch issues 135712 / 167288, see the runbook)
``LABSWARM_PS_ADDRS``           the parameter-server shards, ``host:port,host:port`` in shard order
``LABSWARM_COLLECTIVE_TIMEOUT_S`` the timeout of every collective operation, in seconds (default 30; a job's
                                is its framework's ``timeout_s``): a hung peer fails the step within that
                                time, never torch's 30-minute default
==============================  =======================================================================

The learners' first join of their process group is bounded by :data:`JOIN_TIMEOUT_S` instead (at least the
collective timeout): the learners of an attempt start seconds apart, each importing torch, and a short collective
timeout, chosen to find a hung peer quickly, must not fail an attempt whose learners are all healthy.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from labswarm.errors import ConfigError

#: Seconds the learners of an attempt may take to all join their process group, when that is longer than the
#: collective timeout: the manager's default ``job_start_timeout`` (a learner's first report), after which a learner
#: that never came is killed as hung and its peers with it. The timeout then becomes the collective one.
JOIN_TIMEOUT_S = 300.0

#: Default collective timeout in seconds; torch's own default (``default_pg_timeout``) is 30 min.
DEFAULT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class LearnerContext:
    """A learner's rank, its peers and the job's coordination addresses.

    Attributes:
        rank: this learner's rank in ``[0, world_size)``.
        world_size: the number of learners.
        master_addr: host of the job's rendezvous store; ``None`` for a single learner.
        master_port: its port.
        attempt: the attempt number, from 1.
        ps_addresses: the parameter-server shards as ``(host, port)``, in shard order; empty when none.
        timeout_s: the timeout of collective operations and store waits, in seconds.
    """

    rank: int = 0
    world_size: int = 1
    master_addr: str | None = None
    master_port: int | None = None
    attempt: int = 1
    ps_addresses: tuple[tuple[str, int], ...] = field(default_factory=tuple)
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ConfigError([("WORLD_SIZE", f"must be at least 1, got {self.world_size}")])
        if not 0 <= self.rank < self.world_size:
            raise ConfigError([("RANK", f"must be in [0, {self.world_size}), got {self.rank}")])
        if self.attempt < 1:
            raise ConfigError([("LABSWARM_ATTEMPT", f"must be at least 1, got {self.attempt}")])
        if self.timeout_s <= 0:
            raise ConfigError([("LABSWARM_COLLECTIVE_TIMEOUT_S", f"must be positive, got {self.timeout_s}")])

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LearnerContext:
        """Read the variables of the module docstring (absent ones take the single-learner defaults).

        Raises:
            ConfigError: a variable is malformed or out of range; the error names it.
        """
        env = os.environ if environ is None else environ

        def number(name: str, default: float, kind: type = int) -> Any:
            raw = env.get(name)
            if raw is None or raw == "":
                return default
            try:
                return kind(raw)
            except ValueError:
                raise ConfigError([(name, f"must be a number, got {raw!r}")]) from None

        port = env.get("MASTER_PORT")
        return cls(rank=number("RANK", 0), world_size=number("WORLD_SIZE", 1),
                   master_addr=env.get("MASTER_ADDR") or None,
                   master_port=number("MASTER_PORT", 0) if port else None,
                   attempt=number("LABSWARM_ATTEMPT", 1),
                   ps_addresses=parse_addresses(env.get("LABSWARM_PS_ADDRS", ""), "LABSWARM_PS_ADDRS"),
                   timeout_s=number("LABSWARM_COLLECTIVE_TIMEOUT_S", DEFAULT_TIMEOUT_S, float))

    def to_env(self) -> dict[str, str]:
        """The environment that :meth:`from_env` reads back (what the lifecycle sets on each learner)."""
        env = {"RANK": str(self.rank), "WORLD_SIZE": str(self.world_size), "LABSWARM_ATTEMPT": str(self.attempt),
               "LABSWARM_COLLECTIVE_TIMEOUT_S": str(self.timeout_s)}
        if self.master_addr is not None:
            env.update(MASTER_ADDR=self.master_addr, MASTER_PORT=str(self.master_port))
        if self.ps_addresses:
            env["LABSWARM_PS_ADDRS"] = ",".join(f"{h}:{p}" for h, p in self.ps_addresses)
        return env

    @property
    def timeout(self) -> timedelta:
        """:attr:`timeout_s` as a ``timedelta`` (what torch.distributed takes)."""
        return timedelta(seconds=self.timeout_s)

    @property
    def join_timeout(self) -> timedelta:
        """How long the process group's first join may take: :data:`JOIN_TIMEOUT_S`, or :attr:`timeout_s` if
        longer."""
        return timedelta(seconds=max(self.timeout_s, JOIN_TIMEOUT_S))

    def store(self, timeout: timedelta | None = None) -> Any:
        """A client of the job's rendezvous ``TCPStore`` (hosted by the coordinator), its waits bounded by
        ``timeout`` (default :attr:`timeout`).

        Raises:
            ConfigError: no ``MASTER_ADDR`` / ``MASTER_PORT``.
        """
        from torch.distributed import TCPStore

        if self.master_addr is None or not self.master_port:
            raise ConfigError([("MASTER_ADDR", "distributed learners need MASTER_ADDR and MASTER_PORT")])
        return TCPStore(self.master_addr, self.master_port, is_master=False, timeout=timeout or self.timeout,
                        use_libuv=True)

    def _joined(self, store: Any) -> None:
        """After the first join (bounded by :attr:`join_timeout`): the collective timeout on every later operation
        of the default process group and of ``store``."""
        from torch.distributed.distributed_c10d import _set_pg_timeout  # torch's own setter (2.13: no public one)

        _set_pg_timeout(self.timeout)
        store.set_timeout(self.timeout)

    def init_process_group(self, backend: str | None = None) -> None:
        """Join this attempt's process group (``gloo`` on CPU, ``nccl`` when CUDA is available), through the job's
        store under the prefix ``labswarm/attempt-<n>/pg``, within :attr:`join_timeout`, then with :attr:`timeout_s`
        on every collective.

        Raises:
            ConfigError: no rendezvous address.
            torch.distributed.DistError: the peers did not all join within :attr:`join_timeout`.
        """
        import torch
        import torch.distributed as dist

        if backend is None:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        client = self.store(self.join_timeout)
        dist.init_process_group(backend, store=dist.PrefixStore(f"labswarm/attempt-{self.attempt}/pg", client),
                                rank=self.rank, world_size=self.world_size, timeout=self.join_timeout)
        self._joined(client)

    def join_group(self, size: int, backend: str | None = None) -> int:
        """Join this learner's worker group as its own process group: the ``size`` consecutive ranks
        ``g·size … g·size + size - 1`` (``g = rank // size``), group rank ``rank % size``, through the job's store
        under ``labswarm/attempt-<n>/group-<g>/gen-<k>/pg`` (SINGA's worker groups, issue 23 item 3). No other
        group is in it, so a group that dies restarts alone while the other groups never notice: a dead member's
        peers fail at their next collective, the job restarts each, and they meet in a new generation ``k``.

        Generations: the group's current one is ``…/group-<g>/gen`` (0 at first). A process takes its group
        rank's seat in it (``…/gen-<k>/seat-<local>``, a fetch-and-add); a seat taken before (by the process this
        one replaced, or by itself in a rendezvous that timed out) means that generation is over for this group:
        the process moves the group to ``k + 1`` (compare-and-set) and takes its seat there. Every member
        restarted after a death therefore lands in the same next generation, whatever order they come back in.

        Returns:
            This learner's rank in its group.

        Raises:
            ConfigError: ``size`` does not divide the number of learners, or no rendezvous address.
            torch.distributed.DistError: the group's members did not all join within :attr:`join_timeout` (then
                :attr:`timeout_s` bounds each collective, as in :meth:`init_process_group`).
        """
        import torch
        import torch.distributed as dist

        if size < 1 or self.world_size % size:
            raise ConfigError([("framework.group_size", f"must divide the number of learners ({self.world_size}); "
                                                        f"got {size}")])
        if backend is None:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        group, local = divmod(self.rank, size)
        store = self.store(self.join_timeout)
        prefix = f"labswarm/attempt-{self.attempt}/group-{group}"
        generation = int(store.get(f"{prefix}/gen")) if store.check([f"{prefix}/gen"]) else 0
        while store.add(f"{prefix}/gen-{generation}/seat-{local}", 1) > 1:  # taken: that generation is over
            now = store.compare_set(f"{prefix}/gen", str(generation) if generation else "",
                                    str(generation + 1)).decode()
            generation = int(now) if now else 0
        dist.init_process_group(backend, store=dist.PrefixStore(f"{prefix}/gen-{generation}/pg", store), rank=local,
                                world_size=size, timeout=self.join_timeout)
        self._joined(store)
        return local


def parse_addresses(text: str, name: str) -> tuple[tuple[str, int], ...]:
    """``"host:port,host:port"`` as ``((host, port), ...)``; ``""`` gives ``()``.

    Raises:
        ConfigError: an item is not ``host:port`` with a port in [1, 65535]; the error names ``name``.
    """
    out = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError([(name, f"expected host:port items separated by commas, got {item!r}")])
        out.append((host, int(port)))
    return tuple(out)
