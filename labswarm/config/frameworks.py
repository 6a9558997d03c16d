"""What runs in a job's learners: the ``framework`` section of a manifest (:mod:`labswarm.config.manifest`).

``labswarm`` (our trainer, one learner), ``command`` (any program, the DLaaS ``train.sh`` route), or a distributed
framework (``allreduce``, ``model_averaging``, ``sandblaster``, ``downpour``, ``easgd``: our trainer in
``learners: N`` processes, :mod:`labswarm.train.distributed`), chosen by ``name``.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from labswarm.errors import ConfigError
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
DISTRIBUTED_FRAMEWORKS = ("allreduce", "model_averaging", "sandblaster", "downpour", "easgd")


class DistributedFramework(BaseModel):
    """``framework: {name: allreduce | model_averaging | sandblaster | downpour | easgd, ...its parameters}``: our
    trainer in distributed mode (:mod:`labswarm.train.distributed.training`), ``learners`` of it. The parameters are
    validated by the framework's own config model (:data:`labswarm.train.distributed.FRAMEWORKS`), each error naming its
    field (``framework.tau``); the validated parameters, defaults filled in, are kept.

    Attributes:
        name: the framework.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    name: Literal["allreduce", "model_averaging", "sandblaster", "downpour", "easgd"]

    @model_validator(mode="before")
    @classmethod
    def _parameters(cls, value: Any) -> Any:
        if not isinstance(value, Mapping) or value.get("name") not in DISTRIBUTED_FRAMEWORKS:
            return value
        model = FRAMEWORKS.get(value["name"]).config_model
        try:
            return model.model_validate(dict(value)).model_dump(mode="json")
        except ValidationError as exc:
            raise _validation_error("framework", [(tuple(e["loc"]), e["msg"]) for e in exc.errors()]) from None

    def learners_problem(self, learners: int) -> tuple[str, str] | None:
        """``(parameter, reason)`` when the parameters do not fit a job of ``learners`` learners (the framework's
        :meth:`~labswarm.train.distributed.frameworks.base.Framework.check_learners`, e.g. ``downpour``'s ``group_size``
        must divide it), else ``None``."""
        spec = self.model_dump(mode="json")
        try:
            FRAMEWORKS.get(self.name).from_spec(spec).check_learners(learners)
        except ConfigError as exc:
            path, reason = exc.errors[0]
            return path.removeprefix("framework.") or "name", reason
        return None

    @property
    def needs_parameter_server(self) -> bool:
        """Whether the lifecycle deploys parameter-server shards for it (``sandblaster``, ``downpour``,
        ``easgd``)."""
        return bool(FRAMEWORKS.get(self.name).needs_parameter_server)


#: ``framework``: one of the frameworks, chosen by ``name``.
Framework = Annotated[LabswarmFramework | CommandFramework | DistributedFramework, Field(discriminator="name")]

#: The discriminator values pydantic inserts in error locations after ``framework`` (removed from paths).
_FRAMEWORK_TAGS = frozenset({"labswarm", "command", *DISTRIBUTED_FRAMEWORKS})


def _validation_error(title: str, errors: Sequence[tuple[tuple[str | int, ...], str]]) -> ValidationError:
    """A ValidationError with these ``(location, message)`` pairs; raised in a validator, pydantic prefixes the
    locations with the field's. Inputs are left out so no value (a secret) rides along."""
    return ValidationError.from_exception_data(title, [
        InitErrorDetails(type=PydanticCustomError("manifest", "{reason}", {"reason": message}), loc=loc, input=None)
        for loc, message in errors
    ])
