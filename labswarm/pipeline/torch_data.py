"""PyTorch datasets over labswarm's feature store and pipelines, for users who bring torch's own ``DataLoader``.

Two shapes, two uses:

- :class:`StoreDataset` (map-style): sample ``i`` of a split → ``(features, label)``, one feature output cropped
  or padded to a fixed number of frames. Any sampler, any ``batch_size``, ``shuffle=True``: the ``DataLoader``
  does the batching and collates in its workers (tensors cross to the trainer in shared memory).
- :class:`PipelineIterableDataset`: an experiment's :class:`~labswarm.pipeline.pipeline.Pipeline` (source,
  shuffle, features, batch: every block but prefetch) run in each ``DataLoader`` worker on its shard; it yields
  whole batches, so use ``DataLoader(ds, batch_size=None, num_workers=n)``. The order is the one labswarm's own
  :class:`~labswarm.pipeline.prefetch.Prefetcher` delivers with ``n`` producers.

Both read features from the store and compute and store the missing ones, as the pipeline's features block
does. This module imports torch at the top; :mod:`labswarm.pipeline` does not import it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from labswarm.config.experiment import ExperimentConfig
from labswarm.errors import ConfigError
from labswarm.pipeline.base import SKIPPED, Context, Split, chain
from labswarm.pipeline.blocks.batch import Batch, fit_frames
from labswarm.pipeline.blocks.features import Features, FeaturesConfig
from labswarm.pipeline.blocks.source import Source
from labswarm.pipeline.pipeline import Pipeline
from labswarm.sample import Sample

__all__ = ["PipelineIterableDataset", "StoreDataset"]


def _limit_worker_threads(threads: int | None, limited: list[int]) -> None:
    """In a ``DataLoader`` worker process, limit the maths libraries and torch to ``threads`` threads, once per
    process (``limited`` holds the pid it was done in). Two workers on two cores each with a full thread pool run
    slower than one plain loop (see the runbook)."""
    if threads is None or get_worker_info() is None or limited == [os.getpid()]:
        return
    from labswarm.threads import limit_threads

    limit_threads(threads)
    torch.set_num_threads(threads)
    limited[:] = [os.getpid()]


class StoreDataset(Dataset):
    """Map-style dataset of one split's samples (clips × transformations) and one feature output.

    Args:
        experiment: the experiment (dataset, transformations, features, store).
        split: ``train``, ``validation`` (held-out source recordings) or ``all``.
        output: the feature output name (``mel``, ``mfcc``, ...: a name in the experiment's ``features``).
        frames: frames of every item: longer features are cropped, shorter ones padded at the end with their
            minimum (as the batch block does); ``None`` returns the stored length (the default collate then
            needs every sample to have the same length, as fixed-length segments do).
        validation: share of each class's source recordings held out; default the experiment's
            ``training.validation`` (else 0).
        random_crop: crop at a random offset seeded by (training seed, :meth:`set_epoch`'s epoch, index), so
            the same epoch crops alike in any worker; otherwise a deterministic centred crop.
        threads: maths-library threads per ``DataLoader`` worker process (``None``: leave them as they are).

    Attributes:
        samples: the split's samples, in dataset order; item ``i`` is ``samples[i]``.
        labels: class index of each sample (position of its label in ``classes``).
        classes: the class labels, sorted.

    Raises:
        ConfigError: ``output`` is not one of the experiment's feature outputs.
        DatasetError: the labels CSV is unreadable.
    """

    def __init__(self, experiment: ExperimentConfig, split: Split = "train", output: str = "mel",
                 frames: int | None = None, validation: float | None = None, *, random_crop: bool = False,
                 threads: int | None = 1) -> None:
        known = [f.output_name for f in experiment.features]
        if output not in known:
            raise ConfigError(f"StoreDataset: unknown feature output {output!r}; the experiment has {known}")
        if frames is not None and frames < 1:
            raise ValueError(f"frames must be >= 1 or None, got {frames}")
        self.output = output
        self.frames = frames
        self.random_crop = random_crop
        self.threads = threads
        source = Pipeline(experiment, split=split, train=False, validation=validation, blocks=[Source()])
        self.classes = source.classes
        self._ctx: Context = source.context
        self._block = Features(FeaturesConfig(name="features", outputs=[output]))
        self.samples: list[Sample] = list(Source()(None, self._ctx))
        index = {label: i for i, label in enumerate(self.classes)}
        self.labels: list[int] = [index[s.label] for s in self.samples]
        self._limited: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch that seeds random crops (call before each epoch's ``DataLoader`` iteration)."""
        self._ctx = self._ctx.with_(epoch=epoch)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample ``i``'s features and label.

        Returns:
            ``(features, label)``: float32 tensor ``(n_bins, frames)`` (``frames`` as stored when ``None``; dB
            for the mel output), and a 0-d int64 tensor, the class index (a batch collates to int64 ``(B,)``).

        Raises:
            IndexError: ``i`` is out of range.
            SampleError: the sample's features cannot be computed (missing or corrupt audio, ...).
            StoreError: the store cannot be read or written.
        """
        if not -len(self.samples) <= i < len(self.samples):
            raise IndexError(f"index {i} out of range for {len(self.samples)} samples")
        i %= len(self.samples)
        _limit_worker_threads(self.threads, self._limited)
        item = next(self._block(iter([self.samples[i]]), self._ctx))  # store read, or compute + store
        array = item.features[self.output]
        if self.frames is not None:
            position = self._ctx.rng("store-crop", i).random() if self.random_crop else None
            array = fit_frames(array, self.frames, position)
        features = torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))
        return features, torch.tensor(item.label, dtype=torch.int64)


class PipelineIterableDataset(IterableDataset):
    """An experiment's pipeline as a torch ``IterableDataset`` that yields whole batches.

    Each ``DataLoader`` worker runs the pipeline's chain of blocks (without its prefetch block) as producer
    ``worker id`` of ``num_workers`` (:attr:`Context.producer` / :attr:`Context.producers`): the workers read
    disjoint shards of the split, every sample once per epoch, seeded as labswarm's producers are. Without
    workers (``num_workers=0``) the chain runs in the calling process as one producer.

    Use ``DataLoader(ds, batch_size=None, num_workers=n)``: the pipeline's batch block does the batching.

    Args:
        pipeline: the pipeline (its blocks, split, mode, rank and world).
        epoch: the epoch (shuffle order and random crops derive from it); change it with :meth:`set_epoch`.
        tensors: yield the batch's arrays as torch tensors (zero-copy views), so that they cross from the
            workers in shared memory; ``False`` yields the pipeline's numpy batches unchanged.
        threads: maths-library threads per ``DataLoader`` worker process (``None``: leave them as they are).

    Yields:
        :class:`~labswarm.pipeline.blocks.batch.Batch` objects: ``features`` per output name float32
        ``(B, n_bins, frames)``, ``labels`` int64 ``(B,)`` class indices, ``ids`` the sample ids; torch tensors
        with ``tensors``, numpy arrays otherwise.

    Raises (when iterated):
        SampleError, StoreError, DatasetError: as the pipeline's blocks raise them.
    """

    def __init__(self, pipeline: Pipeline, epoch: int = 0, *, tensors: bool = True, threads: int | None = 1) -> None:
        self.pipeline = pipeline
        self.epoch = epoch
        self.tensors = tensors
        self.threads = threads
        self._limited: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch of the next iteration (workers are started per iteration, so they see it)."""
        self.epoch = epoch

    def context(self) -> Context:
        """The context this process's chain runs in: the pipeline's, with the epoch and this worker's shard."""
        info = get_worker_info()
        producer, producers = (info.id, info.num_workers) if info is not None else (0, 1)
        return self.pipeline.context.with_(epoch=self.epoch, producer=producer, producers=producers)

    def __iter__(self) -> Iterator[Batch[torch.Tensor] | Batch[np.ndarray] | Any]:
        _limit_worker_threads(self.threads, self._limited)
        for batch in chain(self.pipeline.blocks, self.context()):
            if batch is SKIPPED:
                continue
            if self.tensors and isinstance(batch, Batch):
                yield Batch({name: torch.from_numpy(a) for name, a in batch.features.items()},
                            torch.from_numpy(batch.labels), batch.ids, batch.failed)
                continue
            yield batch
