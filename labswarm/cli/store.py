"""``labswarm store ...``: what a feature store holds (``du``, ``ls``), whether it is sound (``verify``), removing
the arrays no registered experiment references (``gc``), warming a machine's cache of a remote store (``pull``),
copying an experiment's arrays into packs for the caches (``pack``: :mod:`labswarm.cli.store_pack`), and bringing a
local store under a size limit (``trim``: :mod:`labswarm.cli.store_trim`).

The store is an experiment's (``--experiment``: a YAML file or a registered experiment's name, whose ``store``
section says where it is, a folder or a remote storage) or a local folder (``--store``). ``du`` and ``gc`` ask the
manager (``--manager``, the API token from ``LABSWARM_API_TOKEN`` or ``--token-file``) for the registered
experiments and derive the keys each references (every sample of its dataset × its features: the audio files
are read, three 64 KiB blocks each); experiments whose store is another one are left aside.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from labswarm.cli.exits import FAILED
from labswarm.cli.output import console, err, fail
from labswarm.cli.sessions import DEFAULT_MANAGER, Manager, TokenFile, _client
from labswarm.config.experiment import ExperimentConfig, load_experiment
from labswarm.errors import ConfigError, LabswarmError
from labswarm.pipeline.features import FeaturesBlock
from labswarm.sample import iter_samples
from labswarm.storage.base import MissingObject
from labswarm.storage.cache import CachedStorage
from labswarm.store.ops import References, collect_garbage, disk_usage, require_references, verify
from labswarm.store.orphans import find_orphans
from labswarm.store.packer import pack_usage
from labswarm.store.store import FeatureStore

store_app = typer.Typer(help="What a feature store holds, checking it, removing what no registered experiment "
                        "references, and warming a machine's cache of a remote store.", no_args_is_help=True)

ExperimentRef = Annotated[str | None, typer.Option(
    "--experiment", "-e", help="The store of this experiment: its YAML file or a registered experiment's name.")]
StorePath = Annotated[Path | None, typer.Option("--store", help="A local feature-store folder.")]
Json = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]


def _experiment(ref: str, manager: str, token_file: Path | None) -> ExperimentConfig:
    """The experiment of a YAML file, or the registered one of that name (asked of the manager)."""
    if ref.endswith((".yml", ".yaml")) or os.path.isfile(ref):
        return load_experiment(ref)
    with _client(manager, token_file) as client:
        return ExperimentConfig.model_validate(client.experiment_config(ref))


def _open(config: ExperimentConfig) -> FeatureStore:
    return FeatureStore.open(config.store.root, remote=config.store.remote, cache_bytes=config.store.cache_bytes)


def _where(config: ExperimentConfig) -> str:
    """What identifies an experiment's store: the remote's location, else the folder's real path."""
    remote = config.store.remote
    if remote is not None:
        data = remote.model_dump(mode="json")
        return json.dumps({k: v for k, v in data.items() if k not in ("credentials_file", "profile")}, sort_keys=True)
    return os.path.realpath(config.store.root)


def _target(experiment: str | None, store: Path | None, manager: str,
            token_file: Path | None) -> tuple[FeatureStore, str, ExperimentConfig | None]:
    """The store a command works on, its identity (:func:`_where`) and the experiment that named it."""
    if (experiment is None) == (store is None):
        raise ConfigError([("--experiment/--store", "name exactly one: an experiment, or a local store folder")])
    if store is not None:
        if not store.is_dir():
            raise ConfigError([("--store", f"no folder {store}")])
        return FeatureStore(store), os.path.realpath(store), None
    assert experiment is not None
    config = _experiment(experiment, manager, token_file)
    return _open(config), _where(config), config


def _keys(config: ExperimentConfig, store: FeatureStore) -> tuple[dict[str, set[str]], list[str]]:
    """The keys ``config`` references, by feature output, and the samples whose keys could not be derived."""
    block = FeaturesBlock(config, store=store)
    keys: dict[str, set[str]] = {ex.output_name: set() for ex in block.extractors}
    failed = []
    for sample in iter_samples(config):
        try:
            for name, key in block.keys(sample).items():
                keys[name].add(key)
        except LabswarmError as exc:
            failed.append(f"{sample.id}: {exc}")
    return keys, failed


