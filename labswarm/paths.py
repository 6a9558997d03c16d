"""Data roots: the directories every path a configuration names must lie in.

The manager accepts configurations over HTTP (experiments, training-job manifests), and it and its workers open
and create what those name: a dataset's folder and labels CSV, noise files, the feature store, a job's local data
and results stores. ``LABSWARM_DATA_ROOTS`` (:attr:`~labswarm.settings.Settings.data_roots`) bounds them: each
path is resolved (``os.path.realpath``: ``..`` and every symlink followed, a path that does not exist yet
resolved as far as it exists) and must lie inside one root, else the configuration is refused with a
:class:`~labswarm.errors.ConfigError` naming the field (``dataset.labels``) before anything is opened or created;
the manager answers it with a 422.

Roots default to the current directory of the process that builds them. ``labswarm run`` on the embedded default
adds the folders its experiment file names (:func:`labswarm.config.roots.experiment_folders`): the user runs
their own file as themselves, from any directory, with zero configuration, while its manager on loopback still
refuses any other path posted to it. The checks of what a configuration names are in :mod:`labswarm.config.roots`.

A relative path is resolved against the current directory, where the manager opens it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from labswarm.errors import ConfigError, DatasetError

if TYPE_CHECKING:
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


@dataclass(frozen=True, slots=True)
class FileIdentity:
    """What tells that a file changed without reading it (one ``os.stat``): its device, inode, size in bytes and
    modification time in ns. Equal identities: the same file, not rewritten (to the file system's time
    resolution); another device or inode: the file was replaced."""

    device: int
    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: str | Path) -> FileIdentity:
        """The identity of ``path`` now.

        Raises:
            OSError: the file cannot be stat'ed (missing, no permission).
        """
        st = os.stat(path)
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


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
