"""A registry of pluggable classes keyed by their ``name`` (transformations, feature extractors, ...)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from labswarm.errors import ConfigError

T = TypeVar("T", bound=type)


class Registry(Generic[T]):
    """Maps a name to a class; used as a decorator by each implementation.

    Args:
        kind: what is registered, in words (``"transformation"``), for error messages.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._classes: dict[str, T] = {}

    def register(self, cls: T) -> T:
        """Register ``cls`` under ``cls.name``.

        Raises:
            ValueError: the class has no ``name`` or the name is taken by another class.
        """
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not name:
            raise ValueError(f"{cls.__qualname__} has no `name` to register a {self.kind} under")
        existing = self._classes.get(name)
        if existing is not None and existing is not cls:
            raise ValueError(f"{self.kind} {name!r} is already registered by {existing.__qualname__}")
        self._classes[name] = cls
        return cls

    def get(self, name: str, *, path: str = "name") -> T:
        """The class registered as ``name``.

        Raises:
            ConfigError: unknown name; the message lists the known names.
        """
        try:
            return self._classes[name]
        except KeyError:
            known = ", ".join(sorted(self._classes)) or "none"
            raise ConfigError([(path, f"unknown {self.kind} {name!r}; known: {known}")]) from None

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._classes)

    def __contains__(self, name: object) -> bool:
        return name in self._classes

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._classes))

    def decorator(self) -> Callable[[T], T]:
        """The :meth:`register` method, for ``register_x = registry.decorator()``."""
        return self.register
