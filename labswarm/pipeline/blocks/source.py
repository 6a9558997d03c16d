"""The source block: the experiment's dataset clips × transformations → samples of one split and shard."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
from pydantic import Field

from labswarm.datasets.folder import read_clips
from labswarm.pipeline.base import Block, BlockConfig, Context, register_block
from labswarm.pipeline.split import validation_sources
from labswarm.sample import Sample, iter_samples


class SourceConfig(BlockConfig):
    """Parameters of the source block.

    Attributes:
        limit: yield at most this many samples of the split (before sharding), e.g. for a quick try.
    """

    limit: int | None = Field(None, ge=1)


@register_block
class Source(Block[SourceConfig]):
    """Yields the :class:`~labswarm.sample.Sample` objects of the context's split (whole source recordings
    held out for ``validation``, see :mod:`labswarm.pipeline.split`) in dataset order, the ones of this chain's
    shard only, so that producers and learners each read a disjoint share (together: the whole split).

    In training mode the shards are drawn anew every epoch: sample ``i`` of the split goes to shard
    ``perm[i] mod shards``, ``perm`` a permutation seeded by (training seed, epoch) alone, so shards stay
    disjoint and their sizes differ by at most one (dataset order groups a clip's transformations and often the
    classes: a fixed ``index mod shards`` gave every producer, hence every batch, the same transformations or a
    single class, epoch after epoch). In evaluation mode every ``ctx.shards``-th sample from ``ctx.shard`` on.

    Raises (when iterated):
        DatasetError: the labels CSV is unreadable or malformed.
    """

    name = "source"
    config_model = SourceConfig

    def __call__(self, items: Iterator[Any] | None, ctx: Context) -> Iterator[Sample]:
        config = ctx.experiment
        clips = read_clips(config.dataset.root, config.dataset.labels_path)
        held = validation_sources(clips, ctx.validation, config.seed) if ctx.split != "all" else frozenset()
        want_held = ctx.split == "validation"

        def wanted(source: str) -> bool:
            return ctx.split == "all" or (source in held) == want_held

        limit = self.config.limit
        if ctx.train:  # the split's size from the clips (each yields one sample per transformation)
            count = sum(wanted(c.source) for c in clips) * len(config.transformations)
            count = count if limit is None else min(count, limit)
            text = json.dumps([config.training_seed, ctx.epoch, "source"]).encode()
            seed = int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big")
            shards = np.random.default_rng(seed).permutation(count) % ctx.shards
        for index, sample in enumerate(s for s in iter_samples(config) if wanted(s.source)):
            if limit is not None and index >= limit:
                return
            shard = int(shards[index]) if ctx.train else index % ctx.shards
            if shard == ctx.shard:
                yield sample
