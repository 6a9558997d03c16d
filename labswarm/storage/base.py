"""Storage base class and registry: where a training job reads its data and writes its results.

A storage holds objects under ``/``-separated keys (``checkpoints/attempt-2/epoch-3.pt``). The base class owns
the invariants: key validation, the configured prefix, the sub-prefix views of :meth:`Storage.at`, atomic
downloads into local files, and the translation of every failure into :class:`~labswarm.errors.StorageError`.
A backend fills in a few primitives that take full keys (prefix included) and move bytes.

What a key may be: :mod:`labswarm.storage.keys` (:func:`check_key`, re-exported here).
"""

from __future__ import annotations

import builtins
import contextlib
import copy
import itertools
import os
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any, ClassVar, TypeVar

from pydantic import Field, field_validator

from labswarm.errors import LabswarmError, StorageError, StorageRefused
from labswarm.plugin import PluginConfig, build_plugin
from labswarm.registry import STORAGES
from labswarm.storage.keys import MAX_KEY_BYTES as MAX_KEY_BYTES  # re-exported
from labswarm.storage.keys import check_key as check_key  # re-exported
from labswarm.storage.keys import join_keys
from labswarm.storage.stamps import Stamp

T = TypeVar("T")


class MissingObject(StorageError):
    """No object is stored under the key (e.g. no checkpoint yet: the caller starts from scratch)."""


class StorageConfig(PluginConfig):
    """Base config of a storage; subclasses add where it is (a folder, a bucket).

    Attributes:
        prefix: every key is stored under this folder of the storage (``""``: its top level).
    """

    prefix: str = Field("", max_length=512)

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        try:
            return check_key(value, allow_empty=True)
        except StorageError as exc:
            raise ValueError(str(exc)) from None


