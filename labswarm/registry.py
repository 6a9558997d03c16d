"""Registries of pluggable classes keyed by their ``name``, and the one list of every kind of plugin labswarm has.

A registry knows where its built-in classes live (a module path, imported on the first look-up) and which
entry-point group installed packages add to (``importlib.metadata`` entry points, loaded on the first look-up
too). So a schema can validate ``{name: cnn}`` against :data:`MODELS` without importing the models itself: the
layers stay one-way (a schema never imports the code it configures) and every "register the built-ins" import
is this module's job alone.

The registries (kind, built-ins module, entry-point group):

- :data:`TRANSFORMATIONS`: ``labswarm.audio.transforms``, ``labswarm.transformations``
- :data:`EXTRACTORS`: ``labswarm.audio.features``, ``labswarm.features``
- :data:`BLOCKS`: ``labswarm.pipeline.blocks``, ``labswarm.blocks``
- :data:`MODELS`: ``labswarm.train.models``, ``labswarm.models``
- :data:`FRAMEWORKS`: ``labswarm.train.distributed.frameworks``, ``labswarm.frameworks``
- :data:`STORAGES`: ``labswarm.storage``, ``labswarm.storages``
- :data:`CONTROLLERS`: ``labswarm.health.controllers``, ``labswarm.controllers``
- :data:`LAUNCHERS`: ``labswarm.deploy.platforms``, ``labswarm.launchers``
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar

from labswarm.errors import ConfigError

T = TypeVar("T", bound=type)


class Registry(Generic[T]):
    """Maps a name to a class; used as a decorator by each implementation.

    Args:
        kind: what is registered, in words (``"transformation"``), for error messages.
        builtins: the module whose import registers the built-in classes (imported on the first look-up);
            ``None``: none.
        group: the entry-point group whose entries (each a registered class, or a module that registers its
            classes when imported) are loaded on the first look-up; ``None``: none.
    """

    def __init__(self, kind: str, builtins: str | None = None, group: str | None = None) -> None:
        self.kind = kind
        self.builtins = builtins
        self.group = group
        self._classes: dict[str, T] = {}
        self._loaded = builtins is None and group is None
        self._loading = False
        self._lock = threading.RLock()

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

    def load(self) -> None:
        """Import the built-ins and the installed plugins of the entry-point group, once.

        Raises:
            ConfigError: an entry point fails to load (its name and the error are given).
        """
        if self._loaded:
            return
        with self._lock:
            if self._loaded or self._loading:  # loaded by another thread, or a look-up while this one loads
                return
            self._loading = True
            try:
                if self.builtins is not None:
                    importlib.import_module(self.builtins)
                for entry in entry_points(group=self.group) if self.group else ():
                    try:
                        loaded: Any = entry.load()
                    except Exception as exc:  # an installed package's fault: name it
                        raise ConfigError([(self.kind, f"the plugin {entry.name!r} ({entry.value}) failed to "
                                                       f"load: {type(exc).__name__}: {exc}")]) from exc
                    if isinstance(loaded, type):
                        self.register(loaded)  # type: ignore[arg-type]
            finally:
                self._loading = False
            self._loaded = True

    def refresh(self) -> None:
        """Look at the entry points again on the next look-up (a package installed while this process runs);
        the classes registered so far stay."""
        with self._lock:
            self._loaded = self.builtins is None and self.group is None

    def get(self, name: str, *, path: str = "name") -> T:
        """The class registered as ``name``.

        Raises:
            ConfigError: unknown name; the message lists the known names.
        """
        self.load()
        try:
            return self._classes[name]
        except KeyError:
            known = ", ".join(sorted(self._classes)) or "none"
            raise ConfigError([(path, f"unknown {self.kind} {name!r}; known: {known}")]) from None

    def names(self) -> list[str]:
        """Registered names, sorted."""
        self.load()
        return sorted(self._classes)

    def __contains__(self, name: object) -> bool:
        self.load()
        return name in self._classes

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def decorator(self) -> Callable[[T], T]:
        """The :meth:`register` method, for ``register_x = registry.decorator()``."""
        return self.register


#: Data augmentations applied to a waveform (:class:`labswarm.audio.transforms.base.Transformation`).
TRANSFORMATIONS: Registry = Registry("transformation", "labswarm.audio.transforms", "labswarm.transformations")
#: Feature extractors (:class:`labswarm.audio.features.base.FeatureExtractor`).
EXTRACTORS: Registry = Registry("feature extractor", "labswarm.audio.features", "labswarm.features")
#: Pipeline blocks (:class:`labswarm.pipeline.base.Block`).
BLOCKS: Registry = Registry("pipeline block", "labswarm.pipeline.blocks", "labswarm.blocks")
#: Models (:class:`labswarm.train.models.base.Model`).
MODELS: Registry = Registry("model", "labswarm.train.models", "labswarm.models")
#: Distributed training frameworks (:class:`labswarm.train.distributed.frameworks.base.Framework`).
FRAMEWORKS: Registry = Registry("framework", "labswarm.train.distributed.frameworks", "labswarm.frameworks")
#: Byte stores of the feature store and the jobs' results (:class:`labswarm.storage.base.Storage`).
STORAGES: Registry = Registry("storage", "labswarm.storage", "labswarm.storages")
#: Publish-rate controllers of the health controller (:class:`labswarm.health.controllers.base.Controller`).
CONTROLLERS: Registry = Registry("controller", "labswarm.health.controllers", "labswarm.controllers")
#: Launchers by platform (:class:`labswarm.deploy.base.Platform`): each gives the launcher of a session's workers and
#: that of a job's learners (``launcher`` of a session, ``LABSWARM_JOB_LAUNCHER``).
LAUNCHERS: Registry = Registry("launcher", "labswarm.deploy.platforms", "labswarm.launchers")
