"""A sample: one dataset clip under one transformation; one sample is one task message.

Samples are small and JSON-serializable (:meth:`Sample.to_dict`): no audio, no configuration. The seed every
random transformation draws from is derived from (experiment seed, clip id, transformation spec), so a
sample's output is the same on any worker and does not depend on the transformation's position in the list.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from labswarm.config.experiment import ExperimentConfig
from labswarm.datasets.folder import Clip, clip_path, iter_clips, label_rows
from labswarm.errors import LabswarmError
from labswarm.paths import FileIdentity


@dataclass(frozen=True, slots=True)
class Sample:
    """One clip × one transformation.

    Attributes:
        id: ``"<clip_id>#<transformation index>"``, unique within an experiment.
        path: absolute path of the audio file.
        label: class label of the clip.
        source: id of the underlying recording (for splits by source).
        start: segment start in seconds.
        duration: segment length in seconds, or ``None`` for the whole file.
        transformation: the transformation spec ``{name, **params}``.
        seed: 63-bit seed of the transformation's randomness.
    """

    id: str
    path: str
    label: str
    source: str
    start: float
    duration: float | None
    transformation: dict[str, Any]
    seed: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable mapping; :meth:`from_dict` reverses it."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Sample:
        """Rebuild a sample from :meth:`to_dict`'s output.

        Raises:
            TypeError: missing or unknown fields.
        """
        return cls(**data)


def sample_seed(experiment_seed: int, clip_id: str, transformation: Mapping[str, Any]) -> int:
    """A 63-bit seed from the experiment seed, the clip and the transformation spec (BLAKE2b)."""
    text = json.dumps([experiment_seed, clip_id, dict(transformation)], sort_keys=True)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") >> 1


def _sample(config: ExperimentConfig, clip: Clip, index: int, spec: dict[str, Any]) -> Sample:
    segment = config.dataset.segment
    return Sample(id=f"{clip.clip_id}#{index}", path=clip.path, label=clip.label, source=clip.source,
                  start=segment.start, duration=segment.duration, transformation=spec,
                  seed=sample_seed(config.seed, clip.clip_id, spec))


def iter_samples(config: ExperimentConfig) -> Iterator[Sample]:
    """Stream an experiment's samples: for each clip in CSV order, one sample per transformation.

    Raises:
        DatasetError: the labels CSV is unreadable or malformed.
    """
    specs = [t.model_dump(mode="json") for t in config.transformations]
    for clip in iter_clips(config.dataset.root, config.dataset.labels_path):
        for index, spec in enumerate(specs):
            yield _sample(config, clip, index, spec)


#: The fields of a sample, as :meth:`Sample.to_dict` names them.
_FIELDS = tuple(f.name for f in fields(Sample))


class ExperimentSamples:
    """The samples of one experiment, looked up by id: what a worker computes a message's sample from, so that a
    message can only name a clip of the experiment's dataset under one of its transformations (by index), never
    a free path or a free transformation spec.

    The labels CSV is read at the first lookup (each clip's label and source, ~220 bytes per clip: 200,000 clips
    in ~1.5 s and ~44 MB, measured on a shared 2-core machine), and again when an id is not found and the CSV
    changed since (its inode, size or modification time: a followed session publishes a row appended a moment
    ago) or the last read is older than ``reread_after`` s (a file system whose times are coarse).

    Args:
        config: the experiment.
        reread_after: seconds before an unknown clip id may make the CSV be read again.
    """

    def __init__(self, config: ExperimentConfig, reread_after: float = 5.0) -> None:
        self.config = config
        self.reread_after = reread_after
        self._specs = [t.model_dump(mode="json") for t in config.transformations]
        self._rows: dict[str, tuple[str, str | None]] | None = None  # clip id: label, source (None: the id)
        self._read_at = 0.0
        self._read_signature: FileIdentity | None = None  # the CSV's signature when it was read

    def _signature(self) -> FileIdentity | None:
        """The labels CSV's identity (device, inode, size, mtime); ``None`` when it cannot be read."""
        try:
            return FileIdentity.of(self.config.dataset.labels_path)
        except OSError:
            return None

    def _clip(self, clip_id: str) -> Clip | None:
        if self._rows is None or (clip_id not in self._rows and (
                time.monotonic() - self._read_at > self.reread_after or self._signature() != self._read_signature)):
            signature = self._signature()
            self._rows = {path: (sys.intern(label), None if source == path else source)
                          for _, path, label, source in label_rows(self.config.dataset.labels_path)}
            self._read_at, self._read_signature = time.monotonic(), signature
        if (row := self._rows.get(clip_id)) is None:
            return None
        return Clip(clip_id=clip_id, path=clip_path(self.config.dataset.root, clip_id), label=row[0],
                    source=clip_id if row[1] is None else row[1])

    def verified(self, data: Mapping[str, Any]) -> Sample:
        """The experiment's own sample that a message's sample mapping names, when the message describes it
        exactly (:meth:`Sample.to_dict`).

        Raises:
            ForeignSample: the id names no clip of the dataset or no transformation index of the experiment, or
                a field of the mapping (path, transformation, seed, ...) differs from the experiment's sample.
                The reason names the fields that differ, never their values (the id's clip path aside).
            DatasetError: the labels CSV cannot be read.
        """
        sample_id = data.get("id")
        clip_id, _, index = sample_id.rpartition("#") if isinstance(sample_id, str) else ("", "", "")
        if not (index.isascii() and index.isdigit()) or str(int(index)) != index or int(index) >= len(self._specs):
            raise ForeignSample(f"the id does not end in '#<index>' of one of the experiment's "
                                f"{len(self._specs)} transformations")
        clip = self._clip(clip_id)
        if clip is None:
            raise ForeignSample(f"no clip of the experiment's dataset has the path {clip_id[:200]!r}")
        sample = _sample(self.config, clip, int(index), self._specs[int(index)])
        expected = {name: getattr(sample, name) for name in _FIELDS}  # to_dict without its deep copy
        differ = sorted(k for k in expected.keys() | data.keys() if k not in data or data[k] != expected.get(k, ...))
        if differ:
            raise ForeignSample(f"its {', '.join(map(str, differ))} differ(s) from the experiment's sample "
                                f"{sample.id!r}")
        return sample


class ForeignSample(LabswarmError):
    """A task message's sample is not a sample of the experiment the worker computes: not computed."""


def count_samples(config: ExperimentConfig) -> int:
    """Number of samples of an experiment (clips × transformations), without building them."""
    n_clips = sum(1 for _ in iter_clips(config.dataset.root, config.dataset.labels_path))
    return n_clips * len(config.transformations)