class Storage(ABC):
    """Base of every storage; owns the invariants, backends implement the ``_`` primitives.

    Every public method takes keys relative to the storage's prefix and raises only
    :class:`~labswarm.errors.StorageError` (:class:`MissingObject` for a key with no object).

    Class attributes:
        name: the registry name used in manifests (``local``, ``s3``).
        config_model: the pydantic model of the parameters.

    Args:
        config: the validated config.
        scope: a sub-prefix below ``config.prefix`` (see :meth:`at`).
    """

    name: ClassVar[str]
    config_model: ClassVar[type[StorageConfig]] = StorageConfig

    def __init__(self, config: StorageConfig, *, scope: str = "") -> None:
        self.config = config
        self._root = join_keys(config.prefix, check_key(scope, allow_empty=True))

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | StorageConfig) -> Storage:
        """The registered storage a spec (``{name: ..., **params}`` or a config) names.

        Raises:
            ConfigError: unknown name (the message lists the known ones) or invalid parameters.
        """
        return build_plugin(STORAGES, spec)

    # views
    @property
    def root(self) -> str:
        """The full prefix of this view (``config.prefix`` plus the scope), ``""`` for the top level."""
        return self._root

    def at(self, prefix: str) -> Storage:
        """A view of this storage whose keys live under ``prefix`` (e.g. ``jobs/<id>``); shares the backend's
        connection. Deleting ``""`` in the view deletes only what lies under ``prefix``.

        Raises:
            StorageError: ``prefix`` is not a valid key.
        """
        view = copy.copy(self)
        view._root = join_keys(self._root, check_key(prefix, allow_empty=True))
        return view

    def describe(self, key: str = "") -> str:
        """Where ``key`` lives, for messages (``s3://bucket/prefix/key``, a path); never a credential."""
        return self._describe(join_keys(self._root, key))

    # operations
    def put_bytes(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key``, replacing any object there; readers see the old or the new, whole.

        Raises:
            StorageError: invalid key, or the backend failed.
        """
        full = self._full(key)
        self._guard("write", full, lambda: self._put_bytes(full, bytes(data)))

    def get_bytes(self, key: str) -> bytes:
        """The bytes stored under ``key``.

        Raises:
            MissingObject: no object under ``key``.
            StorageError: invalid key, or the backend failed.
        """
        full = self._full(key)
        return self._guard("read", full, lambda: self._get_bytes(full))

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """``length`` bytes of the object ``key`` from byte ``start``: one ranged request of an object store (an HTTP
        ``Range``, S3's ``GetObject`` with ``Range``), a file's region; fewer bytes where the object ends before
        (the caller checks the length).

        Raises:
            MissingObject: no object under ``key``.
            StorageError: invalid key, ``start`` < 0 or ``length`` < 1, or the backend failed.
        """
        full = self._full(key)
        if start < 0 or length < 1:
            raise StorageError(f"cannot read {self.describe(key)}: a range starts at 0 or later and holds a byte or "
                               f"more, got {length} bytes from {start}")
        return self._guard("read", full, lambda: self._get_range(full, start, length))

    def put_file(self, key: str, path: str | Path) -> None:
        """Upload the local file ``path`` under ``key`` (streamed; readers never see a partial object).

        Raises:
            StorageError: invalid key, ``path`` is not a readable file, or the backend failed.
        """
        full = self._full(key)
        path = Path(path)
        if not path.is_file():
            raise StorageError(f"cannot store {path} as {self.describe(key)}: not a file")
        self._guard("write", full, lambda: self._put_file(full, path))

    def get_file(self, key: str, path: str | Path) -> Path:
        """Download ``key`` to the local file ``path`` (parents created). The file appears whole or not at all:
        the bytes go to a temporary file beside it that is then renamed.

        Returns:
            ``path``.

        Raises:
            MissingObject: no object under ``key`` (``path`` is left untouched).
            StorageError: invalid key, the local file cannot be written, or the backend failed.
        """
        full = self._full(key)
        path = Path(path)
        tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:12]}.tmp"

        def download() -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                with open(tmp, "wb") as handle:
                    self._read_into(full, handle)
                os.replace(tmp, path)
            finally:
                with contextlib.suppress(OSError):
                    tmp.unlink()

        self._guard("read", full, download)
        return path

    def exists(self, key: str) -> bool:
        """Whether an object is stored under ``key`` (a "folder" with objects below it is not one).

        Raises:
            StorageError: invalid key, or the backend failed.
        """
        full = self._full(key)
        return self._guard("check", full, lambda: self._exists(full))

    def list(self, prefix: str = "") -> list[str]:
        """Keys of the objects under the folder ``prefix`` (``""``: all of this view), relative to this view,
        sorted. Objects whose names are not valid keys (e.g. starting with ``.``) are left out.

        Raises:
            StorageError: invalid prefix, or the backend failed.
        """
        folder = self._full(prefix, allow_empty=True)
        fulls = self._guard("list", folder, lambda: list(self._list(folder)))
        return sorted(key for full in fulls if (key := self._relative(full)) is not None)

    def first(self, prefix: str = "", limit: int = 999) -> tuple[builtins.list[str], bool]:
        """Up to ``limit`` keys under the folder ``prefix`` (relative to this view, in the backend's listing order,
        not sorted) and whether there are more: an object store reads one page of its listing (1,000 entries, so
        ``limit`` 999 and the one that tells whether more follow cost one request), not all of it.

        Raises:
            StorageError: invalid prefix, or the backend failed.
        """
        folder = self._full(prefix, allow_empty=True)
        fulls = self._guard("list", folder, lambda: builtins.list(itertools.islice(self._list(folder), limit + 1)))
        return [key for full in fulls[:limit] if (key := self._relative(full)) is not None], len(fulls) > limit

    def sizes(self, prefix: str = "") -> dict[str, int]:
        """Size in bytes of every object under the folder ``prefix`` (``""``: all of this view), by key relative
        to this view (the keys :meth:`list` gives).

        Raises:
            StorageError: invalid prefix, or the backend failed.
        """
        folder = self._full(prefix, allow_empty=True)
        pairs = self._guard("list", folder, lambda: list(self._sizes(folder)))
        return {key: size for full, size in pairs if (key := self._relative(full)) is not None}

    def modified(self, prefix: str = "") -> dict[str, Stamp]:
        """What a listing sees of every object under the folder ``prefix``: size, last modified and version
        (:class:`~labswarm.storage.stamps.Stamp`), by key as :meth:`sizes` gives.

        Raises:
            StorageError: invalid prefix, or the backend failed.
        """
        folder = self._full(prefix, allow_empty=True)
        rows = self._guard("list", folder, lambda: list(self._modified(folder)))
        return {key: stamp for full, stamp in rows if (key := self._relative(full)) is not None}

    def delete_if(self, key: str, version: str) -> bool:
        """Delete the object ``key`` only if it is still the ``version`` a listing saw (:meth:`modified`), not
        written since (S3: ``DeleteObject`` with ``If-Match``; a file: taken aside by a rename, put back if it was
        another); whether it was deleted (``False``: written since, or gone).

        Raises:
            StorageError: invalid key, or the backend failed.
        """
        full = self._full(key)
        return self._guard("delete", full, lambda: self._delete_if(full, version))

    def local_path(self, key: str) -> Path | None:
        """A file of this machine that holds the object ``key``'s bytes, for reading them in place (e.g. memory
        mapping), when the storage keeps its objects in files (``local``); ``None`` otherwise. The file may not
        exist (no such object).

        Raises:
            StorageError: invalid key.
        """
        return self._local_path(self._full(key))

    def _relative(self, full: str) -> str | None:
        """The key relative to this view of the full key ``full`` under it; ``None`` when that is not a valid key
        (e.g. a name starting with ``.``)."""
        try:
            return check_key(full[len(self._root) + 1 if self._root else 0:])
        except StorageError:
            return None

    def delete(self, prefix: str = "") -> int:
        """Delete the object ``prefix`` and every object under the folder ``prefix`` (``""``: everything in this
        view). Missing objects are not an error.

        Returns:
            The number of objects deleted.

        Raises:
            StorageError: invalid prefix, or the backend failed.
        """
        folder = self._full(prefix, allow_empty=True)
        itself = check_key(prefix, allow_empty=True) != ""  # "" is this view's folder, not an object

        def remove() -> int:
            doomed = list(self._list(folder))
            if itself and self._exists(folder):
                doomed.append(folder)
            self._delete_many(doomed)
            return len(doomed)

        return self._guard("delete", folder, remove)

    def reachable(self) -> None:
        """Check, without creating or writing anything, that the storage can be used: fail fast at submit time.

        Raises:
            StorageError: the folder or bucket is missing and cannot be created, is not accessible, or the
                service cannot be reached (or refuses the credentials).
        """
        self._guard("reach", self._root, self._reachable)

    # helpers
    def _full(self, key: str, *, allow_empty: bool = False) -> str:
        full = join_keys(self._root, check_key(key, allow_empty=allow_empty))
        if len(full.encode()) > MAX_KEY_BYTES:
            raise StorageError(f"invalid key {key!r}: longer than {MAX_KEY_BYTES} bytes with the prefix")
        return full

    def _guard(self, action: str, full: str, call: Callable[[], T]) -> T:
        """Run ``call``; translate any non-labswarm error into a StorageError naming the action and location."""
        try:
            return call()
        except LabswarmError:
            raise
        except Exception as exc:
            error = StorageRefused if self._refused(exc) else StorageError
            raise error(f"cannot {action} {self._describe(full)}: {self._explain(exc)}") from exc

    def _refused(self, exc: Exception) -> bool:
        """Whether a backend error is one that trying again does not change (raised as
        :class:`~labswarm.errors.StorageRefused`); backends with structured errors tell (none here)."""
        return False

    def _explain(self, exc: Exception) -> str:
        """A short reason for a backend error (overridden by backends with structured errors)."""
        if isinstance(exc, OSError) and exc.strerror:
            return exc.strerror
        return f"{type(exc).__name__}: {exc}"

    def _missing(self, full: str) -> MissingObject:
        return MissingObject(f"no object {self._describe(full)}")

    # primitives: full keys (prefix included); raise MissingObject (via _missing) for a missing object
    @abstractmethod
    def _describe(self, full: str) -> str:
        """A human-readable location of ``full`` (never a credential)."""

    @abstractmethod
    def _put_bytes(self, full: str, data: bytes) -> None:
        """Store ``data`` atomically."""

    @abstractmethod
    def _get_bytes(self, full: str) -> bytes:
        """The stored bytes."""

    def _get_range(self, full: str, start: int, length: int) -> bytes:
        """The bytes ``[start, start + length)`` of the object; by default the whole object read and cut (a backend
        that reads ranges overrides it)."""
        return self._get_bytes(full)[start:start + length]

    @abstractmethod
    def _put_file(self, full: str, path: Path) -> None:
        """Store the file's bytes atomically (streamed)."""

    @abstractmethod
    def _read_into(self, full: str, handle: IO[bytes]) -> None:
        """Write the object's bytes into an open binary file."""

    @abstractmethod
    def _exists(self, full: str) -> bool:
        """Whether an object is stored at ``full``."""

    @abstractmethod
    def _list(self, folder: str) -> Iterator[str]:
        """Full keys of every object below the folder ``folder`` (``""``: the whole storage)."""

    @abstractmethod
    def _sizes(self, folder: str) -> Iterator[tuple[str, int]]:
        """``(full key, size in bytes)`` of every object below the folder ``folder`` (``""``: the whole storage)."""

    def _modified(self, folder: str) -> Iterator[tuple[str, Stamp]]:
        """``(full key, its stamp)`` below ``folder``; by default the listing's time and no version."""
        return ((full, Stamp(size, now, "")) for now in [time.time()] for full, size in self._sizes(folder))

    def _delete_if(self, full: str, version: str) -> bool:
        """Delete ``full`` if its version is ``version``; by default checked, then deleted (not atomic)."""
        found = dict(self._modified(full.rsplit("/", 1)[0] if "/" in full else "")).get(full)
        if found is None or found.version != version:
            return False
        self._delete_many([full])
        return True

    def _local_path(self, full: str) -> Path | None:
        """The file holding the object ``full``, for a storage of files; ``None`` (the default) otherwise."""
        return None

    @abstractmethod
    def _delete_many(self, fulls: builtins.list[str]) -> None:  # builtins: `list` here is the method above
        """Delete these objects; missing ones are ignored."""

    @abstractmethod
    def _reachable(self) -> None:
        """Raise StorageError (or any exception) when the storage cannot be used; create nothing."""


register_storage = STORAGES.decorator()
