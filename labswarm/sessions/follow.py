"""A session that follows its catalog (``follow: true``): the rows appended to its labels CSV are published as
they appear, and the session ends only when cancelled.

The publisher (:class:`~labswarm.sessions.runner.SessionRunner`) of a followed session runs :func:`follow`
instead of its publish and reconcile phases: it reads the whole file (the rows there already), then looks at it
every :data:`POLL_SECONDS`:

* **what is new**: :class:`LabelsTail` keeps the byte offset of the end of the last complete line it read and the
  file's identity (device, inode); a poll whose ``stat`` shows the same identity, size and modification time reads
  nothing. A file grown in place is read from that offset on, whole lines only (a row being written is taken once
  its line ends). A file that shrank or was replaced (an editor that writes a new file, a row removed) is read
  again from its start.
* **never twice**: the samples of the rows read are looked up in the session's ledger (one query per
  :data:`~labswarm.sessions.ledger.CHUNK` ids, by primary key) and only those without a row are published, with
  the publish phase's pacing (token bucket, start window) and its rule of writing the ledger after the broker's
  confirms. A restarted manager starts a new tail at offset 0: the whole file is read once and what the ledger
  holds is skipped, so nothing is published twice and nothing appended while it was down is missed.
* **removed rows are ignored**: their samples keep their ledger rows and outcomes; nothing is withdrawn.
* **progress grows**: the session's ``total`` becomes the number of its ledger rows whenever that is larger.
* **lost messages**: as in reconciliation (:mod:`labswarm.sessions.reconcile`), samples without an outcome are
  looked up in the store or published again once the queue is empty and no outcome arrived for
  ``reconcile_after`` s; but the session never completes: it runs until cancelled (or paused meanwhile).

A row of an appended line that is not valid (empty path or label, not UTF-8, not CSV) or whose audio path lies
outside the manager's data roots is skipped with a warning in the manager's log naming its line: one bad row does
not end a session that runs for months. Rows are lines: a quoted field holding a line break is not supported in a
followed labels CSV.
"""

from __future__ import annotations

import csv
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from sqlalchemy import case, update

from labswarm.config.experiment import ExperimentConfig
from labswarm.datasets.folder import REQUIRED_COLUMNS, Clip, clip_path
from labswarm.errors import DatasetError, LabswarmError
from labswarm.paths import DataRoots, FileIdentity, PathCheck
from labswarm.pipeline.features import FeaturesBlock
from labswarm.sample import Sample, sample_seed
from labswarm.sessions import ledger
from labswarm.sessions.models import SessionRow
from labswarm.sessions.reconcile import Publisher, republish_missing

log = logging.getLogger(__name__)

#: Seconds between two looks at a followed labels CSV (one ``stat``; a read only when it changed).
POLL_SECONDS = 1.0
#: Rows read from the labels CSV per ledger lookup and publish call.
ROWS = 1_000


class LabelsTail:
    """Reads the rows appended to a labels CSV since the last read (``path,label[,source]`` with a header line).

    Args:
        root: the dataset's folder, that relative paths are resolved against.
        labels: the labels CSV.
        roots: the data roots a row's audio path must lie in (a row outside is skipped with a warning).
    """

    def __init__(self, root: Path, labels: Path, roots: DataRoots) -> None:
        self.root = root
        self.labels = labels
        self._inside = PathCheck(roots)
        self.offset = 0  # bytes of the file read: the end of the last complete line
        self.line = 0  # lines read (the header is line 1)
        self._columns: dict[str, int] | None = None
        self._identity: FileIdentity | None = None  # what a poll compares
        self._missing = False

    def _stat(self) -> FileIdentity | None:
        try:
            identity = FileIdentity.of(self.labels)
        except OSError as exc:
            if not self._missing:
                log.warning("followed labels CSV %s cannot be read (%s); waiting for it", self.labels,
                            exc.strerror or exc)
            self._missing = True
            return None
        self._missing = False
        return identity

    def changed(self) -> bool:
        """Whether the file may hold rows not read yet (one ``stat``): it is new, grew, shrank or was replaced.
        A file that shrank or was replaced is read again from its start by the next :meth:`rows`."""
        now = self._stat()
        if now is None or now == self._identity:
            return False
        before, self._identity = self._identity, now
        if before is None or (now.device, now.inode) != (before.device, before.inode) or now.size < self.offset:
            self.offset, self.line, self._columns = 0, 0, None
        return True

    def rows(self) -> Iterator[list[Clip]]:
        """The clips of the complete lines after :attr:`offset`, in chunks of at most :data:`ROWS`; the offset
        moves past each chunk as it is handed out.

        Raises:
            DatasetError: the file cannot be read, or its header lacks a required column (nothing read then).
        """
        try:
            handle = self.labels.open("rb")
        except OSError as exc:
            raise DatasetError(f"cannot read labels CSV {self.labels}: {exc.strerror or exc}") from exc
        with handle:
            handle.seek(self.offset)
            chunk: list[Clip] = []
            offset = self.offset
            for raw in handle:
                if not raw.endswith(b"\n"):
                    break  # a line being written: taken once it ends
                offset += len(raw)
                self.line += 1
                clip = self._row(raw)
                if clip is not None:
                    chunk.append(clip)
                if len(chunk) >= ROWS:
                    self.offset = offset
                    yield chunk
                    chunk = []
            self.offset = offset
            if chunk:
                yield chunk

    def _row(self, raw: bytes) -> Clip | None:
        """The clip of one line (``None``: the header, a blank line or a row skipped with a warning)."""
        try:
            fields = next(csv.reader([raw.decode("utf-8")]), [])
        except (UnicodeDecodeError, csv.Error):
            log.warning("%s, line %d: not a UTF-8 CSV row; skipped", self.labels, self.line)
            return None
        if self._columns is None:
            columns = {name.strip(): i for i, name in enumerate(fields)}
            if missing := [c for c in REQUIRED_COLUMNS if c not in columns]:
                self.offset, self.line = 0, 0
                raise DatasetError(f"{self.labels}: the header (line 1) is missing column(s) {', '.join(missing)}")
            self._columns = columns
            return None
        if not any(f.strip() for f in fields):
            return None
        path, label, source = (fields[i].strip() if (i := self._columns.get(name)) is not None and i < len(fields)
                               else "" for name in ("path", "label", "source"))
        if not path or not label:
            log.warning("%s, line %d: empty path or label; skipped", self.labels, self.line)
            return None
        full = clip_path(self.root, path)
        if not self._inside(full):
            log.warning("%s, line %d (column path): outside the allowed data roots; skipped", self.labels, self.line)
            return None
        return Clip(clip_id=path, path=full, label=label, source=source or path)


