"""An experiment's training-data pipeline: its blocks bound to one split, iterated epoch by epoch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from labswarm.config.experiment import ExperimentConfig
from labswarm.datasets.folder import read_clips
from labswarm.pipeline.base import Block, Context, Split
from labswarm.pipeline.prefetch import Prefetch, PrefetchConfig, Prefetcher


class Pipeline:
    """The chain of blocks of an experiment (its ``pipeline`` section), for one split.

    Args:
        experiment: the experiment (dataset, transformations, features, store, pipeline).
        split: ``train``, ``validation`` or ``all`` samples.
        train: training mode (shuffle, random crops); default: ``split == "train"``.
        validation: share of sources held out; default the experiment's ``training.validation`` (else 0).
        blocks: block specs to use instead of the experiment's.
        rank: this learner's rank; world: the number of learners (each reads a disjoint shard).

    Raises:
        ConfigError: a block spec is invalid.
        DatasetError: the labels CSV is unreadable.
    """

    def __init__(self, experiment: ExperimentConfig, *, split: Split = "train", train: bool | None = None,
                 validation: float | None = None, blocks: Sequence[Any] | None = None, rank: int = 0,
                 world: int = 1) -> None:
        specs = list(blocks) if blocks is not None else list(experiment.pipeline)
        built = [b if isinstance(b, Block) else Block.from_spec(b) for b in specs]
        if built and isinstance(built[-1], Prefetch):
            self.prefetch: PrefetchConfig = built[-1].config
            built = built[:-1]
        else:
            self.prefetch = PrefetchConfig(name="prefetch", producers=0)
        self.blocks: list[Block[Any]] = built
        if validation is None:
            validation = experiment.training.validation if experiment.training is not None else 0.0
        clips = read_clips(experiment.dataset.root, experiment.dataset.labels_path)
        self.classes: tuple[str, ...] = tuple(sorted({c.label for c in clips}))
        self._current: Prefetcher | None = None
        self._resume: dict[str, Any] | None = None
        self.context = Context(experiment=experiment, classes=self.classes, split=split,
                               validation=validation, train=split == "train" if train is None else train,
                               rank=rank, world=world)

    def specs(self) -> list[dict[str, Any]]:
        """The blocks as YAML-ready specs (the prefetch block last): ``Pipeline(..., blocks=p.specs())`` is ``p``."""
        return [b.spec() for b in self.blocks] + [self.prefetch.model_dump(mode="json")]

    def epoch(self, epoch: int, state: dict[str, Any] | None = None) -> Prefetcher:
        """An iterator over the batches of ``epoch`` (from 0), prefetched as configured.

        Args:
            epoch: the epoch; the shuffle order and random crops derive from it.
            state: a :meth:`Prefetcher.state_dict` of this epoch, to resume it where it stopped.

        Returns:
            A :class:`Prefetcher` (use as a context manager, or call ``close()``, to stop its producers early).
        """
        if state is None and self._resume is not None and self._resume["epoch"] == epoch:
            state = self._resume["prefetch"]
        self._resume = None
        self._current = Prefetcher(self.blocks, self.context.with_(epoch=epoch), self.prefetch, state)
        return self._current

    def state_dict(self) -> dict[str, Any]:
        """Where the epoch last started by :meth:`epoch` stands: ``{epoch, prefetch}`` (``prefetch`` is the
        :meth:`Prefetcher.state_dict`, ``None`` before any epoch); JSON-serializable, for a checkpoint."""
        if self._current is None:
            return {"epoch": 0, "prefetch": None}
        return {"epoch": self._current.ctx.epoch, "prefetch": self._current.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from a :meth:`state_dict`: the next ``epoch(state["epoch"])`` continues where that epoch
        stopped (batches already delivered are skipped without reading their features)."""
        self._resume = dict(state) if state.get("prefetch") is not None else None
