"""The training inputs of the trainer's distributed mode: the single-process crops, with the features in memory.

A learner of a distributed run trains on the chunks the global cursor hands it, so a sample's input must not
depend on which learner trains it, nor on the chunk it falls in. :class:`TrainingSamples` is
:class:`~labswarm.pipeline.torch_data.StoreDataset` (``random_crop=True``: a random crop per sample, re-drawn
every epoch, positioned by (experiment seed, epoch, sample index)) over the training split: the crop of sample
``i`` in epoch ``e`` is ``StoreDataset(..., random_crop=True).set_epoch(e)[i]`` exactly, whichever learner takes
it (``tests/train/test_distributed_data.py``). Only where the features come from differs: each sample's
full-length features are read from the store (computed and stored if missing, as the features block does) once,
when the learner starts, and kept in memory; every step crops from there.

Memory: the full-length features of the training split once per learner. On the demo set
(``examples/music_speech_noise.yml``: 2,124 training samples, mel ``(128, 431)`` float32) that is 469 MB per
learner, the same as the distributed mode held before (whole clips, read in evaluation mode). Reading through the
store per chunk instead would hold nothing but costs 3-4.5 ms per sample per step (measured on the demo store,
2 shared cores at load ~7, noisy): ~100-140 ms per 32-sample step, in the step, without the single-process
pipeline's prefetching producers.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from labswarm.config.experiment import ExperimentConfig
from labswarm.errors import SampleError
from labswarm.pipeline.blocks.batch import fit_frames
from labswarm.pipeline.blocks.features import Features, FeaturesConfig
from labswarm.pipeline.pipeline import Pipeline
from labswarm.pipeline.prefetch import PipelineError
from labswarm.pipeline.torch_data import StoreDataset
from labswarm.sample import Sample

log = logging.getLogger(__name__)


class _KeptFeatures(Features):
    """The features block with each sample's features read once and kept (full length)."""

    def __init__(self, config: FeaturesConfig) -> None:
        super().__init__(config)
        self.kept: dict[str, dict[str, np.ndarray]] = {}

    def load(self, sample: Sample) -> dict[str, np.ndarray]:
        features = self.kept.get(sample.id)
        if features is None:
            features = self.kept[sample.id] = super().load(sample)
        return features


class TrainingSamples(StoreDataset):
    """The training split of the trainer's pipeline as random crops per epoch, its features kept in memory.

    Args:
        experiment: the experiment.
        train: the trainer's training pipeline: its validation share, its source block's ``limit``, its features
            block's settings (``compute_missing``) and its batch block's ``frames`` (``None``: whole clips,
            each chunk padded to its longest, as the batch block pads a batch) are used.
        output: the model's input (a feature output name).

    Attributes:
        positions: the split's indices (into ``samples``) whose features could be read, ascending: the cursor's
            sample ``j`` is split sample ``positions[j]``. Set by :meth:`load`.

    Raises:
        ConfigError: ``output`` is not one of the experiment's feature outputs.
        DatasetError: the labels CSV is unreadable.
    """

    def __init__(self, experiment: ExperimentConfig, train: Pipeline, output: str) -> None:
        blocks = {b.name: b for b in train.blocks}
        batch = blocks.get("batch")
        super().__init__(experiment, "train", output, batch.config.frames if batch is not None else None,
                         validation=train.context.validation, random_crop=True, threads=None)
        features = blocks.get("features")
        config = features.config if features is not None else FeaturesConfig(name="features")
        self._block: _KeptFeatures = _KeptFeatures(config.model_copy(update={"outputs": [output]}))
        source = blocks.get("source")
        limit = source.config.limit if source is not None else None
        if limit is not None:  # the source block's limit: the first samples of the split, in dataset order
            self.samples, self.labels = self.samples[:limit], self.labels[:limit]
        self.positions: list[int] = []

    def load(self) -> list[int]:
        """Read every sample's features once (computing the missing ones); a sample whose features fail
        (:class:`~labswarm.errors.SampleError`) is left out, with a warning.

        Returns:
            :attr:`positions`.

        Raises:
            PipelineError: no sample could be read.
            StoreError: the store cannot be read.
        """
        self.positions = []
        for i in range(len(self.samples)):
            try:
                self[i]
            except SampleError as exc:
                log.warning("leaving sample %s out of the training split: %s", self.samples[i].id, exc)
                continue
            self.positions.append(i)
        if not self.positions:
            raise PipelineError("the training split delivered no sample: see the log for the reasons")
        return self.positions

    @property
    def nbytes(self) -> int:
        """Bytes of the features kept in memory."""
        return sum(a.nbytes for f in self._block.kept.values() for a in f.values())

    def ids(self, indices: Sequence[int]) -> list[str]:
        """The sample ids of cursor indices ``indices``."""
        return [self.samples[self.positions[j]].id for j in indices]

    def batch(self, epoch: int, indices: Sequence[int]) -> tuple[Any, Any]:
        """The inputs of cursor indices ``indices`` in ``epoch``: each sample's ``StoreDataset`` item of that
        epoch (its random crop), stacked.

        Returns:
            ``(x, y)``: float32 tensor ``(len(indices), n_bins, frames)`` and int64 tensor ``(len(indices),)``.
        """
        import torch

        self.set_epoch(epoch)
        items = [self[self.positions[j]] for j in indices]
        xs = [x for x, _ in items]
        if self.frames is None:  # whole clips: padded to the chunk's longest, as the batch block pads
            longest = max(x.shape[-1] for x in xs)
            xs = [torch.from_numpy(fit_frames(x.numpy(), longest)) for x in xs]
        return torch.stack(xs), torch.stack([y for _, y in items])
