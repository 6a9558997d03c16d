"""Where a training job's files live in its results store, and the checkpoint pointer that commits them.

Every job owns the folder ``jobs/<job_id>/`` of its results store (:func:`job_storage`); deleting the job deletes
that folder and nothing else (never the user's data)::

    jobs/<job_id>/
      checkpoints/attempt-<n>/epoch-<NNNN>.pt             after epoch NNNN
      checkpoints/attempt-<n>/epoch-<NNNN>.rank-<r>.pt    rank r's copy (a distributed job's other ranks)
      checkpoints/attempt-<n>/epoch-<NNNN>-step-<SSSSSS>.pt  a halt after step SSSSSS of epoch NNNN + 1
      checkpoints/attempt-<n>/epoch-<NNNN>-step-<SSSSSS>.rank-<r>.pt  rank r's (its own step: asynchronous ranks differ)
      checkpoints/attempt-<n>/files/...                   a ``command`` learner's checkpoint folder
      checkpoints/latest.json                             the pointer: the last committed checkpoint
      metrics.jsonl                                       one record per epoch, as far as the pointer goes
      logs/attempt-<n>/learner-<rank>.log                 each learner's output
      logs/attempt-<n>/chunks-<rank>.jsonl                a distributed learner's chunks (pass, chunk, owner, ids)
      model/model.pt                                      the trained model (``labswarm`` framework)
      results/...                                         a ``command`` learner's results folder

A checkpoint counts only once the pointer names it: the checkpoint and the metrics up to it are written first,
the pointer last (one atomic object write), so a learner killed at any moment leaves the previous pointer and
whole files behind it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from labswarm.errors import StorageError
from labswarm.storage.base import MissingObject, Storage, StorageConfig

#: The pointer to the last committed checkpoint, relative to the job's folder.
POINTER_KEY = "checkpoints/latest.json"
#: The job's metrics log (JSON lines, one record per epoch), relative to the job's folder.
METRICS_KEY = "metrics.jsonl"
#: The trained model, relative to the job's folder.
MODEL_KEY = "model/model.pt"
#: A ``command`` learner's results folder, relative to the job's folder.
RESULTS_PREFIX = "results"


def job_storage(spec: Mapping[str, Any] | StorageConfig, job_id: str) -> Storage:
    """The view of the results store ``spec`` that holds the files of job ``job_id`` (``jobs/<job_id>``).

    Raises:
        ConfigError: invalid spec.
        StorageError: ``job_id`` is not a valid key segment.
    """
    return Storage.from_spec(spec).at(f"jobs/{job_id}")


def attempt_prefix(attempt: int) -> str:
    """``checkpoints/attempt-<n>``: the checkpoints of one attempt."""
    return f"checkpoints/attempt-{attempt}"


def checkpoint_key(attempt: int, epochs_done: int, step: int | None = None) -> str:
    """The key of a checkpoint taken by ``attempt`` after ``epochs_done`` epochs (and ``step`` steps of the
    next one, for a mid-epoch checkpoint)."""
    name = f"epoch-{epochs_done:04d}" + (f"-step-{step:06d}" if step is not None else "")
    return f"{attempt_prefix(attempt)}/{name}.pt"


def rank_checkpoint_key(key: str, rank: int) -> str:
    """The key of rank ``rank``'s copy of the checkpoint ``key`` in a distributed job: ``key`` itself for rank 0
    (the one the pointer names: it carries the global cursor), ``...epoch-NNNN.rank-<r>.pt`` for the others (their
    own replica and framework state)."""
    return key if rank == 0 else f"{key.removesuffix('.pt')}.rank-{rank}.pt"


def latest_rank_copy(storage: Storage, rank: int, min_epoch: int = 0) -> str | None:
    """Rank ``rank``'s newest own checkpoint copy (:func:`rank_checkpoint_key`) in any attempt, by (attempt, epochs
    done, step; an epoch's end before the next epoch's steps), among those covering at least ``min_epoch`` epochs.
    An asynchronous rank stops at its own step, so its copy's key need not match rank 0's (the pointer's).

    Raises:
        StorageError: the store cannot be listed.
    """
    found = []
    for key in storage.list("checkpoints"):
        match = _RANK_COPY.fullmatch(key)
        if match is not None and int(match["rank"]) == rank and int(match["epoch"]) >= min_epoch:
            step = int(match["step"]) if match["step"] is not None else -1
            found.append((int(match["attempt"]), int(match["epoch"]), step, key))
    return max(found)[3] if found else None


_RANK_COPY = re.compile(r"checkpoints/attempt-(?P<attempt>\d+)/epoch-(?P<epoch>\d+)(?:-step-(?P<step>\d+))?"
                        r"\.rank-(?P<rank>\d+)\.pt")


def is_rank_copy(key: str) -> bool:
    """Whether ``key`` is another rank's copy (:func:`rank_checkpoint_key`), which rank 0's commit leaves alone."""
    return ".rank-" in key.rsplit("/", 1)[-1]


def log_key(attempt: int, rank: int) -> str:
    """``logs/attempt-<n>/learner-<rank>.log``."""
    return f"logs/attempt-{attempt}/learner-{rank}.log"


def chunks_key(attempt: int, rank: int) -> str:
    """``logs/attempt-<n>/chunks-<rank>.jsonl``: a distributed learner's chunk record
    (:mod:`labswarm.train.distributed.record`)."""
    return f"logs/attempt-{attempt}/chunks-{rank}.jsonl"


def commit_checkpoint(storage: Storage, key: str, *, attempt: int, epochs_done: int, step: int | None = None,
                      kind: str = "file") -> dict[str, Any]:
    """Write the pointer naming the checkpoint ``key`` (already stored, with the metrics up to it).

    Args:
        storage: the job's view (:func:`job_storage`).
        key: the checkpoint's key (a file, or a folder for ``kind="folder"``).
        attempt: the attempt that took it.
        epochs_done: epochs it covers.
        step: steps of the next epoch it covers (a mid-epoch checkpoint), else ``None``.
        kind: ``file`` (a trainer checkpoint) or ``folder`` (a ``command`` learner's checkpoint folder).

    Returns:
        The pointer as written: ``{key, kind, attempt, epoch, step, time}``.

    Raises:
        StorageError: the store refused the write.
    """
    pointer = {"key": key, "kind": kind, "attempt": attempt, "epoch": epochs_done, "step": step,
               "time": datetime.now(UTC).isoformat(timespec="milliseconds")}
    storage.put_bytes(POINTER_KEY, json.dumps(pointer).encode())
    return pointer


def latest_checkpoint(storage: Storage) -> dict[str, Any] | None:
    """The pointer of the last committed checkpoint (see :func:`commit_checkpoint`), ``None`` when there is none.

    Raises:
        StorageError: the store cannot be read, or the pointer is not valid JSON.
    """
    try:
        data = storage.get_bytes(POINTER_KEY)
    except MissingObject:
        return None
    try:
        pointer = json.loads(data)
    except ValueError as exc:
        raise StorageError(f"{storage.describe(POINTER_KEY)} is not valid JSON: {exc}") from None
    if not isinstance(pointer, dict) or "key" not in pointer:
        raise StorageError(f"{storage.describe(POINTER_KEY)} is not a checkpoint pointer")
    return pointer
