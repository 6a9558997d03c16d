"""A watched folder: new audio files appearing in it become rows of a labels CSV, with their label from a rule.

A followed session (``follow: true``, :mod:`labswarm.sessions.follow`) publishes the rows appended to its labels
CSV as they appear; :class:`FolderWatch` is what appends them when the catalog is a folder that files are dropped
into (``labswarm watch``). The labels CSV stays the one catalog: the session, ``labswarm features`` and training
all read the same rows.

* **new files**: each poll lists the folder (recursively) for audio files (:data:`AUDIO_SUFFIXES`; names starting
  with ``.`` are skipped: the temporary files of copy tools) whose path is not yet in the labels CSV;
* **complete files only**: a file is taken once its size and modification time are the same at two polls in a
  row (a file being copied keeps changing), and it is not empty;
* **never twice**: the paths the CSV holds are read at start, normalised to the dataset root (a restarted watcher
  skips them, also when written absolute), and a file whose label rule gives no label is skipped with one
  warning, not retried at each poll;
* **the CSV's own columns**: rows are written under the existing header by column name (``path,source,label``
  or ``label,path`` work as ``path,label`` does), as the readers take them;
* **removed files are ignored**: their rows stay (the session keeps their outcomes; nothing is withdrawn);
* **one write per poll**: the new rows are appended in one ``write`` of whole lines and synced, so a reader that
  takes complete lines only (:class:`~labswarm.sessions.follow.LabelsTail`) never sees half a row.

Label rules (:func:`parse_rule`): ``parent`` (the name of the folder the file is in, the common ``class/file.wav``
layout), ``regex:PATTERN`` (searched in the path relative to the watched folder, with ``/`` separators; the group
named ``label`` is the label) and ``fixed:LABEL``.
"""

from __future__ import annotations

import csv
import io
import logging
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from labswarm.datasets.folder import REQUIRED_COLUMNS
from labswarm.errors import DatasetError

log = logging.getLogger(__name__)

#: Audio file suffixes a watched folder takes (lower case; the formats the audio reader opens: libsndfile's).
AUDIO_SUFFIXES = frozenset({".wav", ".flac", ".ogg", ".mp3", ".aif", ".aiff"})
#: Seconds between two polls of ``labswarm watch`` (a file is taken at the second poll that sees it unchanged).
POLL_SECONDS = 1.0


@dataclass(frozen=True)
class LabelRule:
    """How a new file's label is found (see :func:`parse_rule`).

    Attributes:
        kind: ``parent``, ``regex`` or ``fixed``.
        value: the pattern (``regex``), the label (``fixed``), ``""`` (``parent``).
    """

    kind: str
    value: str = ""

    def label(self, relative: str) -> str | None:
        """The label of the file at ``relative`` (its path under the watched folder, ``/`` separators), or
        ``None`` when the rule gives none (a file at the folder's top with ``parent``, no match or an empty
        group with ``regex``)."""
        if self.kind == "fixed":
            return self.value
        if self.kind == "parent":
            parent = relative.rpartition("/")[0].rpartition("/")[2]
            return parent or None
        match = re.search(self.value, relative)
        if match is None:
            return None
        return (match.group("label") or "").strip() or None


def parse_rule(text: str) -> LabelRule:
    """The label rule written ``parent``, ``regex:PATTERN`` (with a group ``(?P<label>...)``) or ``fixed:LABEL``.

    Raises:
        ValueError: an unknown rule, a pattern that does not compile or has no group named ``label``, or an empty
            fixed label (the message names the rule and the reason).
    """
    kind, _, value = text.partition(":")
    if kind == "parent" and not value:
        return LabelRule("parent")
    if kind == "fixed" and value.strip():
        return LabelRule("fixed", value.strip())
    if kind == "regex":
        try:
            groups = re.compile(value).groupindex
        except re.error as exc:
            raise ValueError(f"label rule {text!r}: the pattern does not compile: {exc}") from None
        if "label" not in groups:
            raise ValueError(f"label rule {text!r}: the pattern has no group named label, (?P<label>...)")
        return LabelRule("regex", value)
    raise ValueError(f"label rule {text!r}: expected parent, regex:PATTERN (with a group (?P<label>...)) or "
                     "fixed:LABEL")


