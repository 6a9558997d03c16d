"""The source block: the experiment's dataset clips × transformations → samples of one split and shard."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

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
class Source(Block):
    """Yields the :class:`~labswarm.sample.Sample` objects of the context's split (whole source recordings
    held out for ``validation``, see :mod:`labswarm.pipeline.split`), in dataset order, keeping every
    ``ctx.shards``-th one from ``ctx.shard`` on: producers and learners each read a disjoint share.

    Raises (when iterated):
        DatasetError: the labels CSV is unreadable or malformed.
    """

    name = "source"
    config_model = SourceConfig

    def __call__(self, items: Iterator[Any] | None, ctx: Context) -> Iterator[Sample]:
        config = ctx.experiment
        held = frozenset()
        if ctx.split != "all":
            held = validation_sources(read_clips(config.dataset.root, config.dataset.labels_path),
                                      ctx.validation, config.seed)
        want_held = ctx.split == "validation"
        index = 0
        for sample in iter_samples(config):
            if ctx.split != "all" and (sample.source in held) != want_held:
                continue
            if self.config.limit is not None and index >= self.config.limit:
                break
            if index % ctx.shards == ctx.shard:
                yield sample
            index += 1
