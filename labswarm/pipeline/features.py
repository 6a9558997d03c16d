"""The features block: computes a sample's features into the feature store, or finds them there.

Built once per worker process from the experiment configuration (extractors, transformations, store); then
:meth:`FeaturesBlock.process` is called for each sample. It is idempotent: a sample whose every key is in the
store is a read-free no-op (``cached``), so at-least-once delivery gives exactly-once results.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import IO, Any, Literal

import numpy as np

from labswarm.audio.features.base import FeatureExtractor
from labswarm.audio.features.shared import Spectra
from labswarm.audio.io import load_segment
from labswarm.audio.transforms.base import Transformation
from labswarm.config.experiment import ExperimentConfig
from labswarm.errors import LabswarmError
from labswarm.sample import Sample
from labswarm.store.keys import IdentityCache, feature_key
from labswarm.store.listing import KeyListing
from labswarm.store.store import FeatureStore

Status = Literal["computed", "cached", "failed"]


@dataclass(slots=True)
class SampleResult:
    """The outcome of one sample.

    Attributes:
        sample_id: the sample's id.
        status: ``computed`` (features written now), ``cached`` (all already in the store) or ``failed``.
        reason: for ``failed``, the error in words (``"AudioError: x.wav: file not found"``).
        seconds: wall time spent on the sample.
        keys: store key per feature output name (empty when the keys could not be derived).
    """

    sample_id: str
    status: Status
    reason: str | None = None
    seconds: float = 0.0
    keys: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable mapping."""
        return {"sample_id": self.sample_id, "status": self.status, "reason": self.reason,
                "seconds": self.seconds, "keys": dict(self.keys)}


class FeaturesBlock:
    """Computes an experiment's features for one sample at a time.

    Args:
        config: the experiment; its ``features`` become extractors, built once here.
        store: the feature store; default: a store at ``config.store.root``.

    Raises:
        ConfigError: an extractor or transformation cannot be built.
        StoreError: the store cannot be opened.
    """

    def __init__(self, config: ExperimentConfig, store: FeatureStore | None = None) -> None:
        self.config = config
        self.store = store if store is not None else FeatureStore.open(
            config.store.root, remote=config.store.remote, cache_bytes=config.store.cache_bytes)
        self.extractors: list[FeatureExtractor] = [FeatureExtractor.from_spec(f) for f in config.features]
        self._transformations: dict[str, Transformation] = {}
        self._identity = IdentityCache()
        #: which keys the store holds: listings of a remote store's shards, not a request per key (store/listing.py)
        self.present = KeyListing(self.store)

    def transformation(self, spec: dict[str, Any]) -> Transformation:
        """The (cached) transformation for a sample's spec."""
        text = json.dumps(spec, sort_keys=True)
        found = self._transformations.get(text)
        if found is None:
            found = self._transformations[text] = Transformation.from_spec(spec)
        return found

    def warm_up(self, seconds: float = 1.0) -> None:
        """Run every transformation and extractor once on synthetic noise, so that library start-up costs
        (numba compilation or cache loading, FFT plans, filter banks) are paid here and not by the first
        samples. Call it before forking worker processes: they inherit the warm state. Errors are ignored (a
        noise file that is missing fails its samples later, with the reason)."""
        sr = self.config.dataset.sample_rate
        y = (0.1 * np.random.default_rng(0).standard_normal(int(seconds * sr))).astype(np.float32)
        for spec in self.config.transformations:
            try:
                out = self.transformation(spec.model_dump(mode="json"))(y, sr, 0)
                spectra = Spectra(out, sr)
                for ex in self.extractors:
                    ex(out, sr, spectra)
            except LabswarmError:
                continue

    def keys(self, sample: Sample) -> dict[str, str]:
        """Store key per feature output name for ``sample``.

        Raises:
            AudioError: the audio file is missing or unreadable.
            ConfigError: the sample names an unknown or invalid transformation.
        """
        transform = self.transformation(sample.transformation)
        identity = self._identity(sample.path)
        dataset = self.config.dataset
        common: dict[str, Any] = dict(
            sample_rate=dataset.sample_rate,
            start=sample.start,
            duration=sample.duration,
            pad=dataset.segment.pad,
            transformation=transform.key_spec(),
            transformation_version=transform.version,
            seed=sample.seed if transform.random else None,
        )
        return {
            ex.output_name: feature_key(identity, features=ex.spec(), features_version=ex.version, **common)
            for ex in self.extractors
        }

    def compute(self, sample: Sample, only: set[str] | None = None, data: IO[bytes] | None = None
                ) -> dict[str, np.ndarray]:
        """Load, transform and extract, without the store.

        Args:
            sample: the sample.
            only: output names to compute; ``None`` computes all.
            data: the bytes of ``sample.path``'s file, read instead of the file (an upload held in memory: see
                :func:`~labswarm.audio.io.load_segment`).

        Returns:
            float32 array ``(n_bins, n_frames)`` per output name.

        Raises:
            AudioError, TransformError, FeatureError: this sample cannot be computed.
        """
        sr = self.config.dataset.sample_rate
        y = load_segment(sample.path, sr, sample.start, sample.duration, pad=self.config.dataset.segment.pad,
                         data=data)
        y = self.transformation(sample.transformation)(y, sr, sample.seed)
        spectra = Spectra(y, sr)  # one STFT / mel projection shared by the extractors that agree on them
        return {
            ex.output_name: ex(y, sr, spectra) for ex in self.extractors if only is None or ex.output_name in only
        }

    def is_cached(self, sample: Sample, *, strict: bool = False) -> bool:
        """Whether every feature of ``sample`` is in the store (``False`` when its keys cannot be derived). On a
        remote store the answer comes from a listing (:attr:`present`): an array written since may read as
        missing, unless ``strict`` (then each key the listing lacks is asked of the store)."""
        try:
            return all(self.present.contains(k, strict=strict) for k in self.keys(sample).values())
        except LabswarmError:
            return False

    def process(self, sample: Sample) -> SampleResult:
        """Make sure ``sample``'s features are in the store; never raises for a per-sample problem.

        Returns:
            The :class:`SampleResult`: ``cached`` when all keys were present, ``computed`` when missing ones
            were computed and written (inside a :meth:`FeatureStore.batch` of a remote store: handed to its
            uploads, stored only once the batch has ended without an error), ``failed`` with the reason when the
            audio, the transformation, an extractor or the store failed.
        """
        started = time.perf_counter()
        keys: dict[str, str] = {}
        try:
            keys = self.keys(sample)
            missing = {name for name, key in keys.items() if not self.present.contains(key)}
            if not missing:
                return SampleResult(sample.id, "cached", None, time.perf_counter() - started, keys)
            for name, values in self.compute(sample, missing).items():  # in a batch: uploaded in the background
                self.store.put(keys[name], values, stored=self.present.added)
            status: Status = "computed"
            reason = None
        except LabswarmError as exc:
            status, reason = "failed", f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # an unexpected library failure fails this sample, not the run
            status, reason = "failed", f"{type(exc).__name__}: {exc}"
        return SampleResult(sample.id, status, reason, time.perf_counter() - started, keys)
