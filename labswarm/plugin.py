"""The shared base of pluggable parts configured from YAML: a ``name`` plus a pydantic config model.

A YAML item ``{name: pitch_shift, semitones: 2}`` is validated by the config model of the class registered as
``pitch_shift``; errors keep their location (``transformations.1.semitones``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from labswarm.errors import ConfigError
from labswarm.registry import Registry


class PluginConfig(BaseModel):
    """Base of every plugin's config model: frozen, unknown keys rejected, ``name`` selects the class."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str


#: A plugin config model.
P = TypeVar("P", bound=PluginConfig)


def validate_plugin_specs(items: Any, registry: Registry, title: str) -> list[PluginConfig]:
    """Validate a list of ``{name: ..., **params}`` mappings against ``registry``.

    Meant to be called from a pydantic ``mode="before"`` field validator: raises a ``ValidationError`` whose
    locations are ``(index, field)``, which pydantic prefixes with the field name.

    Raises:
        pydantic.ValidationError: an item is not a mapping, names an unknown class, or has invalid params.
    """
    if isinstance(items, Mapping) or not isinstance(items, Sequence) or isinstance(items, str):
        raise ValueError(f"must be a list of {registry.kind}s, each a mapping with a `name`")
    out: list[PluginConfig] = []
    errors: list[InitErrorDetails] = []
    for index, item in enumerate(items):
        if isinstance(item, PluginConfig):
            out.append(item)
            continue
        if not isinstance(item, Mapping):
            errors.append(_error((index,), f"must be a mapping with a `name`, got {type(item).__name__}", item))
            continue
        name = item.get("name")
        if not isinstance(name, str) or name not in registry:
            known = ", ".join(registry.names())
            errors.append(_error((index, "name"), f"unknown {registry.kind} {name!r}; known: {known}", name))
            continue
        model: type[PluginConfig] = registry.get(name).config_model
        try:
            out.append(model.model_validate(dict(item)))
        except ValidationError as exc:
            for err in exc.errors():
                errors.append(_error((index, *err["loc"]), err["msg"], err.get("input")))
    if errors:
        raise ValidationError.from_exception_data(title, errors)
    return out


def configs_of(specs: Sequence[PluginConfig], model: type[P], registry: Registry) -> list[P]:
    """``specs`` (from :func:`validate_plugin_specs`) as instances of ``model``, the base config model every class
    of ``registry`` configures itself with (:class:`~labswarm.audio.features.base.FeatureConfig` for the feature
    extractors).

    Raises:
        ValueError: a spec is not a ``model`` (a plugin whose config model breaks its registry's contract).
    """
    out: list[P] = []
    for index, spec in enumerate(specs):
        if not isinstance(spec, model):
            raise ValueError(f"item {index}: the config of {registry.kind} {spec.name!r} is a "
                             f"{type(spec).__name__}, not a {model.__name__}")
        out.append(spec)
    return out


def validate_plugin_spec(item: Any, registry: Registry, title: str) -> PluginConfig:
    """Validate one ``{name: ..., **params}`` mapping against ``registry`` (the single-item form of
    :func:`validate_plugin_specs`: error locations are the fields, without a list index).

    Raises:
        pydantic.ValidationError: not a mapping, an unknown name, or invalid params.
    """
    try:
        return validate_plugin_specs([item], registry, title)[0]
    except ValidationError as exc:
        errors = [_error(tuple(e["loc"][1:]), e["msg"], e.get("input")) for e in exc.errors()]
        raise ValidationError.from_exception_data(title, errors) from None


def build_plugin(registry: Registry, spec: Mapping[str, Any] | PluginConfig) -> Any:
    """An instance of the class registered under the spec's ``name``, configured by the spec.

    Args:
        registry: where the class is registered.
        spec: ``{name: ..., **params}`` or an already validated config.

    Raises:
        ConfigError: unknown name (the message lists the known names) or invalid parameters (with their paths).
    """
    if isinstance(spec, PluginConfig):
        return registry.get(spec.name)(spec)
    name = spec.get("name") if isinstance(spec, Mapping) else None
    impl = registry.get(str(name))
    try:
        config = impl.config_model.model_validate(dict(spec))
    except ValidationError as exc:
        raise ConfigError([(".".join(map(str, e["loc"])), e["msg"]) for e in exc.errors()], source=f"{name}") from None
    return impl(config)


def _error(loc: tuple[int | str, ...], message: str, value: Any) -> InitErrorDetails:
    return InitErrorDetails(
        type=PydanticCustomError("plugin_config", "{reason}", {"reason": message}),
        loc=loc,
        input=value,
    )
