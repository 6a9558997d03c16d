"""``labswarm train``'s trainings reused: a model file of the same configuration, data and code is not trained
again (issue 29, item 4; ``labswarm run``'s training jobs are reused by the jobs service, see
:func:`labswarm.run.training.train_job`).

Beside a model file ``<home>/models/<experiment>-<fingerprint>.pt`` the training that completed it writes
``<...>.provenance.json``: the :class:`~labswarm.train.provenance.Provenance` (configuration, data, code, key),
when it completed, and the held-out result (its last metrics record). The record is removed when a training of
that file starts, so a training that did not complete leaves none and is never reused.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from labswarm.train.provenance import Provenance

#: The suffix of a model file's provenance record.
SUFFIX = ".provenance.json"


def record_path(model: Path) -> Path:
    """The provenance record of the model file ``model``."""
    return model.with_name(model.name + SUFFIX)


def earlier(model: Path, provenance: Provenance) -> dict[str, Any] | None:
    """The record of a completed training of ``model`` with the same ``provenance`` key, when the model file is
    still there: ``{configuration, data, code, key, completed (ISO time), final (metrics record)}``; ``None``
    otherwise (no record, an unreadable one, another key, or no model file)."""
    path = record_path(model)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("key") != provenance.key or not model.is_file():
        return None
    return record


def forget(model: Path) -> None:
    """Remove ``model``'s record: a training of it starts (see the module)."""
    record_path(model).unlink(missing_ok=True)


def remember(model: Path, provenance: Provenance, final: dict[str, Any]) -> Path:
    """Write ``model``'s record after a completed training whose last metrics record is ``final``.

    Raises:
        OSError: the record cannot be written.
    """
    path = record_path(model)
    record = {**provenance.as_dict(), "completed": datetime.now(UTC).isoformat(timespec="seconds"), "final": final}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=2, default=str))
    tmp.replace(path)
    return path
