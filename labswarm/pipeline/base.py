"""Pipeline blocks: the base class, the registry, and the context a chain of blocks runs in.

A block is a filter in a pipe-filter chain: :meth:`Block.__call__` takes the iterator of the block before it
and returns a generator over its own items. Blocks are configured by a pydantic model (``{name: shuffle,
buffer: 1000}`` in the experiment's ``pipeline`` list), so a chain round-trips to YAML (:meth:`Block.spec`)
and pickles (a producer process receives the blocks it runs). Everything a block needs beyond its parameters
(the experiment, the split, the epoch, which producer it runs in) comes from the :class:`Context`; randomness
comes only from seeds derived from it (:meth:`Context.rng`), so a chain's output is a function of the context.
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, TypeVar, cast

import numpy as np

from labswarm.plugin import PluginConfig, build_plugin
from labswarm.registry import BLOCKS

if TYPE_CHECKING:
    from labswarm.config.experiment import ExperimentConfig

Split = Literal["train", "validation", "all"]


#: The array type of a batch: numpy arrays (what the blocks make), or torch tensors
#: (:class:`labswarm.pipeline.torch_data.PipelineDataset` with ``tensors=True``).
A = TypeVar("A")


@dataclass
class Batch(Generic[A]):
    """A batch of samples, generic over its array type (``Batch[np.ndarray]``, ``Batch[torch.Tensor]``).

    Attributes:
        features: per output name, float32 array ``(batch, n_bins, frames)``.
        labels: int64 array ``(batch,)`` of class indices (positions in the context's ``classes``).
        ids: the sample ids, in batch order.
        failed: ``(sample id, reason)`` of the samples dropped from this batch because their features failed.
    """

    features: dict[str, A]
    labels: A
    ids: list[str]
    failed: list[tuple[str, str]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)


class BlockConfig(PluginConfig):
    """Base config of a block; subclasses add its parameters."""


@dataclass(frozen=True)
class Context:
    """Where and for what a chain of blocks runs.

    Attributes:
        experiment: the experiment (dataset, transformations, features, store).
        classes: the class labels, sorted; a label's class index is its position here.
        split: which samples the source yields: ``train``, ``validation`` (held-out source recordings) or ``all``.
        validation: share of each class's source recordings held out for validation, in [0, 1).
        train: training mode (shuffle, random crops) or evaluation mode (dataset order, centred crops).
        epoch: the epoch, from 0; part of every seed.
        producer: index of the producer process running this chain, in ``[0, producers)``.
        producers: producer processes sharing the epoch (1 for an in-process chain).
        rank: this learner's rank in data-parallel training, in ``[0, world)``.
        world: number of learners.
        skip: batches this chain yields as :data:`SKIPPED` at the start of the epoch (resuming mid-epoch or
            respawning a producer), without reading their features.
    """

    experiment: ExperimentConfig
    classes: tuple[str, ...]
    split: Split = "all"
    validation: float = 0.0
    train: bool = True
    epoch: int = 0
    producer: int = 0
    producers: int = 1
    rank: int = 0
    world: int = 1
    skip: int = 0

    @property
    def shard(self) -> int:
        """This chain's shard of the samples: ``rank * producers + producer``."""
        return self.rank * self.producers + self.producer

    @property
    def shards(self) -> int:
        """Number of shards: ``world * producers``."""
        return self.world * self.producers

    def with_(self, **changes: Any) -> Context:
        """A copy with ``changes``."""
        return replace(self, **changes)

    def seed(self, *parts: Any) -> int:
        """A 63-bit seed from the training seed (:attr:`ExperimentConfig.training_seed`: ``training.seed``, else
        the experiment seed), the epoch, the shard and ``parts`` (BLAKE2b); independent of anything else, so a
        respawned producer draws the same numbers."""
        text = json.dumps([self.experiment.training_seed, self.epoch, self.rank, self.world, self.producer,
                           self.producers, *parts], default=str)
        return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") >> 1

    def rng(self, *parts: Any) -> np.random.Generator:
        """A numpy generator seeded by :meth:`seed`."""
        return np.random.default_rng(self.seed(*parts))


class _Skipped:
    """Marker of a batch the chain skipped (see :attr:`Context.skip`)."""

    def __repr__(self) -> str:
        return "SKIPPED"

    def __reduce__(self) -> str:
        return "SKIPPED"


#: What a chain yields in place of a batch it skips at the start of an epoch.
SKIPPED = _Skipped()


#: The config model of a block (``Block[BatchConfig]``: its ``config`` is a ``BatchConfig``).
C = TypeVar("C", bound=BlockConfig)


class Block(ABC, Generic[C]):
    """Base of every pipeline block, generic over its config model (``class Batching(Block[BatchConfig])``).

    Class attributes:
        name: the registry name used in YAML.
        config_model: the pydantic model of the parameters (the class ``C`` stands for).
    """

    name: ClassVar[str]
    config_model: ClassVar[type[BlockConfig]] = BlockConfig

    def __init__(self, config: C | None = None) -> None:
        # config_model is C by convention (a ClassVar cannot name a type variable), so the default is a C
        self.config: C = config if config is not None else cast(C, self.config_model(name=self.name))

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | PluginConfig) -> Block[Any]:
        """Build the registered block a spec (``{name: ..., **params}`` or a config) names.

        Raises:
            ConfigError: unknown name (the message lists the known ones) or invalid parameters.
        """
        return build_plugin(BLOCKS, spec)

    def spec(self) -> dict[str, Any]:
        """The JSON-serializable spec ``{name, **params}``; ``Block.from_spec(b.spec())`` rebuilds ``b``."""
        return self.config.model_dump(mode="json")

    @abstractmethod
    def __call__(self, items: Iterator[Any] | None, ctx: Context) -> Iterator[Any]:
        """A generator over this block's items.

        Args:
            items: the previous block's items (``None`` for a source).
            ctx: the context of this run of the chain.
        """

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.spec().items() if k != "name")
        return f"{type(self).__name__}({params})"


register_block = BLOCKS.decorator()


def chain(blocks: Sequence[Block[Any]], ctx: Context) -> Iterator[Any]:
    """Connect ``blocks`` in order (each a generator over the one before) and return the last one's output."""
    items: Iterator[Any] | None = None
    for block in blocks:
        items = block(items, ctx)
    if items is None:
        raise ValueError("an empty chain of blocks")
    return items
