"""What can be checked of an experiment on this machine before any work starts: the files it names exist and
can be read. ``labswarm run`` (embedded manager), ``train``, ``features`` and ``compare`` call
:func:`check_files` before they start a manager, a worker or a learner, so that a missing labels CSV or audio
file is an error of the command (exit status 2, the field and the path), not of a session minutes later.

Each problem is one ``(field, reason)`` pair of a :class:`~labswarm.errors.ConfigError`. The labels CSV is read
whole and each audio path it lists is tested for existence (``os.path.isfile``: 200,000 rows in well under a
second); the audio files themselves are not opened: a corrupt file fails its own samples.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from labswarm.config.experiment import ExperimentConfig
from labswarm.datasets.folder import clip_path, label_rows
from labswarm.errors import ConfigError, DatasetError

#: Missing audio files named one by one; the others are counted.
MAX_NAMED = 3


def check_files(config: ExperimentConfig, *, source: str | None = None) -> int:
    """Check the files ``config`` names (paths absolute, as ``load_experiment`` gives them).

    Returns:
        The number of clips the labels CSV lists.

    Raises:
        ConfigError: every problem found, each with its field: a dataset folder or labels CSV that does not
            exist or cannot be read as a labels CSV, a labels CSV listing no clip or audio files that do not
            exist, a transformation's file that does not exist, a store root that is a file or cannot be created.
    """
    problems = list(_folder_problems(config))
    clips = 0
    if not problems:
        try:
            clips, missing = _missing_audio(config)
        except DatasetError as exc:
            problems.append(("dataset.labels", str(exc)))
        else:
            problems += _missing_rows(config, clips, missing)
    for index, transformation in enumerate(config.transformations):
        if (file := getattr(transformation, "file", None)) is not None and not Path(file).is_file():
            problems.append((f"transformations.{index}.file", f"no such file: {file}"))
    problems += _store_problems(config.store.root)
    if problems:
        raise ConfigError(problems, source=source)
    return clips


def _folder_problems(config: ExperimentConfig) -> Iterator[tuple[str, str]]:
    root, labels = config.dataset.root, config.dataset.labels_path
    if not root.is_dir():
        yield "dataset.root", f"no such folder: {root}" + (" (a file)" if root.exists() else "")
    elif not labels.is_file():
        yield "dataset.labels", (f"no such file: {labels} (relative to dataset.root unless absolute; a labels CSV "
                                 "has the columns path, label[, source])")


def _missing_audio(config: ExperimentConfig) -> tuple[int, list[tuple[int, str]]]:
    """The number of rows of the labels CSV, and ``(line, path)`` of each row whose audio file does not exist."""
    clips, missing = 0, []
    for line, clip_id, _label, _source in label_rows(config.dataset.labels_path):
        clips += 1
        path = clip_path(config.dataset.root, clip_id)
        if not os.path.isfile(path):
            missing.append((line, path))
    return clips, missing


def _missing_rows(config: ExperimentConfig, clips: int, missing: list[tuple[int, str]]) -> list[tuple[str, str]]:
    labels = config.dataset.labels_path
    if not clips:
        return [("dataset.labels", f"{labels} lists no clip (a header and no row)")]
    problems = [("dataset.labels", f"line {line}: no such audio file {path}") for line, path in missing[:MAX_NAMED]]
    if len(missing) > MAX_NAMED:
        problems.append(("dataset.labels", f"and {len(missing) - MAX_NAMED} more of its {clips} rows name no "
                                           "existing audio file"))
    return problems


def _store_problems(root: Path) -> list[tuple[str, str]]:
    if root.exists():
        return [] if root.is_dir() else [("store.root", f"{root} is a file, not a folder")]
    parent = root.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not os.access(parent, os.W_OK | os.X_OK):
        return [("store.root", f"cannot create {root}: {parent} is not writable")]
    return []
