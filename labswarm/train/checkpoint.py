"""Checkpoints and the metrics log of a training run: atomic writes, and a resume that leaves no gap."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

from labswarm.errors import LabswarmError


class CheckpointError(LabswarmError):
    """A checkpoint or model file cannot be read, or belongs to another configuration."""


def save(obj: dict[str, Any], path: Path) -> None:
    """``torch.save`` to a temporary file, fsync, then rename over ``path``: a crash leaves the old file or the
    new one, never half of one."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as handle:
        torch.save(obj, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def load(path: Path, map_location: Any = "cpu") -> dict[str, Any]:
    """Read a file written by :func:`save` (``torch.load`` with ``weights_only=True``).

    Raises:
        CheckpointError: missing, unreadable, truncated, or holding objects other than tensors and plain data.
    """
    import torch

    try:  # weights_only: tensors and plain containers only, so a shared model file cannot run code when loaded
        return torch.load(path, map_location=map_location, weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError, KeyError, pickle.UnpicklingError) as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc


def append_metrics(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line to the metrics log and fsync it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The metrics log's records (a torn last line, from a crash while writing, is ignored)."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def truncate_metrics(path: Path, epochs: int) -> list[dict[str, Any]]:
    """Keep the records of epochs ``1..epochs`` (those the checkpoint covers), rewriting the log atomically;
    the training then appends from epoch ``epochs + 1``: no gap, no repeat. Returns the kept records."""
    kept = [r for r in read_metrics(path) if int(r.get("epoch", 0)) <= epochs]
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
    os.replace(tmp, path)
    return kept
