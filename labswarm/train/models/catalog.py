"""What models are installed (``labswarm models list``): each one's name, the package it comes from, its input
and its parameters with their defaults."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, packages_distributions, version
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from labswarm.train.models.base import MODELS


@dataclass(frozen=True)
class Parameter:
    """One parameter of a model's config.

    Attributes:
        name: its key in the ``model`` section.
        type: its type, as annotated.
        default: its default, ``None`` with ``required``.
        required: the section must give it.
        constraints: pydantic's bounds and patterns, in words (``ge=1``), comma-separated; ``""``: none.
    """

    name: str
    type: str
    default: Any
    required: bool
    constraints: str


@dataclass(frozen=True)
class ModelInfo:
    """An installed model.

    Attributes:
        name: its name in the ``model`` section.
        source: the distribution that provides it and its version (``labswarm 0.1.0``), or its module.
        cls: the class's ``module:qualname``.
        input: the feature it reads by default (``""``: the section must say).
        parameters: its config's fields besides ``name``.
    """

    name: str
    source: str
    cls: str
    input: str
    parameters: tuple[Parameter, ...]


def installed_models() -> list[ModelInfo]:
    """Every registered model (built-ins and the ``labswarm.models`` entry points), sorted by name.

    Raises:
        ConfigError: an installed plugin fails to load (:meth:`labswarm.registry.Registry.load`).
    """
    distributions = packages_distributions()
    out = []
    for name in MODELS.names():
        cls = MODELS.get(name)
        fields = cls.config_model.model_fields
        parameters = tuple(_parameter(key, field) for key, field in fields.items() if key not in ("name", "input"))
        default_input = fields["input"].default if "input" in fields else PydanticUndefined
        out.append(ModelInfo(name=name, source=_source(cls.__module__, distributions),
                             cls=f"{cls.__module__}:{cls.__qualname__}",
                             input="" if default_input is PydanticUndefined else str(default_input),
                             parameters=parameters))
    return out


def _parameter(key: str, field: FieldInfo) -> Parameter:
    required = field.is_required()
    default = None if required else field.get_default(call_default_factory=True)
    annotation = field.annotation
    type_name = annotation.__name__ if isinstance(annotation, type) else None  # int; list[int] is no type
    constraints = ", ".join(_constraint(m) for m in field.metadata)
    return Parameter(key, type_name or str(annotation).replace("typing.", ""), default, required, constraints)


#: annotated-types' bounds as operators.
_BOUNDS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<", "min_length": "length >=", "max_length": "length <=",
           "multiple_of": "multiple of", "pattern": "matches"}


def _constraint(metadata: Any) -> str:
    """``ge=1`` as ``>= 1``; ``pattern='…'`` as ``matches '…'``."""
    parts = [f"{_BOUNDS[k]} {v!r}" for k, v in vars(metadata).items() if k in _BOUNDS and v is not None] if hasattr(
        metadata, "__dict__") else []
    parts += [f"{_BOUNDS[k]} {getattr(metadata, k)!r}" for k in getattr(metadata, "__slots__", ()) if k in _BOUNDS]
    return ", ".join(parts) or str(metadata)


def _source(module: str, distributions: Mapping[str, list[str]]) -> str:
    """``"<distribution> <version>"`` of the package that holds ``module``, else the module's name."""
    for dist in distributions.get(module.split(".", 1)[0], []):
        try:
            return f"{dist} {version(dist)}"
        except PackageNotFoundError:
            continue
    return module
