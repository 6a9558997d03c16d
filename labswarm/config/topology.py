"""SINGA's cluster topology: worker groups and server groups (Ooi et al., "SINGA: A Distributed Deep Learning
Platform", ACM MM 2015, DOI 10.1145/2733373.2807410; Wang et al., "SINGA: Putting Deep Learning in the Hands of
Multimedia Users", ACM MM 2015), as a distributed framework's ``topology``::

    framework:
      topology: {worker_groups: 2, workers_per_group: 2, server_groups: 1, shards_per_group: 2, colocated: false}

Workers form worker groups: the workers of one group share a model replica and compute its update synchronously;
groups run asynchronously to each other. Servers form server groups, each holding a whole replica of the
parameters cut into ``shards_per_group`` shards and serving some worker groups (``serves``); neighbouring server
groups synchronise every ``sync_period`` steps. A worker is a learner process; a server shard is either a
parameter-server process (``colocated: false``, SINGA's ``server_worker_separate: true``) or lives in a worker's
process (``colocated: true``: the replica is held by the workers themselves).

The four frameworks of SINGA's paper are settings of it (:data:`PRESETS`, one function per framework, each
citing the panel of SINGA's figure of training frameworks that draws it); labswarm's named frameworks resolve to
their topology (:func:`preset`), and a topology resolves to the named framework that runs it
(:func:`implementing`). The figure is cited by its caption, "Training frameworks in SINGA", panels (a)-(d), as
SINGA's "Distributed Training Framework" page (v0.3) draws it with the same cluster settings as here.

Torch-free (the config layer): a manager validates a topology without the trainer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from labswarm.errors import ConfigError

#: The most processes of one kind a topology may name (a sanity bound, not a tested scale).
MAX_PROCESSES = 1024


class Topology(BaseModel):
    """A cluster topology (module docstring). Frozen; unknown keys are refused.

    Attributes:
        worker_groups: worker groups (>= 1); SINGA's ``nworker_groups``.
        workers_per_group: learners in each group (>= 1); SINGA's ``nworkers_per_group``. The job's learners
            are ``worker_groups × workers_per_group``; group ``g`` is ranks ``g·w … g·w + w - 1``.
        server_groups: server groups (>= 1, at most ``worker_groups``: each serves at least one worker group);
            SINGA's ``nserver_groups``. Default 1.
        shards_per_group: the shards one server group's replica is cut into; SINGA's ``nservers_per_group``.
            Colocated: one per worker of the worker groups it serves (the default); separate: parameter-server
            processes (default 1).
        colocated: the shards live in the workers' processes (SINGA's ``server_worker_separate: false``, its
            default); ``false``: separate parameter-server processes.
        serves: ``serves[i]``: the worker groups server group ``i`` serves; every worker group exactly once.
            Default: consecutive blocks of ``worker_groups / server_groups`` worker groups.
        sync_period: steps between two synchronisations of neighbouring server groups (>= 1); required with 2 or
            more server groups, refused with one.

    Raises:
        pydantic.ValidationError: a bad combination, located at the field that breaks it (``shards_per_group``,
            ``serves.1``, ``sync_period``); a manifest reports it as ``framework.topology.<field>``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    worker_groups: int = Field(ge=1, le=MAX_PROCESSES)
    workers_per_group: int = Field(ge=1, le=MAX_PROCESSES)
    server_groups: int = Field(1, ge=1, le=MAX_PROCESSES)
    shards_per_group: int | None = Field(None, ge=1, le=MAX_PROCESSES)
    colocated: bool = True
    serves: list[list[int]] | None = None
    sync_period: int | None = Field(None, ge=1, le=10**9)

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, value: Any) -> Any:
        """Fill ``serves`` and ``shards_per_group`` so that the resolved topology shows them."""
        if not isinstance(value, Mapping):
            return value
        data = dict(value)
        groups, servers = data.get("worker_groups"), data.get("server_groups", 1)
        if data.get("serves") is None and _ints(groups, servers) and 1 <= servers <= groups \
                and groups % servers == 0:
            block = groups // servers
            data["serves"] = [list(range(i * block, (i + 1) * block)) for i in range(servers)]
        if data.get("shards_per_group") is None:
            if not data.get("colocated", True):
                data["shards_per_group"] = 1
            elif _ints(data.get("workers_per_group")) and isinstance(data.get("serves"), list) \
                    and data["serves"] and isinstance(data["serves"][0], list):
                data["shards_per_group"] = data["workers_per_group"] * len(data["serves"][0])
        return data

    @model_validator(mode="after")
    def _combination(self) -> Topology:
        errors: list[tuple[str, str]] = []
        if self.learners > MAX_PROCESSES:
            errors.append(("workers_per_group", f"{self.worker_groups} groups × {self.workers_per_group} = "
                                                f"{self.learners} learners; at most {MAX_PROCESSES}"))
        if self.server_groups > self.worker_groups:
            errors.append(("server_groups", f"{self.server_groups} server groups for {self.worker_groups} worker "
                                            "groups: each server group serves at least one worker group"))
        elif self.serves is None:
            errors.append(("serves", f"{self.server_groups} server groups do not divide {self.worker_groups} "
                                     "worker groups: say which serves which (serves: [[0, 1], [2]])"))
        else:
            errors += _serves_problems(self.serves, self.worker_groups, self.server_groups)
        if self.server_groups > 1 and self.sync_period is None:
            errors.append(("sync_period", f"{self.server_groups} server groups synchronise with their neighbours "
                                          "every sync_period steps: give it"))
        if self.server_groups == 1 and self.sync_period is not None:
            errors.append(("sync_period", "only with 2 or more server groups (one server group has no "
                                          "neighbour to synchronise with)"))
        if self.colocated and self.serves is not None and not errors:
            sizes = {len(s) for s in self.serves}
            wanted = {n * self.workers_per_group for n in sizes}
            if wanted != {self.shards}:
                errors.append(("shards_per_group", f"colocated: one shard per worker a server group serves "
                                                   f"({' or '.join(map(str, sorted(wanted)))}), got "
                                                   f"{self.shards}"))
        if errors:
            raise ValidationError.from_exception_data("topology", [
                InitErrorDetails(type=PydanticCustomError("topology", "{reason}", {"reason": reason}),
                                 loc=tuple(int(p) if p.isdigit() else p for p in field.split(".")), input=None)
                for field, reason in errors])
        return self

    @property
    def shards(self) -> int:
        """``shards_per_group`` (filled in by validation)."""
        assert self.shards_per_group is not None, "filled in by validation"
        return self.shards_per_group

    @property
    def learners(self) -> int:
        """Learner processes: ``worker_groups × workers_per_group``."""
        return self.worker_groups * self.workers_per_group

    @property
    def ps_shards(self) -> int:
        """Parameter-server processes the job deploys: ``server_groups × shards_per_group`` when separate, else 0."""
        return 0 if self.colocated else self.server_groups * self.shards

    def describe(self) -> str:
        """One line: ``2 worker groups × 2, 1 server group × 2 shards (separate)``."""
        servers = (f"{self.server_groups} server group{'s' if self.server_groups > 1 else ''} × {self.shards} "
                   f"shard{'s' if self.shards > 1 else ''} ({'colocated' if self.colocated else 'separate'})")
        sync = f", sync every {self.sync_period} steps" if self.sync_period else ""
        return (f"{self.worker_groups} worker group{'s' if self.worker_groups > 1 else ''} × "
                f"{self.workers_per_group}, {servers}{sync}")