def _references(store: FeatureStore, where: str, manager: str, token_file: Path | None,
                extra: list[ExperimentConfig], *, admin_only: bool = False) -> tuple[References, dict[str, str]]:
    """The keys that the registered experiments whose store is ``where`` (and ``extra``) reference, and the
    experiments whose keys could not all be derived, with why.

    Raises:
        ConfigError: ``admin_only`` and the token is not an admin's (it would not see every experiment).
    """
    references: dict[str, dict[str, set[str]]] = {}
    problems: dict[str, str] = {}
    configs: dict[str, ExperimentConfig] = {}
    with _client(manager, token_file) as client:
        if admin_only and (who := client.whoami())["role"] != "admin":
            raise ConfigError([("token", f"{who['name']} is not an admin: a user's token lists only that user's "
                                         "experiments, so the arrays of the others' would be collected; use an "
                                         "admin's token")])
        for row in client.experiments():
            name = row["name"]
            try:
                configs[name] = ExperimentConfig.model_validate(client.experiment_config(name))
            except LabswarmError as exc:
                problems[name] = f"its configuration: {exc}"
    for config in extra:
        configs.setdefault(config.name, config)
    for name, config in sorted(configs.items()):
        if _where(config) != where:
            continue
        try:
            keys, failed = _keys(config, store)
        except LabswarmError as exc:
            problems[name] = str(exc)
            continue
        references[name] = keys
        if failed:
            problems[name] = f"{len(failed)} samples whose keys cannot be derived, e.g. {failed[0]}"
    return references, problems


