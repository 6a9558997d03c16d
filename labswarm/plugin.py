"""The shared base of pluggable parts configured from YAML: a ``name`` plus a pydantic config model.

A YAML item ``{name: pitch_shift, semitones: 2}`` is validated by the config model of the class registered as
``pitch_shift``; errors keep their location (``transformations.1.semitones``).
"""

from __future__ import annotations

import difflib
import types
import typing
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
            for loc, reason in field_errors(exc, model):
                errors.append(_error((index, *loc), reason, None))
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


def field_errors(exc: ValidationError, model: type[BaseModel]) -> list[tuple[tuple[int | str, ...], str]]:
    """``(location, reason)`` of each error of ``exc`` (raised validating ``model``), where an unknown key says
    so in the user's terms, with the closest known key when one is close (a misspelling) and the known keys:
    ``unknown key 'smaple_rate': did you mean 'sample_rate'? (known: root, labels, sample_rate, segment)``.
    A "missing" error of the key an unknown one is a misspelling of is dropped (the suggestion says it)."""
    out: list[tuple[tuple[int | str, ...], str]] = []
    suggested: set[tuple[int | str, ...]] = set()
    for error in exc.errors():
        loc, reason = tuple(error["loc"]), error["msg"]
        if error["type"] == "extra_forbidden" and loc and isinstance(loc[-1], str):
            known = list(fields) if (fields := _fields_at(model, loc[:-1])) is not None else []
            close = difflib.get_close_matches(loc[-1], known, n=1, cutoff=0.6)
            reason = f"unknown key {loc[-1]!r}" + (f": did you mean {close[0]!r}?" if close else "")
            reason += f" (known: {', '.join(known)})" if known else ""
            if close:
                suggested.add((*loc[:-1], close[0]))
        out.append((loc, reason))
    missing = {tuple(e["loc"]) for e in exc.errors() if e["type"] == "missing"}
    return [(loc, reason) for loc, reason in out if not (loc in suggested and loc in missing)]


def _fields_at(model: type[BaseModel], loc: Sequence[int | str]) -> dict[str, Any] | None:
    """The fields of the model found at ``loc`` inside ``model`` (list items, optional and annotated types
    followed), or ``None`` when it is not a model (e.g. a plugin's config, validated by its own class)."""
    current: Any = model
    for part in loc:
        current = _inner(current, part)
        if current is None:
            return None
    current = _inner(current, None)
    return dict(current.model_fields) if isinstance(current, type) and issubclass(current, BaseModel) else None


def _inner(annotation: Any, part: int | str | None) -> Any:
    """The type one step down ``annotation`` along ``part`` (a field name, a list index; ``None``: no step)."""
    while True:
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        if origin is typing.Annotated:
            annotation = args[0]
        elif origin in (typing.Union, types.UnionType):
            options = [a for a in args if a is not type(None)]
            if len(options) != 1:
                return None
            annotation = options[0]
        else:
            break
    if part is None:
        return annotation
    if isinstance(part, int):
        return args[0] if origin in (list, tuple, Sequence) and args else None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel) and part in annotation.model_fields:
        return annotation.model_fields[part].annotation
    return None