def _ints(*values: Any) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) for v in values)


def _serves_problems(serves: list[list[int]], worker_groups: int, server_groups: int) -> list[tuple[str, str]]:
    """``serves`` must cut the worker groups ``0 … worker_groups - 1`` into ``server_groups`` non-empty parts."""
    if len(serves) != server_groups:
        return [("serves", f"one list per server group: {server_groups} expected, got {len(serves)}")]
    errors, seen = [], set()
    for i, groups in enumerate(serves):
        if not groups:
            errors.append((f"serves.{i}", "a server group serves at least one worker group"))
        for g in groups:
            if not 0 <= g < worker_groups:
                errors.append((f"serves.{i}", f"worker group {g} does not exist (0 … {worker_groups - 1})"))
            elif g in seen:
                errors.append((f"serves.{i}", f"worker group {g} is served by two server groups"))
            seen.add(g)
    missing = sorted(set(range(worker_groups)) - seen)
    if missing and not errors:
        errors.append(("serves", f"worker groups {missing} are served by no server group"))
    return errors


def allreduce(learners: int, shards: int | None = None, **_: Any) -> Topology:
    """SINGA's AllReduce (synchronous; Baidu's DeepImage): one worker group of all learners and one server group
    whose shards are bound one to each worker, in the workers' processes (Ooi et al. 2015, the figure "Training
    frameworks in SINGA", panel (b) AllReduce). labswarm runs it as torch DDP's ring all-reduce
    (:mod:`labswarm.train.distributed.frameworks.allreduce`)."""
    return Topology(worker_groups=1, workers_per_group=learners)


def sandblaster(learners: int, shards: int | None = None, **_: Any) -> Topology:
    """SINGA's Sandblaster (synchronous; Dean et al. 2012): one worker group of all learners, one server group of
    ``shards`` separate shards handling every request (Ooi et al. 2015, the figure "Training frameworks in
    SINGA", panel (a) Sandblaster)."""
    return Topology(worker_groups=1, workers_per_group=learners, shards_per_group=shards or 1, colocated=False)