def _run(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except LabswarmError as exc:
        raise fail(exc) from None


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


@store_app.command("du")
def du(experiment: ExperimentRef = None, store: StorePath = None, manager: Manager = DEFAULT_MANAGER,
       token_file: TokenFile = None, as_json: Json = False) -> None:
    """Bytes and arrays per registered experiment and feature (an array two experiments share counts in both),
    and what no experiment references."""
    def work() -> tuple[list[Any], dict[str, str]]:
        feature_store, where, config = _target(experiment, store, manager, token_file)
        references, problems = _references(feature_store, where, manager, token_file, [config] if config else [])
        orphans = None if feature_store.written is None else {
            key: stamp.size for key, stamp in find_orphans(feature_store.origin, 0.0).items()}
        return disk_usage(feature_store.sizes(), references, pack_usage(feature_store.origin), orphans), problems

    rows, problems = _run(work)
    if as_json:
        print(json.dumps({"usage": [asdict(r) for r in rows], "problems": problems}, indent=2))
        return
    table = Table("experiment", "feature", "arrays", "of samples", "bytes", title="feature store")
    for r in rows:
        table.add_row(r.experiment, r.feature, f"{r.arrays:,}", f"{r.referenced:,}" if r.referenced else "-",
                      _mb(r.bytes))
    console.print(table)
    for name, problem in problems.items():
        err.print(f"[yellow]warning:[/] {name}: {problem}", highlight=False)


@store_app.command("ls")
def ls(experiment: ExperimentRef = None, store: StorePath = None, manager: Manager = DEFAULT_MANAGER,
       token_file: TokenFile = None,
       limit: Annotated[int | None, typer.Option(min=1, help="At most this many rows.")] = None,
       as_json: Json = False) -> None:
    """The arrays of the store: key and bytes; with --experiment, that experiment's samples: sample, feature, key,
    bytes (``-``: not computed yet)."""
    def work() -> list[dict[str, Any]]:
        feature_store, _, config = _target(experiment, store, manager, token_file)
        sizes = feature_store.sizes()
        if config is None:
            return [{"key": k, "bytes": sizes[k]} for k in sorted(sizes)[:limit]]
        block, rows = FeaturesBlock(config, store=feature_store), []
        for sample in iter_samples(config):
            for name, key in block.keys(sample).items():
                rows.append({"sample": sample.id, "feature": name, "key": key, "bytes": sizes.get(key)})
            if limit is not None and len(rows) >= limit:
                break
        return rows[:limit]

    rows = _run(work)
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    for row in rows:
        size = "-" if row["bytes"] is None else str(row["bytes"])
        console.print("\t".join([*(str(row[c]) for c in ("sample", "feature") if c in row), row["key"], size]),
                      highlight=False, soft_wrap=True)


@store_app.command("verify")
def verify_command(experiment: ExperimentRef = None, store: StorePath = None, manager: Manager = DEFAULT_MANAGER,
                   token_file: TokenFile = None, threads: Annotated[int, typer.Option(min=1)] = 8,
                   as_json: Json = False) -> None:
    """Read every array where the store keeps it (behind any cache) and check that it decodes, that its size is
    its header's shape and type, and that it holds no NaN. Exit 1 when one does not."""
    result = _run(lambda: verify(_target(experiment, store, manager, token_file)[0], threads=threads))
    if as_json:
        print(json.dumps(asdict(result), indent=2))
    else:
        for key, problem in result.problems.items():
            console.print(f"{key}: {problem}", highlight=False)
        console.print(f"{result.checked:,} arrays and {result.packs:,} packs checked, {len(result.problems):,} with a "
                      "problem")
    if result.problems:
        raise typer.Exit(FAILED)


@store_app.command("gc")
def gc(experiment: ExperimentRef = None, store: StorePath = None, manager: Manager = DEFAULT_MANAGER,
       token_file: TokenFile = None,
       dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would go; remove nothing.")] = False,
       keep: Annotated[list[Path] | None, typer.Option(
           help="An experiment file whose arrays are kept too, registered or not (repeat for several).")] = None,
       as_json: Json = False) -> None:
    """Remove the arrays that no registered experiment (nor a --keep file) references. Refuses (exit 2) when the
    keys of an experiment of this store cannot all be derived (a clip unreadable, an invalid configuration): its
    arrays would go, and when the token is not an admin's (exit 2): a user's token lists only that user's
    experiments, and the arrays of the others' would go."""
    def work() -> Any:
        feature_store, where, config = _target(experiment, store, manager, token_file)
        extra = [load_experiment(path) for path in keep or []] + ([config] if config else [])
        references, problems = _references(feature_store, where, manager, token_file, extra, admin_only=True)
        if problems:
            raise ConfigError([(name, f"cannot tell which arrays it references ({why}); fix it or delete the "
                                      "experiment, then collect") for name, why in problems.items()])
        require_references(references)
        return collect_garbage(feature_store, references, dry_run=dry_run), sorted(references)

    done, experiments = _run(work)
    if as_json:
        print(json.dumps({**asdict(done), "experiments": experiments}, indent=2))
        return
    verb = "would remove" if dry_run else "removed"
    console.print(f"{verb} {done.arrays:,} arrays ({_mb(done.bytes)}) and {done.packs:,} packs holding one of them "
                  f"({_mb(done.pack_bytes)}), {done.orphans:,} orphan objects of written packs "
                  f"({_mb(done.orphan_bytes)}); kept {done.kept:,}, the arrays of {', '.join(experiments)}",
                  highlight=False)


@store_app.command("pull")
def pull(experiment: Annotated[str, typer.Argument(help="Its YAML file or a registered experiment's name.")],
         manager: Manager = DEFAULT_MANAGER, token_file: TokenFile = None,
         threads: Annotated[int, typer.Option(min=1, help="Parallel downloads.")] = 8) -> None:
    """Copy an experiment's arrays from its remote store into this machine's cache (its store.root), so that
    training reads local files from the first epoch."""
    def work() -> tuple[int, int, int, int, FeatureStore, int]:
        config = _experiment(experiment, manager, token_file)
        feature_store = _open(config)
        cache = feature_store.storage
        if not isinstance(cache, CachedStorage):
            raise ConfigError([("store", f"experiment {config.name}'s store is not a remote one with a cache "
                                         "(store.remote and store.cache_bytes > 0): nothing to pull")])
        keys, _failed = _keys(config, feature_store)
        todo = sorted({k for ks in keys.values() for k in ks})
        before = {k for k in todo if feature_store.cached(k)}  # before the threads bring packs of several arrays

        def one(key: str) -> str:
            rel = feature_store.relpath(key)
            if key in before:
                return "cached"
            if any(r.pack_of(key) is not None and r.locate(key) is not None for r in feature_store.readers):
                return "pulled"  # with the other arrays of its pack (store pack, or a written pack)
            if (written := feature_store.written) is not None and written.find(key) is not None:
                return "too large"  # its written pack (its only copy) not cached: larger than the cache, or skipped
            try:
                return "pulled" if cache.warm(rel) else "too large"
            except MissingObject:
                return "missing"

        with ThreadPoolExecutor(threads) as pool:
            outcomes = list(pool.map(one, todo))
        for reader in feature_store.readers:  # the fetched packs written into the cache (a thread's) before counting
            reader.wait()
        pulled = sum(o == "pulled" and feature_store.cached(k) for k, o in zip(todo, outcomes, strict=True))
        return (pulled, outcomes.count("cached"), outcomes.count("missing"), cache.usage(), feature_store,
                len(todo) - pulled - outcomes.count("cached") - outcomes.count("missing"))

    pulled, cached, missing, usage, feature_store, large = _run(work)
    cache = feature_store.storage
    assert isinstance(cache, CachedStorage)
    console.print(f"pulled {pulled:,} arrays, {cached:,} were cached, {missing:,} not computed yet, {large:,} not "
                  f"cached (larger than the cache); the cache holds {_mb(usage)} of its {_mb(cache.max_bytes)}")
    if usage >= cache.max_bytes * 0.9 and pulled:
        err.print("[yellow]warning:[/] the cache is full: arrays pulled first may have been evicted; raise "
                  "store.cache_bytes", highlight=False)
