"""``labswarm store trim --max-bytes SIZE --store FOLDER``: bring a local feature store under a size limit, the
least recently used arrays first (:mod:`labswarm.store.trim`), never an array of a running or paused session's
experiment or of a job not finished (asked of the manager with an admin's token)."""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer

from labswarm.cli.exits import FAILED
from labswarm.cli.output import console, err
from labswarm.cli.sessions import DEFAULT_MANAGER, Manager, TokenFile, _client
from labswarm.cli.store import Json, _keys, _mb, _run, _target, _where, store_app
from labswarm.config.experiment import ExperimentConfig
from labswarm.errors import ConfigError

#: Sessions in these statuses, and jobs in these, keep their experiments' arrays from ``trim``.
ACTIVE_SESSIONS = ["running", "paused"]
ACTIVE_JOBS = ["queued", "pending", "running", "halting", "halted", "storing"]


def _size(text: str) -> int:
    """Bytes of a size such as ``50G``, ``500MiB`` or ``1048576`` (K, M, G, T: powers of 1,024).

    Raises:
        ConfigError: not such a size (names ``--max-bytes``).
    """
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgt]?)(?:i?b)?", text.strip().lower())
    if match is None:
        raise ConfigError([("--max-bytes", f"a size such as 50G, 500M or 1048576 (bytes), got {text!r}")])
    return int(float(match[1]) * 1024 ** " kmgt".index(match[2] or " "))


def _active(manager: str, token_file: Path | None) -> tuple[list[ExperimentConfig], list[str]]:
    """The experiments of the running or paused sessions and of the jobs not finished (an inline experiment
    from its job's manifest), and what uses them (``session ID``, ``job ID``), asked with an admin's token.

    Raises:
        ConfigError: the token is not an admin's, or an inline experiment of a job is invalid.
    """
    from labswarm.jobs.client.client import JobsClient

    names: set[str] = set()
    inline: list[ExperimentConfig] = []
    users: list[str] = []
    with _client(manager, token_file) as client:
        if (who := client.whoami())["role"] != "admin":
            raise ConfigError([("token", f"{who['name']} is not an admin: a user's token sees only that user's "
                                         "sessions and jobs, whose arrays alone would be kept; use an admin's token")])
        offset = 0
        while page := client.sessions(status=ACTIVE_SESSIONS, limit=1000, offset=offset):
            names |= {row["experiment"] for row in page}
            users += [f"session {row['id']}" for row in page]
            offset += len(page)
        from labswarm.settings import load_settings

        token = token_file.read_text().strip() if token_file is not None else load_settings().api_token
        with JobsClient(manager, token or None) as jobs:  # the token _client gives the client above
            offset, total = 0, 1
            while offset < total:
                listed = jobs.list(status=ACTIVE_JOBS, offset=offset, limit=50)
                total, offset = listed["total"], offset + max(len(listed["jobs"]), 1)
                for row in listed["jobs"]:
                    users.append(f"job {row['id']}")
                    experiment = jobs.show(row["id"])["manifest"]["experiment"]
                    if isinstance(experiment, dict):
                        inline.append(ExperimentConfig.model_validate(experiment))
                    else:
                        names.add(experiment)
        configs = [ExperimentConfig.model_validate(client.experiment_config(name)) for name in sorted(names)]
    return configs + inline, users


@store_app.command("trim")
def trim_command(max_bytes: Annotated[str, typer.Option("--max-bytes", help="The size limit: 50G, 500M, bytes.")],
                 store: Annotated[Path, typer.Option("--store", help="A local feature-store folder.")],
                 manager: Manager = DEFAULT_MANAGER, token_file: TokenFile = None,
                 dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would go; remove nothing.")] = False,
                 as_json: Json = False) -> None:
    """Bring a local store under a size limit: the least recently used arrays go first (last access or write),
    never an array of a running or paused session's experiment or of a job not finished (asked of the manager
    with an admin's token; exit 2 when a user's, or when such an experiment's keys cannot all be derived). Exits
    1 when the protected arrays alone exceed the limit. A remote store's cache is bounded by store.cache_bytes."""
    from labswarm.store.trim import trim

    def work() -> Any:
        limit = _size(max_bytes)
        feature_store, where, _config = _target(None, store, manager, token_file)
        configs, users = _active(manager, token_file)
        protected: set[str] = set()
        for config in configs:
            if _where(config) != where:
                continue
            keys, failed = _keys(config, feature_store)
            if failed:
                raise ConfigError([(config.name, f"cannot tell which arrays it uses ({len(failed)} samples, e.g. "
                                                 f"{failed[0]}); fix it, or stop what uses it, then trim")])
            protected |= {k for ks in keys.values() for k in ks}
        return trim(feature_store, limit, protected, dry_run=dry_run), limit, users

    done, limit, users = _run(work)
    if as_json:
        print(json.dumps({**asdict(done), "max_bytes": limit, "users": users}, indent=2))
    else:
        verb = "would remove" if dry_run else "removed"
        console.print(f"{verb} {done.arrays:,} arrays ({_mb(done.bytes)}); the store holds {_mb(done.remaining)} "
                      f"of its {_mb(limit)} limit, {_mb(done.protected)} of them in use by {len(users)} sessions "
                      "and jobs", highlight=False)
    if done.over:
        err.print("[yellow]warning:[/] the arrays in use alone exceed the limit", highlight=False)
        raise typer.Exit(FAILED)

