"""Writing and keeping packs (:mod:`labswarm.store.packs`): the arrays of a remote store's keys copied into pack
objects (``labswarm store pack EXPERIMENT`` once the experiment's features are computed), what they hold, whether
they are sound, and removing those that hold a removed array (``du``, ``verify``, ``gc``: :mod:`labswarm.store.ops`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from labswarm.errors import StorageError, StoreError
from labswarm.storage.base import MissingObject, Storage
from labswarm.storage.local import LocalStorage
from labswarm.store.npy import npy_problem
from labswarm.store.packfmt import Entry, encode, unpack
from labswarm.store.packs import PACK_BYTES, PACKS, THREADS, list_packs, load_catalogue, read_index
from labswarm.store.written import WRITTEN, WrittenPacks

if TYPE_CHECKING:
    from labswarm.store.store import FeatureStore


@dataclass(frozen=True, slots=True)
class Packed:
    """What :func:`pack` did: ``packs`` written holding ``arrays`` (``bytes`` bytes); ``already`` keys were in a
    pack, ``missing`` were not stored (not computed yet), ``unsound`` were left out (not a whole ``.npy``)."""

    packs: int
    arrays: int
    bytes: int
    already: int
    missing: int
    unsound: int


def pack(store: FeatureStore, keys: Iterable[str], *, pack_bytes: int = PACK_BYTES,
         threads: int = THREADS) -> Packed:
    """Write the arrays of ``keys`` that are in no pack yet into packs of at most ``pack_bytes`` bytes each (an
    array larger than that alone in its pack): first those in written packs (:mod:`labswarm.store.written`), each
    written pack read once for all its keys and dropped once they are taken (``threads`` packs in memory at most),
    then the others, each read from its per-key object (``threads`` requests at once); each array checked, and each
    pack written before its index (module docstring). The order of ``keys`` is kept within each of the two.

    Raises:
        StoreError: the store is a local folder (its arrays are files: packs would not be read), ``pack_bytes`` is
            not positive, or the storage fails.
    """
    origin = store.origin
    if isinstance(origin, LocalStorage):
        raise StoreError(f"feature store {store.where} is a local folder: packs serve a remote store's cache")
    if pack_bytes <= 0:
        raise StoreError(f"a pack's size must be > 0 bytes, got {pack_bytes}")
    wanted = list(dict.fromkeys(keys))
    current: list[tuple[str, bytes]] = []
    counts = {"packs": 0, "arrays": 0, "bytes": 0, "missing": 0, "unsound": 0}

    def flush() -> None:
        if current:
            name, header, blob = encode(current)
            origin.put_bytes(f"{PACKS}/{name}.pack", blob)  # the pack before its index: never seen partial
            origin.put_bytes(f"{PACKS}/{name}.json", header)
            counts["packs"] += 1
            counts["arrays"] += len(current)
            counts["bytes"] += sum(len(d) for _, d in current)
            current.clear()

    def take(key: str, data: bytes | None) -> None:
        if data is None or npy_problem(data) is not None:
            counts["missing" if data is None else "unsound"] += 1
            return
        if current and sum(len(d) for _, d in current) + len(data) > pack_bytes:
            flush()
        current.append((key, data))

    def read(key: str) -> bytes | None:
        try:
            return origin.get_bytes(store.relpath(key))
        except MissingObject:
            return None

    try:
        catalogue = load_catalogue(origin, threads=threads)
        todo = [k for k in wanted if k not in catalogue]
        by_pack, alone = _by_written_pack(store.written, todo)
        with ThreadPoolExecutor(max(1, threads)) as pool:
            for key, data in _read_all(pool, store.written, by_pack, alone, read, max(1, threads)):
                take(key, data)
            flush()
    except StorageError as exc:
        raise StoreError(str(exc)) from exc
    return Packed(counts["packs"], counts["arrays"], counts["bytes"], len(wanted) - len(todo), counts["missing"],
                  counts["unsound"])


def _read_all(pool: ThreadPoolExecutor, written: WrittenPacks | None, by_pack: dict[str, list[str]],
              alone: list[str], read: Callable[[str], bytes | None],
              threads: int) -> Iterator[tuple[str, bytes | None]]:
    """``(key, .npy bytes or None)`` of the keys in written packs (``by_pack``: one pack a thread, ``threads`` at
    once, each dropped once its keys are yielded) and then of those ``alone`` (``4 * threads`` reads in flight)."""
    if written is not None:
        units = list(by_pack.items())
        for start in range(0, len(units), threads):
            group = units[start:start + threads]
            for got in pool.map(lambda unit: _read_written(written, unit[0], unit[1], read), group):
                yield from got
    for start in range(0, len(alone), 4 * threads):  # a few groups of reads in flight, not the whole set
        keys = alone[start:start + 4 * threads]
        yield from zip(keys, pool.map(read, keys), strict=True)


def _by_written_pack(written: WrittenPacks | None, keys: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """``keys`` split into those in a written pack (pack name → its keys, in the order of ``keys``) and the others.

    Raises:
        StorageError: the written packs cannot be listed.
    """
    by_pack: dict[str, list[str]] = {}
    alone: list[str] = []
    for key in keys:
        found = None if written is None else written.find(key)
        if found is None:
            alone.append(key)
        else:
            by_pack.setdefault(found.name, []).append(key)
    return by_pack, alone


def _read_written(written: WrittenPacks, name: str, keys: list[str],
                  read: Callable[[str], bytes | None]) -> list[tuple[str, bytes | None]]:
    """The ``.npy`` bytes of ``keys`` from written pack ``name`` (read once); a key whose pack is gone (rewritten by
    gc since the listing) found again (:func:`from_written`), one not sound in its pack read by ``read`` (a per-key
    object, if there is one); ``None`` when in neither."""
    gone = False
    try:
        _entries, good, _bad = unpack(written.origin.get_bytes(f"{WRITTEN}/{name}.pack"))
    except MissingObject:
        written.catalogue(reload=True)
        good, gone = {}, True
    except ValueError:
        good = {}
    seen: dict[str, dict[str, bytes]] = {}
    out: list[tuple[str, bytes | None]] = []
    for key in keys:
        data = bytes(good[key]) if key in good else from_written(written, key, seen) if gone else None
        out.append((key, data if data is not None else read(key)))
    return out


def from_written(written: WrittenPacks, key: str, seen: dict[str, dict[str, bytes]]) -> bytes | None:
    """``key``'s ``.npy`` bytes from its written pack (:mod:`labswarm.store.written`), ``None`` when in none or
    damaged there; each pack read once into ``seen`` (name → its sound arrays), the packs listed again when its pack
    is found gone (rewritten by gc since the listing)."""
    for _ in range(2):
        found = written.find(key)
        if found is None:
            return None
        if found.name not in seen:
            try:
                _entries, good, _bad = unpack(written.origin.get_bytes(f"{WRITTEN}/{found.name}.pack"))
            except MissingObject:  # rewritten by gc since the listing: listed again
                written.catalogue(reload=True)
                continue
            except ValueError:
                return None
            seen[found.name] = {k: bytes(v) for k, v in good.items()}
        return seen[found.name].get(key)
    return None


@dataclass(frozen=True, slots=True)
class PackUsage:
    """The packs of a store: ``packs`` objects holding ``arrays`` arrays in ``bytes`` bytes (their ``.json``
    indexes not counted)."""

    packs: int
    arrays: int
    bytes: int


def pack_usage(origin: Storage, threads: int = THREADS) -> PackUsage:
    """What the packs of a store hold (one listing and one GET of each pack's index).

    Raises:
        StorageError: the storage cannot be listed.
    """
    catalogue = load_catalogue(origin, threads=threads)
    return PackUsage(len(catalogue.names), len(catalogue.keys), catalogue.bytes)


def check_pack(origin: Storage, name: str) -> str | None:
    """What is wrong with pack ``name`` (its object read whole), ``None`` when it is sound: it is a pack, its
    header is its ``.json`` index, and every array's bytes match their CRC-32C and their ``.npy`` header's size."""
    try:
        entries, _good, bad = unpack(origin.get_bytes(f"{PACKS}/{name}.pack"))
        if entries != read_index(origin, name):
            return "its header differs from its .json index"
    except StorageError as exc:
        return f"cannot be read: {exc}"
    except ValueError as exc:
        return str(exc)
    if bad:
        key, reason = next(iter(bad.items()))
        return f"{len(bad)} of its {len(entries)} arrays damaged, e.g. {key}: {reason}"
    return None


def stale_packs(origin: Storage, doomed: set[str], *, earlier: Collection[str] = (),
                stored: Collection[str] = (), threads: int = THREADS) -> dict[str, int]:
    """The packs holding a key of ``doomed`` (removed by ``gc``), and of the packs ``earlier`` (listed before the
    store's entries were) those holding a key not in ``stored`` (that listing: removed since, e.g. by a ``gc``
    stopped before its packs went); name → bytes of the pack object. A pack made after the entries were listed
    holds keys written since, in no listing: it is stale only for a key of ``doomed``.

    Raises:
        StorageError: the storage cannot be listed.
    """
    known: dict[str, list[Entry]] = {}
    catalogue = load_catalogue(origin, known, threads)
    sizes = list_packs(origin)
    earlier, stored = set(earlier), set(stored)
    return {name: sizes[name][0] for name in catalogue.names if name in sizes and any(
        e.key in doomed or (name in earlier and e.key not in stored) for e in known[name])}


def remove_pack(origin: Storage, name: str) -> None:
    """Remove pack ``name``: its index first (readers find packs through it), then the pack.

    Raises:
        StorageError: the storage failed.
    """
    origin.delete(f"{PACKS}/{name}.json")
    origin.delete(f"{PACKS}/{name}.pack")
