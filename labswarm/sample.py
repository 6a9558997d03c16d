"""A sample: one dataset clip under one transformation; one sample is one task message.

Samples are small and JSON-serializable (:meth:`Sample.to_dict`): no audio, no configuration. The seed every
random transformation draws from is derived from (experiment seed, clip id, transformation spec), so a
sample's output is the same on any worker and does not depend on the transformation's position in the list.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from labswarm.config import ExperimentConfig
from labswarm.datasets.folder import iter_clips


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


def iter_samples(config: ExperimentConfig) -> Iterator[Sample]:
    """Stream an experiment's samples: for each clip in CSV order, one sample per transformation.

    Raises:
        DatasetError: the labels CSV is unreadable or malformed.
    """
    specs = [t.model_dump(mode="json") for t in config.transformations]
    segment = config.dataset.segment
    for clip in iter_clips(config.dataset.root, config.dataset.labels_path):
        for index, spec in enumerate(specs):
            yield Sample(
                id=f"{clip.clip_id}#{index}",
                path=clip.path,
                label=clip.label,
                source=clip.source,
                start=segment.start,
                duration=segment.duration,
                transformation=spec,
                seed=sample_seed(config.seed, clip.clip_id, spec),
            )


def count_samples(config: ExperimentConfig) -> int:
    """Number of samples of an experiment (clips × transformations), without building them."""
    n_clips = sum(1 for _ in iter_clips(config.dataset.root, config.dataset.labels_path))
    return n_clips * len(config.transformations)
