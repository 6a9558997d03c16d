"""``labswarm store pack EXPERIMENT``: copy an experiment's arrays of a remote store into packs
(:mod:`labswarm.store.packs`), so that a cold cache is filled with one request per pack instead of one per array."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated

import typer

from labswarm.cli.output import console, err
from labswarm.cli.sessions import DEFAULT_MANAGER, Manager, TokenFile
from labswarm.cli.store import Json, _experiment, _keys, _mb, _open, _run, store_app
from labswarm.errors import ConfigError
from labswarm.store.packer import Packed, pack
from labswarm.store.packs import PACK_BYTES


@store_app.command("pack")
def pack_command(
        experiment: Annotated[str, typer.Argument(help="Its YAML file or a registered experiment's name.")],
        manager: Manager = DEFAULT_MANAGER, token_file: TokenFile = None,
        pack_mb: Annotated[float, typer.Option("--pack-mb", min=0.001, help="The most MiB of arrays in one pack.")] =
        PACK_BYTES / 2**20,
        threads: Annotated[int, typer.Option(min=1, help="Parallel requests.")] = 8,
        as_json: Json = False) -> None:
    """Copy the experiment's computed arrays that are in no pack yet into packs of its remote store (the arrays
    stay where they are too: packs are read by the machines' caches; `store gc` removes a pack once one of its
    arrays goes). Run it once the experiment's features are computed; a store folder has no use for packs
    (exit 2)."""
    def work() -> Packed:
        config = _experiment(experiment, manager, token_file)
        if config.store.remote is None:
            raise ConfigError([("store", f"experiment {config.name}'s store is a folder: packs serve the caches of "
                                         "a remote store (store.remote)")])
        store = _open(config)
        keys, failed = _keys(config, store)
        if failed:
            err.print(f"[yellow]warning:[/] {len(failed)} samples whose keys cannot be derived, e.g. {failed[0]}",
                      highlight=False)
        return pack(store, sorted({k for ks in keys.values() for k in ks}), pack_bytes=int(pack_mb * 2**20),
                    threads=threads)

    done = _run(work)
    if as_json:
        print(json.dumps(asdict(done), indent=2))
        return
    console.print(f"wrote {done.packs:,} packs of {done.arrays:,} arrays ({_mb(done.bytes)}); {done.already:,} "
                  f"arrays were packed already, {done.missing:,} not computed yet, {done.unsound:,} unsound (see "
                  "store verify)", highlight=False)