def downpour(learners: int, shards: int | None = None, group_size: int = 1, **_: Any) -> Topology:
    """SINGA's Downpour (asynchronous; Dean et al. 2012): ``learners / group_size`` worker groups of
    ``group_size``, all served by one server group of ``shards`` separate shards (Ooi et al. 2015, the figure
    "Training frameworks in SINGA", panel (c) Downpour)."""
    return Topology(worker_groups=max(learners // group_size, 1), workers_per_group=group_size,
                    shards_per_group=shards or 1, colocated=False)


def distributed_hogwild(learners: int, shards: int | None = None, sync_period: int = 4, group_size: int = 1,
                        **_: Any) -> Topology:
    """SINGA's Distributed Hogwild (asynchronous; Caffe): one worker group of one learner per node, each with its
    own server group in its process, neighbouring server groups synchronised every ``sync_period`` steps (Ooi et
    al. 2015, the figure "Training frameworks in SINGA", panel (d) Distributed Hogwild); labswarm's
    ``distributed_hogwild`` (:mod:`labswarm.train.distributed.frameworks.hogwild`). With ``group_size`` > 1 the
    hybrid of panels (b) and (d): ``learners / group_size`` worker groups of ``group_size``, each with its own
    colocated server group (AllReduce inside a group, Distributed Hogwild between the groups)."""
    groups = max(learners // group_size, 1)
    return Topology(worker_groups=groups, workers_per_group=group_size, server_groups=groups,
                    sync_period=sync_period if groups > 1 else None)


def model_averaging(learners: int, shards: int | None = None, period: int = 4, **_: Any) -> Topology:
    """``model_averaging`` (post-local SGD; not one of SINGA's four): Distributed Hogwild's topology (panel (d)),
    ``sync_period`` = ``period``, but every replica is averaged at once and synchronously (torch's
    ``PeriodicModelAverager``), not with its neighbour asynchronously."""
    return distributed_hogwild(learners, shards, sync_period=period)


def easgd(learners: int, shards: int | None = None, **_: Any) -> Topology:
    """EASGD (Zhang, Choromanska & LeCun 2015; not one of SINGA's four): Downpour's topology, one learner per
    worker group and one server group of ``shards`` separate shards holding the center variable."""
    return Topology(worker_groups=learners, workers_per_group=1, shards_per_group=shards or 1, colocated=False)


#: The named distributed frameworks and the topology each runs: ``f(learners, shards, **parameters)``.
PRESETS: dict[str, Callable[..., Topology]] = {
    "allreduce": allreduce,
    "sandblaster": sandblaster,
    "downpour": downpour,
    "distributed_hogwild": distributed_hogwild,
    "model_averaging": model_averaging,
    "easgd": easgd,
}


def preset(name: str, learners: int, shards: int | None, parameters: Mapping[str, Any]) -> Topology:
    """The topology framework ``name`` with ``parameters`` runs with ``learners`` learners and ``shards``
    parameter-server shards (``None``: its default, 1).

    Raises:
        KeyError: ``name`` is not a distributed framework.
    """
    wanted = ("group_size", "period", "sync_period")
    return PRESETS[name](learners, shards, **{k: v for k, v in parameters.items() if k in wanted})


def implementing(topology: Topology) -> tuple[str, dict[str, Any]]:
    """The named framework that runs ``topology`` and the parameters it implies (``group_size``, ``sync_period``);
    Distributed Hogwild's topology is ``distributed_hogwild``'s (``model_averaging`` runs it too, when named).

    Raises:
        ConfigError: no framework runs it yet, naming the field (under ``topology``) that rules them out.
    """
    t = topology
    if t.server_groups == 1 and not t.colocated:
        return ("sandblaster", {}) if t.worker_groups == 1 else ("downpour", {"group_size": t.workers_per_group})
    if t.server_groups == 1 and t.worker_groups == 1:
        return "allreduce", {}
    if t.colocated and t.server_groups == t.worker_groups:  # groups of 1: SINGA's; of more: the hybrid
        return "distributed_hogwild", {"sync_period": t.sync_period, "group_size": t.workers_per_group}
    if t.server_groups == 1:
        _unsupported("colocated", f"{t.worker_groups} worker groups sharing one colocated server group "
                                  "(asynchronous groups over an all-reduce) run under no framework yet: "
                                  "colocated: false (downpour) or 1 worker group (allreduce)")
    if not t.colocated:
        _unsupported("server_groups", f"{t.server_groups} separate server groups run under no framework yet: one "
                                      "server group, or colocated ones (one per worker group)")
    _unsupported("server_groups", f"{t.server_groups} colocated server groups for {t.worker_groups} worker groups "
                                  "(a server group serving several asynchronous groups) run under no framework yet: "
                                  "one server group per worker group")


def _unsupported(field: str, reason: str) -> NoReturn:
    raise ConfigError([(f"topology.{field}", reason)])
