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

from labswarm.errors import ConfigError, DatasetError

if TYPE_CHECKING:
    from labswarm.config.experiment import ExperimentConfig
    from labswarm.config.manifest import JobManifest
    from labswarm.settings import Settings

#: The reason a path outside every root is refused with (the field's path comes with it).
OUTSIDE = "outside the allowed data roots"
#: Rows of a labels CSV named one by one in an error; the others are counted.
MAX_ROWS_NAMED = 10


class OutsideDataRoots(ConfigError, DatasetError):
    """A path outside every data root: a :class:`~labswarm.errors.ConfigError` (the manager answers 422 with each
    field) that is also a :class:`~labswarm.errors.DatasetError`, so that the readers of a dataset that catch
    those (a worker failing one message) handle a row of a labels CSV outside the roots as they handle a bad CSV.
    """


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


def check_experiment_paths(config: ExperimentConfig, roots: DataRoots, *, source: str | None = None,
                           prefix: str = "") -> None:
    """Refuse an experiment that names a path outside ``roots`` (see :func:`experiment_paths`), then one whose
    labels CSV, when it exists, lists an audio path outside them (:func:`check_labels_paths`).

    Raises:
        ConfigError: one ``(field, reason)`` pair per path outside every root (:class:`OutsideDataRoots`);
            nothing is read before the labels CSV itself is known to lie inside the roots.
        DatasetError: the labels CSV exists but cannot be read as one (its content is never quoted).
    """
    roots.check_all(experiment_paths(config, prefix), source=source)
    if config.dataset.labels_path.is_file():  # a missing one is refused when a session or a job reads it
        check_labels_paths(config, roots, source=source, prefix=prefix)


#: Lookups in one folder that :class:`PathCheck` answers with an ``lstat`` each before it lists the folder once
#: instead (``os.scandir`` gives each entry's type with the listing: no system call per file; 200k rows: ~1.4 s
#: of ``lstat`` calls became ~0.4 s of listings, shared 2-core machine).
LIST_FOLDER_AFTER = 16


class PathCheck:
    """Whether paths lie inside some roots, for many files in few folders (the rows of a labels CSV): each folder
    is resolved once; whether a file is a symlink (then followed to its end) comes from one ``lstat``, or from
    one listing of its folder once more than :data:`LIST_FOLDER_AFTER` of its files were asked about (a folder
    that cannot be listed keeps the ``lstat`` per file); no file is opened.

    Args:
        roots: the data roots.
    """

    def __init__(self, roots: DataRoots) -> None:
        self.roots = roots
        self._folders: dict[str, str | None] = {}  # folder as written: resolved (None: no valid path)
        # resolved folder: (its entries' names, its symlinks' names), None: it cannot be listed
        self._links: dict[str, tuple[frozenset[str], frozenset[str]] | None] = {}
        self._lookups: dict[str, int] = {}  # resolved folder: files asked about before it is listed
        # plain string prefixes: Path operations cost ~10x a string comparison per row
        self._prefixes = tuple(os.path.join(os.fspath(root), "") for root in roots.roots)
        self._exact = frozenset(os.fspath(root) for root in roots.roots)

    def __call__(self, path: str | Path) -> bool:
        """Whether ``path``, resolved with every symlink, is a root or lies below one."""
        head, sep, tail = os.fspath(path).rpartition(os.sep)  # os.path.split's, without its cost per row
        if sep and not head:
            head = os.sep
        if head not in self._folders:
            try:
                self._folders[head] = os.fspath(resolve(head or os.curdir))
            except ValueError:  # a NUL character
                self._folders[head] = None
        if (folder := self._folders[head]) is None:
            return False
        target = folder + tail if folder.endswith(os.sep) else folder + os.sep + tail
        if tail in ("", os.curdir, os.pardir) or self._is_link(folder, tail, target):
            return self.roots.contains(target)
        return target in self._exact or target.startswith(self._prefixes)

    def _is_link(self, folder: str, tail: str, target: str) -> bool:
        """Whether ``target`` (``tail`` in the resolved ``folder``) is a symlink. A name the listing does not hold
        as written (a missing file; or one a case-insensitive or normalizing file system matches under another
        spelling) is ``lstat``-ed."""
        if folder not in self._links:
            seen = self._lookups[folder] = self._lookups.get(folder, 0) + 1
            if seen <= LIST_FOLDER_AFTER:
                return os.path.islink(target)
            try:
                with os.scandir(folder) as entries:
                    listed = [(entry.name, entry.is_symlink()) for entry in entries]
                self._links[folder] = (frozenset(name for name, _ in listed),
                                       frozenset(name for name, link in listed if link))
            except OSError:  # no read permission on the folder (search only), or it went away
                self._links[folder] = None
        listing = self._links[folder]
        if listing is None or tail not in listing[0]:
            return os.path.islink(target)
        return tail in listing[1]


