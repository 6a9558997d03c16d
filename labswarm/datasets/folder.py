"""A dataset as a folder of audio files plus a labels CSV.

The CSV has a header and the columns ``path`` (relative to the dataset root, or absolute), ``label``, and
optionally ``source``: the id of the underlying recording, so that clips cut from one recording are kept on
one side of a train/test split. Without ``source``, each file is its own source.

Given data roots (:class:`labswarm.paths.DataRoots`), the readers refuse a row whose audio path, resolved with
every symlink, lies outside them (:class:`labswarm.paths.OutsideDataRoots`, naming the row by its line number)
before that row is handed out, so before its audio file can be opened.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from labswarm.errors import DatasetError
from labswarm.paths import DataRoots, OutsideDataRoots, PathCheck, outside_row

#: Columns the labels CSV must have.
REQUIRED_COLUMNS = ("path", "label")


@dataclass(frozen=True, slots=True)
class Clip:
    """One audio file of a dataset.

    Attributes:
        clip_id: the path as written in the CSV (stable across machines; part of sample ids).
        path: the absolute path of the audio file.
        label: class label.
        source: id of the underlying recording.
    """

    clip_id: str
    path: str
    label: str
    source: str


def iter_clips(root: str | Path, labels: str | Path, roots: DataRoots | None = None) -> Iterator[Clip]:
    """Stream the clips of a labels CSV, in file order.

    Args:
        root: folder that relative paths are resolved against.
        labels: the CSV file.
        roots: the data roots every clip's path must lie in; ``None``: not checked.

    Raises:
        DatasetError: the CSV is missing or unreadable, is not UTF-8 CSV text, lacks a required column, or a row
            has an empty path or label (the message gives the line number). No message quotes the file's content
            (a labels file may name any file the manager can read: its first line would leak). Audio files are
            not opened here: a missing audio file fails its own samples later with an ``AudioError``.
        OutsideDataRoots: a row's path lies outside ``roots`` (``dataset.labels``, the line number); the rows
            before it have been yielded.
    """
    for _line, clip in _numbered_clips(root, labels, roots):
        yield clip


def _numbered_clips(root: str | Path, labels: str | Path,
                    roots: DataRoots | None = None) -> Iterator[tuple[int, Clip]]:
    """``(line number, clip)`` of each row of a labels CSV (see :func:`iter_clips`)."""
    root = Path(root)
    inside = PathCheck(roots) if roots is not None else None
    for line, clip_id, label, source in label_rows(labels):
        path = clip_path(root, clip_id)
        if inside is not None and not inside(path):
            raise OutsideDataRoots([outside_row("dataset.labels", line, inside.roots)], source=str(labels))
        yield line, Clip(clip_id=clip_id, path=path, label=label, source=source)


def clip_path(root: Path, clip_id: str) -> str:
    """The full path of the clip ``clip_id`` (a path of the labels CSV) in a dataset whose folder is ``root``."""
    path = Path(clip_id)
    return str(path if path.is_absolute() else root / path)


def label_rows(labels: str | Path) -> Iterator[tuple[int, str, str, str]]:
    """``(line number, path, label, source)`` of each row of a labels CSV, as written (``source`` defaults to
    the path); the checks and errors of :func:`iter_clips`."""
    labels = Path(labels)
    try:
        handle = labels.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise DatasetError(f"cannot read labels CSV {labels}: {exc.strerror or exc}") from exc
    with handle:
        reader = csv.DictReader(handle)
        line = 1
        try:
            columns = reader.fieldnames or []
            missing = [c for c in REQUIRED_COLUMNS if c not in columns]
            if missing:
                raise DatasetError(f"{labels}: the header (line 1) is missing column(s) {', '.join(missing)}; a labels "
                                   f"CSV has the columns {', '.join(REQUIRED_COLUMNS)}[, source]")
            for row in reader:
                line = reader.line_num
                clip_id = (row.get("path") or "").strip()
                label = (row.get("label") or "").strip()
                if not clip_id or not label:
                    raise DatasetError(f"{labels}, line {line}: empty path or label")
                yield line, clip_id, label, (row.get("source") or "").strip() or clip_id
        except UnicodeDecodeError:  # its message quotes the offending bytes: not passed on
            raise DatasetError(f"{labels}, after line {line}: not UTF-8 text") from None
        except csv.Error as exc:
            raise DatasetError(f"{labels}, line {reader.line_num}: not a valid CSV row") from exc
        except OSError as exc:
            raise DatasetError(f"cannot read labels CSV {labels}: {exc.strerror or exc}") from exc


def read_clips(root: str | Path, labels: str | Path, roots: DataRoots | None = None) -> list[Clip]:
    """All clips of a labels CSV (see :func:`iter_clips`; ``roots``: the data roots their paths must lie in).

    Raises:
        DatasetError: see :func:`iter_clips`; or a path listed twice (the message gives both line numbers).
    """
    clips: list[Clip] = []
    seen: dict[str, int] = {}
    for line, clip in _numbered_clips(root, labels, roots):
        if clip.clip_id in seen:
            raise DatasetError(f"{labels}, line {line}: the path of line {seen[clip.clip_id]} is listed twice")
        seen[clip.clip_id] = line
        clips.append(clip)
    return clips
