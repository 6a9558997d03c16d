"""The chunk record: which learner process trained which chunk of which pass, durable across kills and restarts.

Each learner appends one JSON line per chunk it trained (``chunks-rank-<r>.jsonl``, or the path its owner gives:
a job's learner keeps it in its working folder, which the job stores as ``logs/attempt-<n>/chunks-<rank>.jsonl``)::

    {"pass": 0, "chunk": 3, "owner": "1:1:7:9f2c01ab", "ids": [...]}    trained; written BEFORE the cursor's done
    {"pass": 0, "chunk": 3, "owner": "1:1:7:9f2c01ab", "lost": true}    its lease was lost: the line above does
                                                                         not count (the chunk's new holder trains it)

Why it holds whatever is killed when:

- **ordering**: the line is written before :meth:`~labswarm.train.distributed.cursor.GlobalCursor.done` marks the
  chunk done, so every chunk done in the cursor has its line. A process killed between the two leaves a line
  whose chunk is not done under its owner (its lease expires, another learner trains it): the record then shows
  the chunk twice, which is the truth (the dead learner's update may have reached the parameters); the owner in
  each line tells them apart from the cursor's ``D|<owner>`` mark (:func:`counted`).
- **one write per line**: each line is one ``write(2)`` on a file opened with ``O_APPEND``: once it returns, the
  line is in the kernel's page cache and survives a SIGKILL of the process (no user-space buffer to lose).
  ``fsync`` (:data:`FSYNC`) is what a power cut or a kernel crash would need; it is off by default: it costs a
  disk flush a step (measured in ``docs/guides/distributed-training.md``), and a host that dies takes its local
  working folder with it anyway.
- **append, never truncate**: a learner restarted from scratch appends to its predecessor's file (the trainer's
  fresh start wipes its run folder, so the record lives beside it, not in it), and each line names its process
  (``owner``: :func:`owner`, the cursor's owner). A swarm learner keeps its record on the shared data volume, not
  in its container (:func:`labswarm.deploy.swarm_learners.chunk_record_path`), and a learner whose working folder
  has no record yet starts it from the one its rank stored (:meth:`labswarm.jobs.learner.context.LearnerContext.
  open_chunk_record`): a replaced learner's stored lines are never overwritten.
- **one owner per incarnation**: ``rank:attempt:pid:token``, the token random: a learner restarted in a fresh
  container often gets its predecessor's pid (the container's first processes), and the same owner would let the
  dead process's line count under the replacement's done mark, or its ``lost`` line cancel the replacement's.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

#: ``os.fsync`` after each line (survives a host crash, costs a disk flush per step; see the module docstring).
FSYNC = False


def owner(rank: int, attempt: int) -> str:
    """This process's owner string in the cursor and the chunk record: ``"<rank>:<attempt>:<pid>:<token>"``,
    ``token`` 8 random hex digits (:func:`secrets.token_hex`), so that two incarnations of one rank in one attempt
    (a learner restarted alone, in a new container with the same pid) never share it. The ``"<rank>:"`` prefix is
    what :meth:`~labswarm.train.distributed.cursor.GlobalCursor.claim_orphan`'s ``heir_of`` matches."""
    return f"{rank}:{attempt}:{os.getpid()}:{secrets.token_hex(4)}"


class ChunkRecord:
    """An open chunk record: one durable line a call (module docstring).

    Args:
        path: the record's file (created with its folder; appended to, never truncated).
        owner: this process's cursor owner (:func:`owner`), written in every line.
        fsync: ``os.fsync`` after each line (default :data:`FSYNC`).
    """

    def __init__(self, path: Path, owner: str, fsync: bool = FSYNC) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.owner, self.fsync = path, owner, fsync
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _write(self, line: Mapping[str, Any]) -> None:
        if self._fd is None:
            raise ValueError(f"{self.path}: the chunk record is closed")
        data = (json.dumps(line) + "\n").encode()
        written = os.write(self._fd, data)  # O_APPEND: one write(2) is one whole line at the file's end
        if written != len(data):  # a full disk mid-line: the rest of the line, so the file stays line-aligned
            os.write(self._fd, data[written:])
        if self.fsync:
            os.fsync(self._fd)

    def trained(self, pass_: int, chunk: int, ids: Sequence[str]) -> None:
        """Chunk ``chunk`` of pass ``pass_`` (its samples' ``ids``) was trained: call it BEFORE marking it done."""
        self._write({"pass": pass_, "chunk": chunk, "owner": self.owner, "ids": list(ids)})

    def lost(self, pass_: int, chunk: int) -> None:
        """The cursor refused the done mark (the lease was lost): the :meth:`trained` line before does not count."""
        self._write({"pass": pass_, "chunk": chunk, "owner": self.owner, "lost": True})

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> ChunkRecord:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every line of the chunk records at ``paths``, in file order (a missing file reads as empty; a torn last line,
    from a full disk, is skipped)."""
    lines: list[dict[str, Any]] = []
    for path in paths:
        if not path.is_file():
            continue
        for text in path.read_text(encoding="utf-8").splitlines():
            try:
                lines.append(json.loads(text))
            except json.JSONDecodeError:
                continue
    return lines


def counted(lines: Iterable[Mapping[str, Any]],
            done: Mapping[int, Sequence[str]] | None = None) -> list[Mapping[str, Any]]:
    """The trained lines that count: not followed by their owner's ``lost`` line and, given the cursor's chunk
    values by pass (``done``: :meth:`~labswarm.train.distributed.cursor.GlobalCursor.state_dict`'s ``passes``),
    only a line whose owner is the one the cursor marked the chunk done by (``D|<owner>``): this drops the work
    a restart from a checkpoint rolled back and a line written by a process killed before its done mark."""
    lines = list(lines)
    lost = {(line["pass"], line["chunk"], line["owner"]) for line in lines if line.get("lost")}
    out = []
    for line in lines:
        key = (line["pass"], line["chunk"], line.get("owner"))
        if line.get("lost") or key in lost:
            continue
        if done is not None:
            values = done.get(int(line["pass"]), ())
            if int(line["chunk"]) >= len(values) or values[int(line["chunk"])] != f"D|{line.get('owner')}":
                continue
        out.append(line)
    return out
