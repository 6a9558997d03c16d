"""Operations on a whole feature store: what it holds per experiment and feature (``du``), whether every entry is
sound (``verify``), and removing what no registered experiment references (``gc``).

The store knows keys, not experiments: a key is a hash of a sample's inputs (:mod:`labswarm.store.keys`). Which
keys an experiment references is derived from its configuration by the caller (``labswarm store``, which asks
the manager for the registered experiments) and passed here as sets of keys, by experiment and feature output.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from labswarm.errors import StorageError, StoreError
from labswarm.store.orphans import find_orphans, honours_conditional_delete, remove_orphans, remove_stale_aside
from labswarm.store.packer import PackUsage, check_pack, remove_pack, stale_packs
from labswarm.store.packfmt import MAGIC, unpack
from labswarm.store.packs import list_packs
from labswarm.store.store import FeatureStore
from labswarm.store.written import WRITTEN, WrittenPacks

#: Experiment name → feature output name → the keys of that feature for every sample of the experiment.
References = Mapping[str, Mapping[str, Iterable[str]]]


@dataclass(frozen=True, slots=True)
class Usage:
    """One row of ``du``: of ``referenced`` keys, ``arrays`` are stored, taking ``bytes`` bytes."""

    experiment: str
    feature: str
    referenced: int
    arrays: int
    bytes: int


def disk_usage(sizes: Mapping[str, int], references: References, packs: PackUsage | None = None,
               unindexed: Mapping[str, int] | None = None) -> list[Usage]:
    """Per experiment and feature, the arrays of the store it references; then one row ``("(none)", "-")`` for the
    arrays that no experiment references, with ``packs`` one row ``("(packs)", "<n> packs")`` for the copies
    of arrays in packs (:mod:`labswarm.store.packs`), and with ``unindexed`` one row ``("(orphans)", "<n> objects")``
    for the written packs' objects no reader sees (:func:`labswarm.store.orphans.find_orphans`, of any age:
    a write in progress among them). An array shared by two experiments counts in both rows.

    Args:
        sizes: the store's entries, key → bytes (:meth:`FeatureStore.sizes`).
        references: see :data:`References`.
        packs: what the store's packs hold (:func:`labswarm.store.packs.pack_usage`).
        unindexed: the written packs' orphans, key → bytes.
    """
    rows, seen = [], set()
    for experiment, features in sorted(references.items()):
        for feature, keys in sorted(features.items()):
            wanted = set(keys)
            held = wanted & sizes.keys()
            seen |= held
            rows.append(Usage(experiment, feature, len(wanted), len(held), sum(sizes[k] for k in held)))
    orphans = sizes.keys() - seen
    rows.append(Usage("(none)", "-", 0, len(orphans), sum(sizes[k] for k in orphans)))
    if packs is not None and packs.packs:
        rows.append(Usage("(packs)", f"{packs.packs} packs", 0, packs.arrays, packs.bytes))
    if unindexed:
        rows.append(Usage("(orphans)", f"{len(unindexed)} objects", 0, 0, sum(unindexed.values())))
    return rows


def check_entry(data: bytes) -> str | None:
    """What is wrong with one stored entry's bytes, ``None`` when it is sound: it decodes as an ``.npy`` array
    (no pickled objects), its size is exactly its header's record (shape × item size after the header: nothing
    cut off, nothing appended), and it holds no NaN."""
    handle = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(handle)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
            np.lib.format.read_array_header_2_0
        shape, _fortran, dtype = read_header(handle)
        if dtype.hasobject:
            return "holds Python objects"
        expected = handle.tell() + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if len(data) != expected:
            return f"{len(data)} bytes where its header {shape} {dtype} records {expected}"
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, EOFError, OSError) as exc:
        return f"does not decode: {exc}"
    if np.issubdtype(array.dtype, np.floating) and np.isnan(array).any():
        return "holds NaN"
    return None


@dataclass(slots=True)
class Verified:
    """What ``verify`` found: ``checked`` entries and ``packs``, ``problems`` key (``pack <name>`` for a pack) →
    reason."""

    checked: int = 0
    problems: dict[str, str] = field(default_factory=dict)
    packs: int = 0


def verify(store: FeatureStore, keys: Iterable[str] | None = None, *, threads: int = 8) -> Verified:
    """Read every entry (or those of ``keys`` that are stored) from where the store keeps it (behind any cache:
:attr:`FeatureStore.origin`) and check it (:func:`check_entry`); with ``keys`` ``None``, every pack too
(:func:`labswarm.store.packs.check_pack`: a damaged array, a header unlike its index).

    Args:
        store: the store.
        keys: the entries to check; ``None``: all.
        threads: parallel reads (an object store answers each in ~ms).

    Raises:
        StoreError: the store cannot be listed.
    """
    stored = store.sizes(packed=False)
    todo = sorted(stored if keys is None else set(keys) & stored.keys())
    origin = store.origin
    written = store.written
    packed = {} if written is None else store._call(written.sizes)
    wanted = set(packed if keys is None else set(keys) & packed.keys()) - stored.keys()
    result = Verified(checked=len(todo) + len(wanted))

    def one(key: str) -> tuple[str, str | None]:
        try:
            data = origin.get_bytes(store.relpath(key))
        except StorageError as exc:  # a reason per entry, not a failed run
            return key, f"cannot be read: {exc}"
        return key, check_entry(data)

    with ThreadPoolExecutor(max(1, threads)) as pool:
        for key, problem in pool.map(one, todo):
            if problem is not None:
                result.problems[key] = problem
        if keys is None:
            names = sorted(store._call(lambda: list_packs(origin)))
            result.packs = len(names)
            for name, problem in zip(names, pool.map(lambda n: check_pack(origin, n), names), strict=True):
                if problem is not None:
                    result.problems[f"pack {name}"] = problem
        if written is not None and (keys is None or wanted):
            result.packs += check_written(store, written, wanted, result.problems, pool, whole=keys is None)
    if written is not None and keys is None:
        for key, stamp in store._call(partial(find_orphans, written.origin)).items():
            result.problems[f"orphan {key}"] = (f"{stamp.size:,} bytes no reader sees (its pack or index missing): "
                                                "gc removes")
    return result


def check_written(store: FeatureStore, written: WrittenPacks, wanted: set[str], problems: dict[str, str],
                  pool: ThreadPoolExecutor, *, whole: bool) -> int:
    """Check the written packs (:mod:`labswarm.store.written`): with ``whole`` every one and each of its arrays,
    else those holding a key of ``wanted`` and those arrays. An array's problem (CRC-32C, cut off, not a sound
    ``.npy``: :func:`check_entry`) is recorded under its key in ``problems``, a pack's own (unreadable, not a pack, a
    header unlike its index or of another length, bytes after its last array) under ``written pack <name>`` and
    under each key it should hold that is checked.

    Returns:
        The packs checked.

    Raises:
        StoreError: the packs cannot be listed.
    """
    catalogue = store._call(lambda: written.catalogue(reload=True))
    index = {name: written._known.get(name, []) for name in catalogue.names}
    starts = dict(zip(catalogue.names, catalogue.starts, strict=True))  # from each index's size
    names = list(index) if whole else sorted({n for n, es in index.items() if any(e.key in wanted for e in es)})

    def one(name: str) -> tuple[str, str | None, dict[str, str]]:
        checked = {e.key for e in index[name] if whole or e.key in wanted}
        try:
            blob = store.origin.get_bytes(f"{WRITTEN}/{name}.pack")
            entries, good, bad = unpack(blob)
        except (StorageError, ValueError) as exc:
            reason = f"cannot be read: {exc}" if isinstance(exc, StorageError) else str(exc)
            return name, reason, dict.fromkeys(checked, f"its pack {name}: {reason}")
        found = {k: f"in its pack: {why}" for k, why in bad.items() if k in checked}
        found.update((k, f"in its pack: {why}") for k, data in good.items()
                     if k in checked and (why := check_entry(bytes(data))) is not None)
        start = len(MAGIC) + 4 + int.from_bytes(blob[len(MAGIC):len(MAGIC) + 4], "little")
        end = start + max((e.offset + e.length for e in entries), default=0)
        problem = ("its header differs from its .json index" if entries != index[name] else
                   "its header length differs from its index (readers locate its arrays by the index)"
                   if start != starts[name] else
                   f"{len(blob) - end} bytes after its last array" if len(blob) != end else None)
        return name, problem, found

    for name, problem, found in pool.map(one, names):
        problems.update(found)
        if problem is not None:
            problems[f"written pack {name}"] = problem
    return len(names)


@dataclass(frozen=True, slots=True)
class Collected:
    """What ``gc`` removed (or would remove with ``dry_run``): ``arrays`` entries of ``bytes`` bytes; ``kept``
    entries that an experiment references; ``packs`` read-side packs of ``pack_bytes`` bytes that held a removed
    array; ``rewritten`` written packs that held removed and kept arrays, rewritten with the kept ones (those of
    removed arrays only are removed: :meth:`labswarm.store.written.WrittenPacks.remove`); ``orphans`` objects of
    ``orphan_bytes`` bytes, written packs with no index or indexes with no pack, older than
    :data:`~labswarm.store.orphans.ORPHAN_S` (:func:`~labswarm.store.orphans.find_orphans`; none where the server
    ignores conditional deletes: :func:`~labswarm.store.orphans.honours_conditional_delete`). A written pack
    left as it is (a kept array damaged in it) counts none of its arrays in ``arrays``; a dry run counts it in
    ``rewritten``."""

    arrays: int
    bytes: int
    kept: int
    dry_run: bool
    packs: int = 0
    pack_bytes: int = 0
    rewritten: int = 0
    orphans: int = 0
    orphan_bytes: int = 0


def collect_garbage(store: FeatureStore, references: References, *, dry_run: bool = False) -> Collected:
    """Remove every entry no experiment of ``references`` references.

    The caller must pass every registered experiment: an entry of one left out is removed. An entry written
    while this runs (its key listed after the listing here) is never removed. A pack that holds a removed entry (or
    one no longer stored) goes too (:mod:`labswarm.store.packs`: a copy for reading; the entries it held that
    are kept are read one by one until packed again); a pack made while this runs goes only if it holds a removed
    entry. The written packs' orphans go last, each only while it is the object listed, and only after a probe
    shows the server honours conditional deletes (:mod:`labswarm.store.orphans`; otherwise left, with a warning);
    a storage of files has its crash leftovers of such deletes removed.

    Raises:
        StoreError: the store cannot be listed, or an entry cannot be removed.
    """
    keep = {key for features in references.values() for keys in features.values() for key in keys}
    origin = store.origin
    earlier = store._call(lambda: list_packs(origin))  # before the entries: each of their keys was stored then
    alone = store.sizes(packed=False)
    sizes = alone if store.written is None else {**store._call(store.written.sizes), **alone}
    doomed = sorted(sizes.keys() - keep)
    removed = {key for key in doomed if key in alone}
    for key in [] if dry_run else removed:
        store._call(partial(origin.delete, store.relpath(key)))
    rewritten = 0
    if store.written is not None:  # its packs of removed arrays only go, those of kept ones too are rewritten
        done = store._call(partial(store.written.remove, set(doomed), dry_run=dry_run))
        rewritten, removed = done.rewritten, removed | done.keys  # a key of a pack left as it was: not removed
    gone = set(doomed)
    stale = store._call(lambda: stale_packs(origin, gone, earlier=earlier, stored=sizes.keys() - gone))
    for name in [] if dry_run else stale:
        store._call(partial(remove_pack, origin, name))
    written = store.written
    if not dry_run:
        store._call(partial(remove_stale_aside, origin))
    orphans = {} if written is None else store._call(partial(find_orphans, written.origin))
    if written is not None and orphans and not dry_run:  # counted: those removed (one written again stays)
        honoured = store._call(partial(honours_conditional_delete, written.origin))
        gone_orphans = set(store._call(partial(remove_orphans, written.origin, orphans))) if honoured else set()
        orphans = {key: stamp for key, stamp in orphans.items() if key in gone_orphans}
    return Collected(len(removed), sum(sizes[k] for k in removed), len(sizes) - len(doomed), dry_run, len(stale),
                     sum(stale.values()), rewritten, len(orphans), sum(s.size for s in orphans.values()))


def require_references(references: References) -> None:
    """Refuse to collect garbage with no experiment to keep (e.g. the manager answered an empty list by
    mistake): everything would go.

    Raises:
        StoreError: ``references`` is empty or references no key at all.
    """
    if not any(any(True for _ in keys) for features in references.values() for keys in features.values()):
        raise StoreError("no registered experiment references any array: refusing to remove the whole store "
                         "(delete the folder or bucket prefix by hand if that is what you want)")
