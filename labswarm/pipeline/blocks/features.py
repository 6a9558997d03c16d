"""The features block of a training chain: a sample's features from the store, computed and stored if missing."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import numpy as np

from labswarm.errors import LabswarmError, SampleError
from labswarm.pipeline.base import Block, BlockConfig, Context, register_block
from labswarm.pipeline.features import FeaturesBlock
from labswarm.sample import Sample

log = logging.getLogger(__name__)


class FeaturesConfig(BlockConfig):
    """Parameters of the features block.

    Attributes:
        outputs: feature output names to read (``mel``, ``mfcc``, ...); ``None`` reads every one the experiment
            computes.
        compute_missing: compute (and store) features missing from the store; otherwise a missing feature fails
            its sample.
    """

    outputs: list[str] | None = None
    compute_missing: bool = True


class Item:
    """A sample with its features, read on first access (so a skipped batch costs no read).

    Attributes:
        sample: the sample.
        label: class index of the sample's label in ``ctx.classes``.
    """

    __slots__ = ("_block", "_features", "label", "sample")

    def __init__(self, sample: Sample, label: int, block: Features) -> None:
        self.sample = sample
        self.label = label
        self._block = block
        self._features: dict[str, np.ndarray] | None = None

    @property
    def features(self) -> dict[str, np.ndarray]:
        """float32 array ``(n_bins, n_frames)`` per output name.

        Raises:
            SampleError: a feature is missing and ``compute_missing`` is off, or computing it failed.
            StoreError: the store cannot be read.
        """
        if self._features is None:
            self._features = self._block.load(self.sample)
        return self._features

    def __getstate__(self) -> tuple[Sample, int, dict[str, np.ndarray] | None]:
        return self.sample, self.label, self.features

    def __setstate__(self, state: tuple[Sample, int, dict[str, np.ndarray] | None]) -> None:
        self.sample, self.label, self._features = state
        self._block = None  # type: ignore[assignment]


@register_block
class Features(Block[FeaturesConfig]):
    """Turns samples into :class:`Item` objects whose features come from the experiment's feature store; a
    feature that is missing is computed with the workers' code (:class:`~labswarm.pipeline.features.FeaturesBlock`)
    and written to the store, so the next epoch reads it."""

    name = "features"
    config_model = FeaturesConfig

    def __init__(self, config: FeaturesConfig | None = None) -> None:
        super().__init__(config)
        self._compute: FeaturesBlock | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config, "_compute": None}

    def __call__(self, items: Iterator[Any] | None, ctx: Context) -> Iterator[Item]:
        if items is None:
            raise ValueError("features needs a block before it (a source)")
        if self._compute is None or self._compute.config is not ctx.experiment:
            self._compute = FeaturesBlock(ctx.experiment)
        known = [ex.output_name for ex in self._compute.extractors]
        unknown = sorted(set(self.config.outputs or ()) - set(known))
        if unknown:
            raise LabswarmError(f"features block: unknown output(s) {unknown}; the experiment has {known}")
        index = {label: i for i, label in enumerate(ctx.classes)}
        for sample in items:
            yield Item(sample, index[sample.label], self)

    def load(self, sample: Sample) -> dict[str, np.ndarray]:
        """The sample's features: read from the store, the missing ones computed and stored.

        Raises:
            SampleError: as :attr:`Item.features`.
        """
        block = self._compute
        if block is None:
            raise LabswarmError("features block: load() called before the block ran")
        keys = block.keys(sample)
        wanted = self.config.outputs or list(keys)
        out: dict[str, np.ndarray] = {}
        missing = {name for name in wanted if not block.store.contains(keys[name])}
        if missing and not self.config.compute_missing:
            raise SampleError(f"{sample.id}: features {sorted(missing)} are not in the store")
        if missing:
            log.debug("computing %s for %s", sorted(missing), sample.id)
            for name, values in block.compute(sample, missing).items():
                block.store.put(keys[name], values)
                out[name] = values
        for name in wanted:
            if name not in out:
                out[name] = block.store.get(keys[name])
        return {name: out[name] for name in wanted}
