"""The seam with the job service: what the lifecycle manager deploys for one attempt of a distributed job.

The lifecycle (:mod:`labswarm.jobs.lifecycle.lifecycle`, with :mod:`labswarm.jobs.lifecycle.cluster`) does, for a
manifest with ``learners: N`` and ``framework: {name: ...}``:

1. host the job's :class:`JobCoordinator` (a ``TCPStore`` server: the process-group rendezvous and the global
   cursor's state), and checkpoint :meth:`JobCoordinator.state_dict` with the job;
2. start the parameter-server shards first when the framework needs them (:func:`plan_attempt` gives their
   command lines, on ports the lifecycle picks and keeps so a restarted shard takes its port back, and the job's
   secret in their environment and the learners', never on a command line), and wait until they listen;
3. start the ``N`` learners with the environment :func:`plan_attempt` gives each
   (:class:`~labswarm.train.distributed.context.LearnerContext`'s variables);
4. on a learner's death: :func:`restart_scope` says whether it restarts alone (asynchronous frameworks: it pulls
   the current parameters; ``downpour``'s worker groups too: a dead member's peers fail their group's next
   collective and restart alone as well, the group alone) or all learners restart together from the last
   checkpoint as a new attempt (synchronous frameworks; the new attempt number gives the process group fresh
   store keys).

A job with one learner needs no coordinator, no shard and no framework: the trainer runs as today.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from labswarm.errors import ConfigError
from labswarm.train.distributed.context import DEFAULT_TIMEOUT_S, LearnerContext
from labswarm.train.distributed.frameworks.base import Framework
from labswarm.train.distributed.ps.auth import SECRET_ENV


@dataclass(frozen=True)
class ProcessPlan:
    """One process of an attempt.

    Attributes:
        kind: ``"ps"`` (a parameter-server shard) or ``"learner"``.
        index: the shard index or the learner's rank.
        argv: the command line (``None`` for learners: the lifecycle's learner command, as today).
        env: variables to add to the process's environment (the job's parameter-server secret among them: keep
            them out of logs and events).
    """

    kind: str
    index: int
    argv: list[str] | None
    env: dict[str, str]


def plan_attempt(framework: Mapping[str, Any], learners: int, attempt: int, master: tuple[str, int],
                 ps_addresses: Sequence[tuple[str, int]] = (), checkpoint_dir: Path | None = None, *,
                 timeout_s: float | None = None, checkpoint_every: int = 10,
                 ps_secret: str | None = None) -> list[ProcessPlan]:
    """The processes of one attempt, in start order: the shards (if the framework needs them), then the learners.

    Args:
        framework: the manifest's ``framework`` spec (``{name: ..., **params}``).
        learners: ``N``, at least 2 (one learner needs no plan).
        attempt: the attempt number, from 1.
        master: the :class:`JobCoordinator`'s ``(host, port)``.
        ps_addresses: one ``(host, port)`` per shard (``ps_shards`` of them) for frameworks that need a server.
        checkpoint_dir: where the shards checkpoint (the job's folder; required with shards).
        timeout_s: collective / round / request timeout, in s; ``None``: the framework's ``timeout_s``
            (:class:`~labswarm.train.distributed.frameworks.base.FrameworkConfig`, default 30).
        checkpoint_every: shard updates between two shard checkpoints.
        ps_secret: the job's parameter-server secret (:func:`labswarm.train.distributed.ps.auth.new_secret`,
            made once per job): set as ``LABSWARM_PS_SECRET`` in the shards' and learners' ``env``, never in an
            ``argv``.
            ``None``: shards without a secret, which listen on loopback only.

    Raises:
        ConfigError: an unknown framework or bad parameters, fewer than 2 learners, parameters that do not fit
            the learners (``framework.group_size``), or a server framework without shard addresses or checkpoint
            folder (each error names its field).
    """
    fw = Framework.from_spec(framework)
    if timeout_s is None:
        timeout_s = fw.config.timeout_s
    if learners < 2:
        raise ConfigError([("learners", f"a distributed attempt needs at least 2 learners, got {learners}")])
    fw.check_learners(learners)
    secret_env = {SECRET_ENV: ps_secret} if ps_secret and fw.needs_parameter_server else {}
    shards: list[ProcessPlan] = []
    if fw.needs_parameter_server:
        if not ps_addresses:
            raise ConfigError([("ps_shards", f"framework {fw.name!r} needs at least one parameter-server shard")])
        if checkpoint_dir is None:
            raise ConfigError([("checkpoint_dir", "parameter-server shards need a checkpoint folder")])
        for k, (host, port) in enumerate(ps_addresses):
            shards.append(ProcessPlan("ps", k, [
                sys.executable, "-m", "labswarm.train.distributed.ps", "--shard", str(k), "--learners", str(learners),
                "--checkpoint-dir", str(checkpoint_dir), "--checkpoint-every", str(checkpoint_every),
                "--round-timeout", str(timeout_s), "--host", host, "--port", str(port)], dict(secret_env)))
    addresses = tuple(ps_addresses) if fw.needs_parameter_server else ()
    return shards + [
        ProcessPlan("learner", rank, None, LearnerContext(
            rank=rank, world_size=learners, master_addr=master[0], master_port=master[1], attempt=attempt,
            ps_addresses=addresses, timeout_s=timeout_s).to_env() | secret_env)
        for rank in range(learners)]


def restart_scope(framework: Mapping[str, Any]) -> str:
    """``"learner"``: a dead learner restarts alone (asynchronous frameworks; ``downpour``'s worker groups too: a
    dead member's peers fail at their group's next collective and are restarted alone as well, and the group meets
    again in a new process group of its own, :meth:`LearnerContext.join_group`, while the other groups go on);
    ``"attempt"``: every learner restarts together from the last checkpoint (synchronous ones: torchrun's
    semantics).

    Raises:
        ConfigError: an unknown framework.
    """
    return "attempt" if Framework.from_spec(framework).synchronous else "learner"


class JobCoordinator:
    """The job's ``TCPStore`` server: learners rendezvous there and the global cursor keeps its state there.
    Hosted by the lifecycle (the manager), not by a learner, so it outlives learner restarts.

    Args:
        host: the address to listen on.
        port: the port (0: a free one; :attr:`port` tells it).
        timeout_s: the store's operation timeout, in s.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        from torch.distributed import TCPStore

        self.host = host
        self.store = TCPStore(host, port, is_master=True, wait_for_workers=False,
                              timeout=timedelta(seconds=timeout_s))

    @property
    def port(self) -> int:
        """The port listened on."""
        return int(self.store.port)

    def cursor_state(self, n_samples: int, chunk_size: int, seed: int) -> dict[str, Any]:
        """The global cursor's state, for the job's checkpoint."""
        from labswarm.train.distributed.cursor import GlobalCursor

        return GlobalCursor(self.store, n_samples, chunk_size, owner="coordinator", seed=seed).state_dict()

    def restore_cursor(self, state: Mapping[str, Any]) -> None:
        """Write a checkpointed cursor state into this (new) coordinator's store."""
        from labswarm.train.distributed.cursor import GlobalCursor

        GlobalCursor(self.store, int(state["n_samples"]), int(state["chunk_size"]), owner="coordinator",
                     seed=int(state["seed"])).load_state_dict(state)
