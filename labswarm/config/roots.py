"""The paths a configuration names, checked against the data roots (:mod:`labswarm.paths`): an experiment's
dataset, labels CSV, noise files and store; a job manifest's inline experiment and local stores; the rows of a
labels CSV. The manager calls these before anything a configuration names is opened or created.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from labswarm.config.experiment import ExperimentConfig
from labswarm.config.manifest import JobManifest
from labswarm.datasets.folder import label_rows
from labswarm.paths import MAX_ROWS_NAMED, OUTSIDE, DataRoots, OutsideDataRoots, PathCheck, outside_row, resolve


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
    rows, more = 0, 0
    named: list[int] = []
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
