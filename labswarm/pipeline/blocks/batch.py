"""The batch block: items → fixed-shape batches (frames padded or cropped), labels as class indices."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field

from labswarm.errors import SampleError
from labswarm.pipeline.base import SKIPPED, Batch, Block, BlockConfig, Context, register_block

log = logging.getLogger(__name__)


class BatchConfig(BlockConfig):
    """Parameters of the batch block.

    Attributes:
        size: samples per batch.
        frames: frames (last axis) of every feature array in a batch: longer ones are cropped, shorter ones
            padded with their own minimum (silence, for dB-scaled features); ``None`` pads to the longest in
            the batch.
        eval_frames: the same in evaluation mode; ``same`` (default) uses ``frames``, ``None`` keeps whole
            clips (padded to the longest in the batch), e.g. to train on random crops and validate on whole
            clips with a model that pools over time.
        drop_last: drop a last batch smaller than ``size``.
    """

    size: int = Field(32, ge=1)
    frames: int | None = Field(None, ge=1)
    eval_frames: Annotated[int, Field(ge=1)] | Literal["same"] | None = "same"
    drop_last: bool = False


@register_block
class Batcher(Block[BatchConfig]):
    """Groups consecutive items into :class:`Batch` objects. Crops are random in training mode (one position per
    sample, shared by its features, drawn from :meth:`Context.rng` of the batch's index, so a respawned producer
    crops alike) and centred in evaluation mode. The first ``ctx.skip`` batches are yielded as
    :data:`~labswarm.pipeline.base.SKIPPED` without reading their items' features. An item whose features fail
    with a :class:`~labswarm.errors.SampleError` (missing or corrupt audio, a failing transformation or
    extractor) is dropped from its batch and reported in :attr:`Batch.failed`; a batch whose every item failed is
    yielded empty. Other errors (the store unreadable, say) end the epoch: they are not the sample's fault."""

    name = "batch"
    config_model = BatchConfig

    def __call__(self, items: Iterator[Any] | None, ctx: Context) -> Iterator[Batch[np.ndarray] | Any]:
        if items is None:
            raise ValueError("batch needs a block before it (features)")
        size = self.config.size
        group: list[Any] = []
        index = 0
        for item in items:
            group.append(item)
            if len(group) == size:
                yield SKIPPED if index < ctx.skip else self.collate(group, ctx, index)
                group, index = [], index + 1
        if group and not self.config.drop_last:
            yield SKIPPED if index < ctx.skip else self.collate(group, ctx, index)

    def collate(self, items: list[Any], ctx: Context, index: int) -> Batch[np.ndarray]:
        """One batch from ``items`` (:class:`~labswarm.pipeline.blocks.features.Item` objects); ``index`` is the
        batch's position in this chain's epoch (seeds its random crops)."""
        arrays: list[dict[str, np.ndarray]] = []
        kept: list[Any] = []
        failed: list[tuple[str, str]] = []
        for item in items:
            try:
                arrays.append(item.features)
                kept.append(item)
            except SampleError as exc:  # this sample only; a store or dataset failure stops the epoch
                log.warning("dropping sample %s from its batch: %s", item.sample.id, exc)
                failed.append((item.sample.id, f"{type(exc).__name__}: {exc}"))
        names = list(arrays[0]) if arrays else []
        positions = ctx.rng("crop", index).random(len(arrays)) if ctx.train else [None] * len(arrays)
        wanted = self.config.frames
        if not ctx.train and self.config.eval_frames != "same":
            wanted = self.config.eval_frames
        out: dict[str, np.ndarray] = {}
        for name in names:
            frames = wanted or max(a[name].shape[-1] for a in arrays)
            out[name] = np.stack([fit_frames(a[name], frames, p) for a, p in zip(arrays, positions, strict=True)])
            out[name] = out[name].astype(np.float32, copy=False)
        labels = np.array([item.label for item in kept], dtype=np.int64)
        return Batch(out, labels, [item.sample.id for item in kept], failed)


def fit_frames(array: np.ndarray, frames: int, position: float | None = None) -> np.ndarray:
    """Crop or pad a feature array along its last axis (frames) to a fixed length.

    Args:
        array: features ``(n_bins, n)`` (any leading axes).
        frames: the length wanted, in frames.
        position: where to crop, as a fraction in [0, 1) of the possible offsets (``int(position * (n - frames
            + 1))``): the same position crops the same window of features that share a frame rate;
            ``None`` crops the centre (``(n - frames) // 2``).

    Returns:
        ``(n_bins, frames)``, same dtype: ``array`` itself when it has ``frames`` frames, a view when cropped,
        a copy padded at the end with the array's minimum (silence, for dB-scaled features) when shorter.
    """
    n = array.shape[-1]
    if n > frames:
        start = (n - frames) // 2 if position is None else min(int(position * (n - frames + 1)), n - frames)
        return array[..., start:start + frames]
    if n < frames:
        fill = float(array.min()) if array.size else 0.0
        pad = [(0, 0)] * (array.ndim - 1) + [(0, frames - n)]
        return np.pad(array, pad, constant_values=fill)
    return array