class FolderWatch:
    """Appends a row to a labels CSV for each new complete audio file of a folder (see the module).

    Args:
        folder: the watched folder.
        labels: the labels CSV (created with its header when missing).
        rule: the label rule.
        root: the folder the CSV's paths are relative to (the dataset's root); a file outside it is written with
            its absolute path.

    An existing CSV is read once, leniently (bytes that are not UTF-8 replaced): its header's column names are
    kept, and each new row is written under them by name (``path`` and ``label`` filled, any other column such as
    ``source`` left empty, which the readers take as the path), so the readers, which take the columns by name
    (:func:`~labswarm.datasets.folder.label_rows`, :class:`~labswarm.sessions.follow.LabelsTail`), read it
    whatever the columns' order. Its rows' paths are known and never appended again, compared normalised to the
    dataset root (``./a/b.wav``, ``a//b.wav`` and ``ROOT/a/b.wav`` are the row ``a/b.wav``). A missing or empty
    CSV is created with the header ``path,label``.

    Raises:
        DatasetError: the existing CSV's header lacks a required column (``path``, ``label``; as the readers
            require them, exactly named).
        OSError: the labels CSV cannot be read or created.
    """

    def __init__(self, folder: Path, labels: Path, rule: LabelRule, root: Path) -> None:
        self.folder = Path(folder).resolve()
        self.labels = Path(labels)
        self.rule = rule
        self.root = Path(root).resolve()
        self.columns: list[str] = list(REQUIRED_COLUMNS)  # the CSV header's names, set by _read_known
        self.known: set[str] = self._read_known()
        self._seen: dict[str, tuple[int, int]] = {}  # path -> (size, mtime_ns) at the last poll
        self._unlabelled: set[str] = set()

    def _read_known(self) -> set[str]:
        """The normalised paths (:meth:`_key`) of the CSV's rows; sets :attr:`columns` to its header's names
        (the CSV is created with the header ``path,label`` when missing or empty)."""
        if self.labels.exists():
            with self.labels.open(newline="", encoding="utf-8", errors="replace") as handle:
                reader = csv.DictReader(handle)
                if reader.fieldnames:  # None: an empty file, written a header below
                    self.columns = list(reader.fieldnames)
                    if missing := [c for c in REQUIRED_COLUMNS if c not in self.columns]:
                        raise DatasetError(f"{self.labels}: the header (line 1) is missing column(s) "
                                           f"{', '.join(missing)}; a labels CSV has the columns "
                                           f"{', '.join(REQUIRED_COLUMNS)}[, source]")
                    return {self._key(path) for row in reader if (path := (row.get("path") or "").strip())}
        self.labels.parent.mkdir(parents=True, exist_ok=True)
        self.columns = list(REQUIRED_COLUMNS)
        self.labels.write_text(",".join(REQUIRED_COLUMNS) + "\n", encoding="utf-8")
        return set()

    def _key(self, name: str) -> str:
        """The path ``name`` of a CSV row as :meth:`_csv_path` writes it: made absolute against the root,
        normalised (``.``, ``..`` and repeated separators), relative to the root when inside it (with its
        symlinks resolved when the path as written is not)."""
        path = Path(os.path.normpath(self.root / name))  # an absolute name stays itself
        try:
            return path.relative_to(self.root).as_posix()
        except ValueError:
            pass
        try:
            return self._csv_path(path.resolve())
        except (OSError, RuntimeError):  # a symlink loop, say: compared as written
            return path.as_posix()

    def _csv_path(self, path: Path) -> str:
        try:
            return path.relative_to(self.root).as_posix()
        except ValueError:
            return str(path)

    def _audio_files(self) -> list[Path]:
        found: list[Path] = []
        for folder, dirs, files in os.walk(self.folder):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            found += [Path(folder) / f for f in sorted(files)
                      if not f.startswith(".") and Path(f).suffix.lower() in AUDIO_SUFFIXES]
        return found

    def poll(self) -> list[tuple[str, str]]:
        """Look at the folder once; append the rows of the files found complete; returns those ``(path,
        label)`` rows (empty when none).

        Raises:
            OSError: the labels CSV cannot be written.
        """
        rows: list[tuple[str, str]] = []
        seen: dict[str, tuple[int, int]] = {}
        for path in self._audio_files():
            name = self._csv_path(path)
            if name in self.known or name in self._unlabelled:
                continue
            try:
                st = path.stat()
            except OSError:  # removed meanwhile
                continue
            seen[name] = (st.st_size, st.st_mtime_ns)
            if st.st_size == 0 or self._seen.get(name) != seen[name]:
                continue  # new, or still being written: taken at the next poll that sees it unchanged
            label = self.rule.label(path.relative_to(self.folder).as_posix())
            if label is None:
                log.warning("watched folder %s: no label for %s by rule %s; skipped", self.folder, name,
                            self.rule.kind)
                self._unlabelled.add(name)
                continue
            rows.append((name, label))
        self._seen = seen
        if rows:
            self._append(rows)
            self.known.update(name for name, _ in rows)
        return rows

    def _append(self, rows: list[tuple[str, str]]) -> None:
        """Append ``rows`` in one write of whole lines under the CSV's header (:attr:`columns`, by name), after a
        line break if the file's last line lacks one."""
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=self.columns, restval="", lineterminator="\n")
        writer.writerows({"path": path, "label": label} for path, label in rows)
        with self.labels.open("ab+") as handle:
            size = handle.seek(0, os.SEEK_END)
            prefix = b""
            if size:
                handle.seek(size - 1)
                prefix = b"" if handle.read(1) == b"\n" else b"\n"
            handle.write(prefix + text.getvalue().encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())

    def run(self, stop: threading.Event, interval: float = POLL_SECONDS) -> None:
        """Poll every ``interval`` s until ``stop`` is set; each poll's rows are logged."""
        while not stop.is_set():
            rows = self.poll()
            if rows:
                log.info("watched folder %s: %d new files appended to %s", self.folder, len(rows), self.labels)
            stop.wait(interval)
