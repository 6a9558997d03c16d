"""What runs in a job's learners: the ``framework`` section of a manifest (:mod:`labswarm.config.manifest`).

``labswarm`` (our trainer, one learner), ``command`` (any program, the DLaaS ``train.sh`` route), or a distributed
framework (``allreduce``, ``model_averaging``, ``sandblaster``, ``downpour``, ``easgd``: our trainer in
``learners: N`` processes, :mod:`labswarm.train.distributed`), chosen by ``name``, or by the SINGA cluster
``topology`` it runs (:mod:`labswarm.config.topology`): a distributed framework resolves to its topology, and a
topology alone to the framework that runs it.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from labswarm.config.topology import Topology, implementing, preset
from labswarm.errors import ConfigError
from labswarm.plugin import field_errors
from labswarm.registry import FRAMEWORKS


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MetricsSource(_Strict):
    """Where a ``command`` learner's metrics come from: exactly one of the two.

    Attributes:
        jsonl: a JSON-lines file the program writes, one object per record (``{"epoch": 1, "loss": 0.4}``);
            relative to the learner's working folder (no ``..``, not absolute).
        regex: ``{metric: pattern}`` searched in each line of the program's stdout; the value is the pattern's
            group named ``value``, or its only group.
    """

    jsonl: str | None = None
    regex: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.]{0,63}$")], str] | None = None

    @field_validator("jsonl")
    @classmethod
    def _jsonl(cls, value: str | None) -> str | None:
        if value is not None:
            path = PurePosixPath(value)
            if not value or path.is_absolute() or ".." in path.parts:
                raise ValueError("must be a relative path inside the learner's folder (no '..')")
        return value

    @field_validator("regex")
    @classmethod
    def _regex(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("name at least one metric")
        errors = []
        for metric, pattern in value.items():
            try:
                compiled = re.compile(pattern)
            except re.error as exc:
                errors.append(((metric,), f"invalid regular expression: {exc}"))
                continue
            if "value" not in compiled.groupindex and compiled.groups != 1:
                errors.append(((metric,), f"needs a group named `value` or exactly one group, has "
                                          f"{compiled.groups}"))
        if errors:
            raise _validation_error("regex", errors)
        return value

    @model_validator(mode="after")
    def _one_source(self) -> MetricsSource:
        if (self.jsonl is None) == (self.regex is None):
            raise ValueError("give exactly one of `jsonl` and `regex`")
        return self


class LabswarmFramework(_Strict):
    """``framework: {name: labswarm}``: labswarm's own trainer runs in the learner."""

    name: Literal["labswarm"] = "labswarm"


class CommandFramework(_Strict):
    """``framework: {name: command, ...}``: any learner program (the DLaaS ``train.sh`` route). It runs with the
    data and results locations in its environment.

    Attributes:
        command: the program: a list is the argv, run without a shell; a string is a shell command line, stored
            as ``["sh", "-c", string]``.
        metrics: where its metrics come from; ``None``: it reports none.
    """

    name: Literal["command"]
    command: list[Annotated[str, Field(min_length=1)]] = Field(min_length=1)
    metrics: MetricsSource | None = None

    @field_validator("command", mode="before")
    @classmethod
    def _command(cls, value: Any) -> Any:
        if isinstance(value, str):
            if not value.strip():
                raise ValueError("must not be empty")
            try:
                shlex.split(value)
            except ValueError as exc:
                raise ValueError(f"is not a valid shell command line: {exc}") from None
            return ["sh", "-c", value]
        return value


#: The distributed frameworks (:mod:`labswarm.train.distributed.frameworks`) a job of ``learners: N`` (N >= 2) may name.
DISTRIBUTED_FRAMEWORKS = ("allreduce", "model_averaging", "sandblaster", "downpour", "easgd", "distributed_hogwild")