def samples_of(config: ExperimentConfig, clips: list[Clip]) -> list[Sample]:
    """The samples of ``clips`` (each under every transformation, in order), as
    :func:`~labswarm.sample.iter_samples` makes them."""
    segment = config.dataset.segment
    specs = [t.model_dump(mode="json") for t in config.transformations]
    return [Sample(id=f"{clip.clip_id}#{index}", path=clip.path, label=clip.label, source=clip.source,
                   start=segment.start, duration=segment.duration, transformation=spec,
                   seed=sample_seed(config.seed, clip.clip_id, spec))
            for clip in clips for index, spec in enumerate(specs)]


class Follower(Publisher, Protocol):
    """What :func:`follow` needs of a session's publisher: reconciliation's, and publishing new samples."""

    def publish_more(self, block: FeaturesBlock, samples: list[Sample]) -> None:
        """Publish ``samples`` as the publish phase does (paced; ledger rows after the confirms)."""
        ...


def follow(runner: Follower, block: FeaturesBlock, roots: DataRoots) -> None:
    """Follow the session's labels CSV until the runner is stopped (see the module's description).

    Args:
        runner: the session's publisher (the thread calling this).
        block: the experiment's features block.
        roots: the manager's data roots (rows outside are skipped).
    """
    dataset = runner.config.dataset
    tail = LabelsTail(Path(dataset.root), dataset.labels_path, roots)
    settings = runner.context.settings
    runner.last_progress = time.monotonic()
    while not runner.stop_event.is_set():
        if not runner.wait_running():
            return
        if tail.changed():
            try:
                for clips in tail.rows():
                    _publish_new(runner, block, samples_of(runner.config, clips))
                    if runner.stop_event.is_set():
                        return
            except LabswarmError as exc:  # the file is being rewritten, say: read again at its next change
                log.warning("session %s: following %s: %s", runner.session_id, dataset.labels_path, exc)
        idle = time.monotonic() - runner.last_progress > max(settings.reconcile_after, 4 * runner.max_task_seconds)
        if idle:
            with runner.context.db() as db:
                waiting = ledger.has_pending(db, runner.session_id)
            if waiting and runner.context.broker.queue_depth(runner.experiment) == 0:
                republish_missing(runner, block)
            runner.last_progress = time.monotonic()
        runner.stop_event.wait(POLL_SECONDS)


def _publish_new(runner: Follower, block: FeaturesBlock, samples: list[Sample]) -> None:
    """Publish those of ``samples`` the session's ledger does not hold; its total grows to its ledger's size."""
    with runner.context.db() as db:
        known = ledger.known_among(db, runner.session_id, (s.id for s in samples))
    new = [s for s in samples if s.id not in known]
    if not new:
        return
    log.info("session %s: %d new samples in the followed labels CSV", runner.session_id, len(new))
    runner.publish_more(block, new)
    rows = SessionRow.pending + SessionRow.done + SessionRow.cached + SessionRow.failed
    with runner.context.db() as db:
        db.execute(update(SessionRow).where(SessionRow.id == runner.session_id)
                   .values(total=case((rows > SessionRow.total, rows), else_=SessionRow.total)))
        db.commit()
