"""The shuffle block: a seeded buffer shuffle."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic import Field

from labswarm.pipeline.base import Block, BlockConfig, Context, register_block


class ShuffleConfig(BlockConfig):
    """Parameters of the shuffle block.

    Attributes:
        buffer: items held in the shuffle buffer; at least the items of one shard gives a full shuffle of it.
    """

    buffer: int = Field(10_000, ge=1)


@register_block
class Shuffle(Block[ShuffleConfig]):
    """Reservoir-style buffer shuffle (as in tf.data / webdataset): fill a buffer of ``buffer`` items, then
    each new item replaces a randomly chosen one, which is yielded; at the end the rest leave in random order.
    Seeded from (training seed, epoch, shard) via :meth:`Context.rng`: a new order every epoch, the same
    order for the same context. In evaluation mode (``ctx.train`` false) items pass through in order."""

    name = "shuffle"
    config_model = ShuffleConfig

    def __call__(self, items: Iterator[Any] | None, ctx: Context) -> Iterator[Any]:
        if items is None:
            raise ValueError("shuffle needs a block before it")
        if not ctx.train:
            yield from items
            return
        rng = ctx.rng("shuffle")
        buffer: list[Any] = []
        for item in items:
            if len(buffer) < self.config.buffer:
                buffer.append(item)
                continue
            j = int(rng.integers(len(buffer)))
            buffer[j], item = item, buffer[j]
            yield item
        order = rng.permutation(len(buffer))
        for j in order:
            yield buffer[j]