class DistributedFramework(BaseModel):
    """``framework: {name: allreduce | model_averaging | sandblaster | downpour | easgd | distributed_hogwild,
    ...its parameters, topology: {...}}``: our trainer in distributed mode
    (:mod:`labswarm.train.distributed.training`), ``learners`` of it. The parameters are validated by the
    framework's own config model (:data:`labswarm.train.distributed.FRAMEWORKS`), each error naming its field
    (``framework.tau``); the validated parameters, defaults filled in, are kept.

    ``topology`` (:class:`~labswarm.config.topology.Topology`, SINGA's worker and server groups) may replace the
    name: ``{topology: {worker_groups: 1, workers_per_group: 2}}`` is ``allreduce`` with 2 learners
    (:func:`~labswarm.config.topology.implementing` picks the framework and its ``group_size`` / ``sync_period``).
    Given with a name, it must be the one that framework runs (:func:`~labswarm.config.topology.preset`), else
    the error names the first field that differs (``framework.topology.workers_per_group``). Given neither
    way, a job fills it in from its ``learners`` and ``ps_shards`` (:meth:`resolve`), so that the job's resolved
    manifest shows it.

    Attributes:
        name: the framework.
        topology: the cluster topology it runs; ``None`` until a job resolves it.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    name: Literal["allreduce", "model_averaging", "sandblaster", "downpour", "easgd", "distributed_hogwild"]
    topology: Topology | None = None

    @model_validator(mode="before")
    @classmethod
    def _parameters(cls, value: Any) -> Any:
        if not isinstance(value, Mapping):
            return value
        data = dict(value)
        name = data.get("name")
        if name not in (None, *DISTRIBUTED_FRAMEWORKS) or (name is None and data.get("topology") is None):
            known = ", ".join(("labswarm", "command", *DISTRIBUTED_FRAMEWORKS))
            reason = f"unknown framework {name!r}" if name is not None else "give a framework's name"
            raise _validation_error("framework", [(("name",), f"{reason}; known: {known} (or a distributed "
                                                             "framework's topology)")])
        if data.get("topology") is not None:
            data = _with_topology(data)
        model = FRAMEWORKS.get(data["name"]).config_model
        try:
            return model.model_validate(data).model_dump(mode="json")
        except ValidationError as exc:
            raise _validation_error("framework", field_errors(exc, model)) from None

    def learners_problem(self, learners: int, ps_shards: int | None = None) -> tuple[str, str] | None:
        """``(parameter, reason)`` when the parameters do not fit a job of ``learners`` learners and ``ps_shards``
        shards (the framework's :meth:`~labswarm.train.distributed.frameworks.base.Framework.check_learners`, e.g.
        ``downpour``'s ``group_size`` must divide it; a ``topology`` of another number of learners or shards),
        else ``None``."""
        topology = self.topology
        if topology is not None and topology.learners != learners:
            return "topology.worker_groups", (f"{topology.describe()}: {topology.learners} learners, but the job "
                                              f"has learners: {learners}")
        if topology is not None and ps_shards is not None and topology.ps_shards not in (0, ps_shards):
            return "topology.shards_per_group", (f"{topology.describe()}: {topology.ps_shards} parameter-server "
                                                 f"shards, but the job has ps_shards: {ps_shards}")
        spec = self.model_dump(mode="json")
        try:
            FRAMEWORKS.get(self.name).from_spec(spec).check_learners(learners)
        except ConfigError as exc:
            path, reason = exc.errors[0]
            return path.removeprefix("framework.") or "name", reason
        return None

    def batch_problem(self, learners: int, batch_size: int) -> tuple[str, str] | None:
        """``(field, reason)`` when the framework cannot split an experiment's batch of ``batch_size`` samples
        across ``learners`` learners (``batch: global`` and a size that does not divide:
        :meth:`~labswarm.train.distributed.frameworks.base.Framework.learner_batch`), else ``None``."""
        try:
            FRAMEWORKS.get(self.name).from_spec(self.model_dump(mode="json")).learner_batch(batch_size, learners)
        except ConfigError as exc:
            return exc.errors[0]
        return None

    def resolve(self, learners: int, ps_shards: int | None = None) -> DistributedFramework:
        """This framework with its topology for ``learners`` learners and ``ps_shards`` shards (``None``: the
        default, 1) filled in: itself when it has one (:meth:`learners_problem` checks that it fits)."""
        if self.topology is not None:
            return self
        topology = preset(self.name, learners, ps_shards, self.model_dump(mode="json"))
        return self.model_copy(update={"topology": topology})

    @property
    def ps_shards(self) -> int | None:
        """The parameter-server shards its topology names (``None``: no topology yet)."""
        return None if self.topology is None else self.topology.ps_shards

    @property
    def needs_parameter_server(self) -> bool:
        """Whether the lifecycle deploys parameter-server shards for it (``sandblaster``, ``downpour``,
        ``easgd``)."""
        return bool(FRAMEWORKS.get(self.name).needs_parameter_server)


#: The topology fields a framework parameter sets (``downpour``'s ``group_size``, ``model_averaging``'s ``period``,
#: ``distributed_hogwild``'s ``sync_period``).
_PARAMETER_OF = {"workers_per_group": ("group_size",), "sync_period": ("period", "sync_period")}


def _with_topology(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with its ``topology`` validated, its ``name`` (when absent) and the parameters the topology implies
    (``group_size``, ``period``, when absent) filled in.

    Raises:
        pydantic.ValidationError: an invalid topology, one no framework runs yet, or one the named framework
            does not run; located under ``topology`` (or at the parameter that contradicts it).
    """
    try:
        topology = Topology.model_validate(data["topology"])
    except ValidationError as exc:
        raise _validation_error("framework", [(("topology", *loc), why) for loc, why in field_errors(exc, Topology)]
                                ) from None
    try:
        runs, implied = implementing(topology)
    except ConfigError as exc:
        raise _validation_error("framework", [(tuple(exc.errors[0][0].split(".")), exc.errors[0][1])]) from None
    name, given = data.get("name") or runs, set(data)
    if name == runs:
        data = {**implied, **data}
    elif name == "model_averaging" and topology.sync_period is not None:  # Distributed Hogwild's topology
        data = {"period": topology.sync_period, **data}
    expected = preset(name, topology.learners, topology.ps_shards or None, data)
    if expected != topology:
        fields = [f for f in Topology.model_fields if getattr(expected, f) != getattr(topology, f)]
        parameters = [p for f in fields for p in _PARAMETER_OF.get(f, ()) if p in given]
        field = fields[0]
        where = (parameters[0],) if parameters else ("topology", field)
        raise _validation_error("framework", [(where, f"{name} runs {expected.describe()}, not "
                                                      f"{topology.describe()} ({field} differs)")])
    return {**data, "name": name, "topology": topology.model_dump(mode="json")}


def _framework_tag(value: Any) -> str:
    """The union member a ``framework`` value is: ``labswarm``, ``command``, or ``distributed`` (any other name,
    which :class:`DistributedFramework` refuses when unknown, or none: a topology, or an error naming ``name``)."""
    if isinstance(value, Mapping):
        name = value.get("name")
        if name in ("labswarm", "command"):
            return str(name)
        return "distributed"
    if isinstance(value, LabswarmFramework | CommandFramework):
        return value.name
    return "distributed"  # a DistributedFramework, or what is none (refused as not a mapping, at `framework`)


#: ``framework``: one of the frameworks, chosen by ``name`` (or, for a distributed one, by its ``topology``).
Framework = Annotated[
    Annotated[LabswarmFramework, Tag("labswarm")] | Annotated[CommandFramework, Tag("command")]
    | Annotated[DistributedFramework, Tag("distributed")],
    Discriminator(_framework_tag),
]

#: The discriminator values pydantic inserts in error locations after ``framework`` (removed from paths).
_FRAMEWORK_TAGS = frozenset({"labswarm", "command", "distributed", *DISTRIBUTED_FRAMEWORKS})


def _validation_error(title: str, errors: Sequence[tuple[tuple[str | int, ...], str]]) -> ValidationError:
    """A ValidationError with these ``(location, message)`` pairs; raised in a validator, pydantic prefixes the
    locations with the field's. Inputs are left out so no value (a secret) rides along."""
    return ValidationError.from_exception_data(title, [
        InitErrorDetails(type=PydanticCustomError("manifest", "{reason}", {"reason": message}), loc=loc, input=None)
        for loc, message in errors
    ])