def outside_row(field: str, line: int, roots: DataRoots) -> tuple[str, str]:
    """The ``(field, reason)`` pair of a labels CSV row whose audio path lies outside ``roots``: the row by its
    line number, never by what it holds (a file's content is never quoted)."""
    return field, f"line {line} (column path): {OUTSIDE} ({', '.join(str(r) for r in roots.roots)})"


def labels_outside(config: ExperimentConfig, roots: DataRoots) -> Iterator[int]:
    """The line numbers of the rows of an experiment's labels CSV whose audio path (relative to the dataset root,
    or absolute), resolved with every symlink, lies outside ``roots`` (see :class:`PathCheck`).

    Raises:
        DatasetError: the labels CSV cannot be read (see :func:`labswarm.datasets.folder.label_rows`).
    """
    for line, inside in _label_rows_inside(config, roots):
        if not inside:
            yield line


def _label_rows_inside(config: ExperimentConfig, roots: DataRoots) -> Iterator[tuple[int, bool]]:
    """``(line number, whether its audio path lies inside roots)`` of each row of the labels CSV.

    The path checked is the dataset root joined with the row's path as strings (``os.path.join``: an absolute
    path replaces the root, as in :func:`~labswarm.datasets.folder.clip_path`); it names the same file as
    ``clip_path``'s, which pathlib only rewrites by dropping ``.`` parts and doubled or trailing separators, and
    costs a tenth of it (building two ``Path`` objects per row was half of a 200k-row check).
    """
    from labswarm.datasets.folder import label_rows

    inside = PathCheck(roots)
    root = os.fspath(config.dataset.root)
    root = root if root.endswith(os.sep) else root + os.sep
    for line, clip_id, _label, _source in label_rows(config.dataset.labels_path):
        yield line, inside(clip_id if clip_id.startswith(os.sep) else root + clip_id)  # os.path.join's result


def check_labels_paths(config: ExperimentConfig, roots: DataRoots, *, source: str | None = None,
                       prefix: str = "") -> int:
    """Refuse an experiment whose labels CSV lists an audio path outside ``roots``, before any audio file is
    opened; in the same pass, count its rows (a session start needs both: one read of the file, not two). The
    error names the rows by line number, never by what they hold (a file's content is never quoted).

    Returns:
        The number of rows of the labels CSV (the dataset's clips; samples = clips x transformations).

    Raises:
        OutsideDataRoots: ``[("dataset.labels", "line 3 (column path): outside the allowed data roots ...")]``,
            the first :data:`MAX_ROWS_NAMED` rows named, the others counted.
        DatasetError: the labels CSV cannot be read.
    """
    rows, named, more = 0, [], 0
    for line, inside in _label_rows_inside(config, roots):
        rows += 1
        if inside:
            continue
        if len(named) < MAX_ROWS_NAMED:
            named.append(line)
        else:
            more += 1
    if not named:
        return rows
    field = f"{prefix}dataset.labels"
    errors = [outside_row(field, line, roots) for line in named]
    if more:
        errors.append((field, f"and {more} more row(s) {OUTSIDE}"))
    raise OutsideDataRoots(errors, source=source)


def manifest_paths(manifest: JobManifest) -> Iterator[tuple[str, Path]]:
    """Every path a job manifest names: an inline experiment's (``experiment.dataset.root``...), and the ``path``
    of its data and results stores of the ``local`` kind."""
    from labswarm.config.experiment import ExperimentConfig

    if isinstance(manifest.experiment, ExperimentConfig):
        yield from experiment_paths(manifest.experiment, "experiment.")
    for field in ("data_store", "results_store"):
        store = getattr(manifest, field)
        if store is not None and store.name == "local":
            yield f"{field}.path", Path(store.path)


def check_manifest_paths(manifest: JobManifest, roots: DataRoots, *, source: str | None = None) -> None:
    """Refuse a job manifest that names a path outside ``roots`` (see :func:`manifest_paths`), then one whose
    inline experiment's labels CSV lists an audio path outside them; call it before the job's stores are
    opened or created.

    Raises:
        ConfigError: one ``(field, reason)`` pair per path outside every root.
        DatasetError: the inline experiment's labels CSV exists but cannot be read.
    """
    from labswarm.config.experiment import ExperimentConfig

    roots.check_all(manifest_paths(manifest), source=source)
    experiment = manifest.experiment
    if isinstance(experiment, ExperimentConfig) and experiment.dataset.labels_path.is_file():
        check_labels_paths(experiment, roots, source=source, prefix="experiment.")


def experiment_folders(config: ExperimentConfig) -> list[Path]:
    """The folders an experiment names (its dataset root, the labels CSV's folder, each noise file's folder, its
    store root), resolved: the data roots ``labswarm run`` gives its embedded manager, so that the file the user
    runs is accepted from any current directory."""
    folders = [config.dataset.root, config.dataset.labels_path.parent, config.store.root]
    folders += [Path(file).parent for t in config.transformations if (file := getattr(t, "file", None))]
    return list(dict.fromkeys(resolve(folder) for folder in folders))
