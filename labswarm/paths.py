"""Data roots: the directories every path a configuration names must lie in.

The manager accepts configurations over HTTP (experiments, training-job manifests), and it and its workers open
and create what those name: a dataset's folder and labels CSV, noise files, the feature store, a job's local data
and results stores. ``LABSWARM_DATA_ROOTS`` (:attr:`~labswarm.settings.Settings.data_roots`) bounds them: each
path is resolved (``os.path.realpath``: ``..`` and every symlink followed, a path that does not exist yet
resolved as far as it exists) and must lie inside one root, else the configuration is refused with a
:class:`~labswarm.errors.ConfigError` naming the field (``dataset.labels``) before anything is opened or created;
the manager answers it with a 422.

Roots default to the current directory of the process that builds them. ``labswarm run`` on the embedded default
adds the folders its experiment file names (:func:`experiment_folders`): the user runs their own file as
themselves, from any directory, with zero configuration, while its manager on loopback still refuses any other
path posted to it.

A relative path is resolved against the current directory, where the manager opens it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from labswarm.errors import ConfigError

if TYPE_CHECKING:
    from labswarm.config import ExperimentConfig
    from labswarm.jobs.manifest import JobManifest
    from labswarm.settings import Settings

#: The reason a path outside every root is refused with (the field's path comes with it).
OUTSIDE = "outside the allowed data roots"


def resolve(path: str | Path) -> Path:
    """``path`` made absolute against the current directory, ``..`` and symlinks resolved (a missing tail kept).

    Raises:
        ValueError: the path cannot name a file (e.g. it holds a NUL character).
    """
    return Path(os.path.realpath(os.fspath(path)))


class DataRoots:
    """A set of directories that paths must lie in.

    Args:
        roots: the directories, resolved here (symlinks followed), relative ones against the current
            directory; none: the current directory.
    """

    def __init__(self, roots: Iterable[str | Path] = ()) -> None:
        resolved = tuple(dict.fromkeys(resolve(root) for root in roots))
        self.roots: tuple[Path, ...] = resolved or (resolve(os.curdir),)

    @classmethod
    def from_settings(cls, settings: Settings) -> DataRoots:
        """The roots of ``settings.data_roots`` (``LABSWARM_DATA_ROOTS``; empty: the current directory)."""
        return cls(settings.data_roots)

    def __repr__(self) -> str:
        return f"DataRoots({[str(r) for r in self.roots]})"

    def contains(self, path: str | Path) -> bool:
        """Whether ``path``, resolved, is one of the roots or lies below one."""
        try:
            target = resolve(path)
        except ValueError:
            return False
        return any(target == root or target.is_relative_to(root) for root in self.roots)

    def problem(self, path: str | Path) -> str | None:
        """Why ``path`` is refused, or ``None`` when it lies inside a root. Names the path as given, never what
        it resolves to, nor anything read from a file."""
        try:
            resolve(path)
        except ValueError:
            return "not a valid path"
        if self.contains(path):
            return None
        return f"{OUTSIDE} ({', '.join(str(r) for r in self.roots)}): {os.fspath(path)!r}"

    def check(self, path: str | Path, field: str) -> Path:
        """``path`` resolved, when it lies inside a root.

        Args:
            path: the path a configuration names.
            field: its dotted place in the configuration, e.g. ``dataset.labels``.

        Raises:
            ConfigError: ``path`` lies outside every root (or is no valid path); ``errors`` is
                ``[(field, "outside the allowed data roots ...")]``.
        """
        if (reason := self.problem(path)) is not None:
            raise ConfigError([(field, reason)])
        return resolve(path)

    def check_all(self, paths: Iterable[tuple[str, str | Path]], *, source: str | None = None) -> None:
        """Check every ``(field, path)`` pair; one error lists every path refused.

        Raises:
            ConfigError: one ``(field, reason)`` pair per path outside every root.
        """
        errors = [(field, reason) for field, path in paths if (reason := self.problem(path)) is not None]
        if errors:
            raise ConfigError(errors, source=source)


def experiment_paths(config: ExperimentConfig, prefix: str = "") -> Iterator[tuple[str, Path]]:
    """Every path an experiment names, with its dotted field path: the dataset root, the labels CSV (relative to
    the root unless absolute), each noise file of a transformation, the store root."""
    yield f"{prefix}dataset.root", config.dataset.root
    yield f"{prefix}dataset.labels", config.dataset.labels_path
    for index, transformation in enumerate(config.transformations):
        if (file := getattr(transformation, "file", None)) is not None:
            yield f"{prefix}transformations.{index}.file", Path(file)
    yield f"{prefix}store.root", config.store.root


def check_experiment_paths(config: ExperimentConfig, roots: DataRoots, *, source: str | None = None) -> None:
    """Refuse an experiment that names a path outside ``roots`` (see :func:`experiment_paths`).

    Raises:
        ConfigError: one ``(field, reason)`` pair per path outside every root.
    """
    roots.check_all(experiment_paths(config), source=source)


def manifest_paths(manifest: JobManifest) -> Iterator[tuple[str, Path]]:
    """Every path a job manifest names: an inline experiment's (``experiment.dataset.root``...), and the ``path``
    of its data and results stores of the ``local`` kind."""
    from labswarm.config import ExperimentConfig

    if isinstance(manifest.experiment, ExperimentConfig):
        yield from experiment_paths(manifest.experiment, "experiment.")
    for field in ("data_store", "results_store"):
        store = getattr(manifest, field)
        if store is not None and store.name == "local":
            yield f"{field}.path", Path(store.path)


def check_manifest_paths(manifest: JobManifest, roots: DataRoots, *, source: str | None = None) -> None:
    """Refuse a job manifest that names a path outside ``roots`` (see :func:`manifest_paths`); call it before
    the job's stores are opened or created.

    Raises:
        ConfigError: one ``(field, reason)`` pair per path outside every root.
    """
    roots.check_all(manifest_paths(manifest), source=source)


def experiment_folders(config: ExperimentConfig) -> list[Path]:
    """The folders an experiment names (its dataset root, the labels CSV's folder, each noise file's folder, its
    store root), resolved: the data roots ``labswarm run`` gives its embedded manager, so that the file the user
    runs is accepted from any current directory."""
    folders = [config.dataset.root, config.dataset.labels_path.parent, config.store.root]
    folders += [Path(file).parent for t in config.transformations if (file := getattr(t, "file", None))]
    return list(dict.fromkeys(resolve(folder) for folder in folders))
