"""The ``labswarm compare`` runs the dashboard shows: ``<home>/compare/<run>/compare.json``
(:mod:`labswarm.compare.run` writes it; ``labswarm compare`` puts its output there by default when run beside
a manager's home).

Who sees a run: an admin (or the open manager's local caller) every run; a user only the runs whose
``compare.json`` names them as ``owner`` (``labswarm compare --owner NAME``); a run without an owner is an
admin's. A run name is one folder name under ``<home>/compare``: anything else is not found.
"""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from labswarm.errors import NotFound
from labswarm.settings import COMPARE_DIR

log = logging.getLogger(__name__)

#: A run's folder name: what ``labswarm compare`` makes (a UTC stamp), or any plain name a person gave.
RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
#: Runs listed at most (the newest).
MAX_RUNS = 200


def runs_folder(home: Path) -> Path:
    """Where the manager looks for comparison runs: ``<home>/compare`` (``home``: ``LABSWARM_HOME``)."""
    return Path(home) / COMPARE_DIR


def _visible(data: dict[str, Any], owner: str | None) -> bool:
    return owner is None or (data.get("owner") is not None and data.get("owner") == owner)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        log.info("comparison %s unreadable: %s", path, exc)
        return None
    return data if isinstance(data, dict) and isinstance(data.get("rows"), list) else None


def list_runs(home: Path, owner: str | None = None) -> list[dict[str, Any]]:
    """The comparison runs under ``<home>/compare``, newest first (at most :data:`MAX_RUNS`).

    Args:
        home: the manager's home folder.
        owner: only the runs recorded with this owner; ``None``: every run (an admin).

    Returns:
        Per run: ``run`` (its folder name), ``experiment``, ``learners``, ``epochs``, ``owner``, ``frameworks``
        (names), ``written_at`` (the file's modification time, UTC). Unreadable files are skipped (logged).
    """
    folder = runs_folder(home)
    if not folder.is_dir():
        return []
    found = []
    for path in folder.glob("*/compare.json"):
        if RUN_NAME.match(path.parent.name):
            try:
                found.append((path.stat().st_mtime, path))
            except OSError:
                continue
    runs = []
    for mtime, path in sorted(found, reverse=True)[:MAX_RUNS]:
        data = _read(path)
        if data is None or not _visible(data, owner):
            continue
        runs.append({"run": path.parent.name, "experiment": data.get("experiment"), "learners": data.get("learners"),
                     "epochs": data.get("epochs"), "owner": data.get("owner"),
                     "frameworks": [str(r.get("framework")) for r in data["rows"] if isinstance(r, dict)],
                     "written_at": datetime.fromtimestamp(mtime, UTC)})
    return runs


def load_run(home: Path, run: str, owner: str | None = None) -> dict[str, Any]:
    """One comparison run: its ``compare.json`` as written, with ``run`` (its folder name).

    Raises:
        NotFound: no such run, an unreadable one, or (``owner`` given) one not recorded with that owner.
    """
    path = runs_folder(home) / run / "compare.json"
    data = _read(path) if RUN_NAME.match(run) and path.is_file() else None
    if data is None or not _visible(data, owner):
        raise NotFound(f"no comparison run {run!r}")
    return {**data, "run": run}
